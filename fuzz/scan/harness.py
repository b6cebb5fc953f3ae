"""From a finding to a check: a ``streamfuzz.checked()`` harness for one function.

The harness loads the function's own file at run time (``streamfuzz.standins``:
compiled unchanged, the package's other files it imports loaded from their
real files, unimportable imports stood in) and calls the function as the
package does: its arguments are what its callers pass
(``streamfuzz.fuzz.scan.harness_args``), a method's object carries the
attributes its class sets, and a caller's stream context is entered. The
engine calls such functions once a step, so the harness makes two calls in a
row inside one ``checked()`` block; after each, the current stream reads what
it returned where the package's callers use it, and the references are
dropped, as a caller drops them; a finding about a previous call's work, or about a free, is then
seen. It imports only public names (``streamfuzz``, ``streamfuzz.standins``).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from streamfuzz.fuzz import env
from streamfuzz.fuzz.scan import harness_args, harness_reads, harness_state, hazards
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import Trace
from streamfuzz.fuzz.scan.package import Function, Package
from streamfuzz.fuzz.scan.sources import ScanInputError, Source, SourceFile
from streamfuzz.fuzz.scan.standins import source_file

if TYPE_CHECKING:
    from streamfuzz._record import Record

_INTERLEAVING = {
    hazards.Hazard.LIFETIME: (
        "The tensor's block goes back to the caching allocator when its last "
        "reference dies, on the host, while the other stream's read or write of "
        "it may still be queued; the next allocation on the allocating stream may "
        "then get the same block and overwrite it first."),
    hazards.Hazard.UNORDERED: (
        "The two streams run in any order: the consumer's kernels may start before "
        "the producer's have finished (RAW), or overwrite what the other still "
        "reads (WAR/WAW)."),
    hazards.Hazard.PINNED_REWRITE: (
        "cudaMemcpyAsync from pinned memory reads it when the copy runs on the "
        "stream, not when it is called; the host's next write to the buffer can "
        "land first."),
    hazards.Hazard.UNSYNCED_D2H: (
        "A non_blocking device-to-host copy returns at once; the host reads "
        "whatever the buffer held before the copy landed."),
    hazards.Hazard.EARLY_EVENT: (
        "An event covers only the work queued before its record(); a waiter on it "
        "is not ordered after the work queued later."),
    hazards.Hazard.CACHED_STREAM: (
        "A stream made once and shared is current for several callers, none of "
        "which its work is ordered against."),
    hazards.Hazard.ASYNC_COLLECTIVE: (
        "An async collective runs on the communicator's stream; until its work is "
        "waited for, the current stream's use of its tensors is unordered with it."),
}


class Writer:
    """Harnesses for one source: its files read once, shared between functions."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.files = list(source.files())
        self.sites = harness_args.CallSites(self.files)

    def write(self, file: str, line: int, out: Path | None,
              record: tuple[Record, str] | None = None) -> Path:
        """Write the harness for the function at ``file:line``; its path. With a
        run's ``record`` (and its file's name), the call is the one it sketched
        (``harness_recorded``)."""
        from streamfuzz.fuzz.scan.report import write

        pkg, fn = self._package_of(file, line)
        findings = hazards.judge(pkg.walk(fn))
        if record is not None:
            from streamfuzz.fuzz.scan import harness_recorded

            call = harness_recorded.sketch_for(*record, self.source, fn.file, fn)
            code = harness_recorded.render(self.source, fn.file, fn, findings, call, record[1])
        else:
            # A closure is reached only through the function that defines it: the
            # harness calls that one, as the package does, and the closure runs inside.
            outer = _enclosing(pkg, fn)
            called = outer or fn
            trace = pkg.walk(called)
            fixed = {**harness_state.branch_to(called, line), **harness_state.ties(called)}
            with harness_state.fixing(fixed), \
                    harness_reads.package(self.files):  # tied keys; callees' reads, any file
                args = harness_args.decide(pkg, self.sites, called, trace)
                attrs = _object_attributes(pkg, called, trace, self.files) \
                    if called.cls is not None else {}
            code = render(self.source.spec, called.file, called, findings, args, attrs,
                          closure=fn if outer is not None else None,
                          skip=harness_state.unreachable(self.files, pkg, called))
        path = out or Path(f"test_streamfuzz_{_ident(fn.qualname)}.py")
        write(path, code)
        return path

    def function_at(self, file: str, line: int) -> Function:
        """The innermost function of the package around ``file:line``."""
        return self._package_of(file, line)[1]

    def _package_of(self, file: str, line: int) -> tuple[Package, Function]:
        """The function, in a package of its file and the files that call it by name:
        what its arguments and its callers' streams are read from (the whole
        package's walk is the scan's; a harness needs only these)."""
        rel, _ = source_file(self.source, file)
        own = [f for f in self.files if f.path == rel]
        first = Package(own)
        if rel not in first.modules:
            raise ScanInputError(f"{file}:{line}: no stream code there")
        fn = _function_at(first, rel, line)
        want = re.compile(rf"\b{re.escape(fn.name)}\s*\(")
        pkg = Package([*own, *(f for f in self.files if f.path != rel and want.search(f.text))])
        return pkg, _function_at(pkg, rel, line)


def write_for(source: Source, file: str, line: int, out: Path | None,
              record: tuple[Record, str] | None = None) -> Path:
    """Write the harness for the function at ``file:line`` of ``source``; its path."""
    return Writer(source).write(file, line, out, record)


def _ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def _generator(fn: Function) -> bool:
    """Whether calling ``fn`` only makes a generator: its body runs as it is drawn."""
    return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own_nodes(fn.node))


def _enclosing(pkg: Package, fn: Function) -> Function | None:
    """The outermost function ``fn`` is nested in (a method or a module's function), or
    None where ``fn`` is not a closure."""
    outer = [f for f in pkg.functions if f.file == fn.file and f is not fn and
             fn.qualname.startswith(f.qualname + ".") and
             f.node.lineno < fn.node.lineno <= (f.node.end_lineno or f.node.lineno)]
    return min(outer, key=lambda f: f.node.lineno) if outer else None


def _function_at(pkg: Package, file: str, line: int) -> Function:
    inside = [f for f in pkg.functions if f.file == file and
              f.node.lineno <= line <= (f.node.end_lineno or f.node.lineno)]
    if not inside:
        raise ScanInputError(f"{file}:{line}: no function there")
    return max(inside, key=lambda f: f.node.lineno)  # the innermost


def _class_node(pkg: Package, fn: Function) -> ast.ClassDef | None:
    body = pkg.modules[fn.file].tree.body
    node: ast.ClassDef | None = None
    for part in fn.qualname.split(".")[:-1]:
        node = next((c for c in body if isinstance(c, ast.ClassDef) and c.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _object_attributes(pkg: Package, fn: Function, trace: Trace,
                       files: list[SourceFile]) -> dict[str, str]:
    """``self.x`` for every attribute the class's methods read, by what its
    ``__init__`` sets it to, else by the scan's kind of it, else by its use; a flag
    the finding's branch needs and a stream context the package makes of the
    object's stream come first."""
    cls = _class_node(pkg, fn)
    if cls is None:
        return {}
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    made: dict[str, ast.expr] = {}
    annotated: dict[str, str] = {}
    if init is not None:
        for node in ast.walk(init):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                            t.value.id == "self":
                        made.setdefault(t.attr, node.value)
                        if isinstance(node, ast.AnnAssign):
                            annotated.setdefault(t.attr, ast.unparse(node.annotation))
    read = set()
    # The class's methods, and the module's functions (a decorator's wrapper takes a lock
    # of the object it wraps).
    scopes = [cls, *(n for n in pkg.modules[fn.file].tree.body if isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id == "self" and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
    out = {}
    # A collaborator built from a class of the file that only stores what it is given is
    # that class (what its methods return is what the function needs); what the class
    # hands it answers as its code checks.
    reals = {a: (built, ast.unparse(v.func)) for a, v in made.items()
             if a in read and isinstance(v, ast.Call) and _constructed(v) and
             (built := harness_state.real_class(pkg, fn, v)) is not None}
    for a in sorted(read - methods):
        key = f"self.{a}"
        assigned = made.get(a)
        first = harness_state.fixed(key) or harness_state.stream_context(files, a)
        if first is not None:
            out[a] = first
            continue
        state = harness_state.filled_entry(cls, fn, a) or reals.get(a, (None,))[0] or \
            harness_state.duck_for(pkg, fn, cls, a, {k: c for k, (_, c) in reals.items()})
        if state is not None:
            out[a] = state
            continue
        if assigned is not None and _constructed(assigned):  # the package's object: by its use
            out[a] = harness_args.use_of(key, fn, trace, scopes=(cls,))
            continue
        # A container the class fills later (``self.bufs: list[Tensor] = []``, appended
        # to per layer) holds what its annotation says, so an index into it is in range.
        filled = harness_args.annotated_container(annotated.get(a, ""), key, trace, fn)
        if filled is not None:
            out[a] = filled
            continue
        if _initial(assigned) == "[]":
            filled = harness_args.indexed_items(key, trace, fn, (cls,))
            if filled is not None:
                out[a] = filled
                continue
        value = _initial(assigned) if key not in (
            trace.tensors | trace.streams | trace.events | trace.host | trace.pinned) else None
        out[a] = value or harness_args.attribute_value(key, trace, fn, scopes=(cls,),
                                                       dtype=_stated_dtype(assigned))
    return out


def _stated_dtype(value: ast.expr | None) -> str:
    """``torch.empty(size, dtype=torch.uint8)``: the dtype a factory states, else ''."""
    if not isinstance(value, ast.Call):
        return ""
    for k in value.keywords:
        if k.arg == "dtype" and re.fullmatch(r"torch\.\w+", ast.unparse(k.value)):
            return ast.unparse(k.value)
    return ""


def _constructed(value: ast.expr) -> bool:
    """``Foo(...)``: an object of a class (a capitalised name), not a tensor factory."""
    if not isinstance(value, ast.Call):
        return False
    name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(
        value.func, "id", "")
    root = ast.unparse(value.func).split(".")[0]
    return name[:1].isupper() and root not in ("torch", "threading") and "Stream" not in name \
        and "Event" not in name


def _initial(value: ast.expr | None) -> str | None:
    """What ``__init__`` sets, where it is a literal, a stream or an event."""
    if value is None:
        return None
    text = ast.unparse(value)
    if isinstance(value, ast.Constant) and value.value is None:
        return None  # set later by another method: what the function does with it says
    if re.fullmatch(r"threading\.(Lock|RLock|Condition|Event)\(\)", text):
        return text
    if isinstance(value, ast.Constant) or text in ("[]", "{}", "set()", "()"):
        return text
    if isinstance(value, ast.ListComp) and len(value.generators) == 1 and re.fullmatch(
            r"range\(.*\)", ast.unparse(value.generators[0].iter)):  # [Event() for _ in range(k)]
        item = _initial(value.elt)
        count = ast.unparse(value.generators[0].iter)
        if not re.fullmatch(r"range\(\d+\)", count):
            count = "range(4)"  # a depth the package reads from its config
        if item is not None:
            return f"[{item} for _ in {count}]"
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and isinstance(
            value.left, ast.List) and _initial(value.left) is not None:  # [0] * depth
        return f"{ast.unparse(value.left)} * 4"
    if re.search(r"\bcurrent_stream\(\)$", text):
        return harness_args.CURRENT
    if re.search(r"\bStream\(", text):
        return harness_args.SIDE
    if re.search(r"\bEvent\(", text):
        return "torch.cuda.Event()"
    if isinstance(value, (ast.List, ast.ListComp)):
        return "[]"
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return "{}"
    return None


_HELPERS = '''

class _Object:
    """An argument the package passes duck-typed: the attributes the function reads."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __enter__(self):  # a lock or a context the function enters
        return self

    def __exit__(self, *exc):
        return None


def _recorded_event():
    event = torch.cuda.Event()
    event.record()  # after the caller's work on the current stream, as a caller records it
    return event


def _first_tensor(*args, **kwargs):
    """A callable the package passes that returns a tensor: the first one it is given."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)):
            found = _first_tensor(*value)
            if found is not None:
                return found
    return None


class _Received(dict):
    """What a peer sends back: the keys of the dict sent, each tensor a fresh one like
    it; a key the code looks up that was not sent is a tensor like them too."""

    def __missing__(self, key):
        like = next((v for v in self.values() if isinstance(v, torch.Tensor)), None)
        self[key] = torch.zeros(1, device=DEVICE) if like is None else torch.zeros_like(like)
        return self[key]


def _gives(shape):
    """A collaborator's method whose result the package iterates (a list), looks up (a
    dict) or enters (a context): it reads the tensors it is given on the current stream,
    as the send, copy or collective it stands for does, and gives an empty list, what a
    peer sends back, or the context of the stream it is given (none: a null context)."""
    def method(*args, **kwargs):
        if shape == "context":
            given = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.cuda.Stream)]
            return torch.cuda.stream(given[0] if given else None)
        _consume([*args, *kwargs.values()])
        if shape is list:
            return []
        given = next((v for v in (*args, *kwargs.values()) if isinstance(v, dict)), {})
        return _Received({k: torch.empty_like(v) if isinstance(v, torch.Tensor) else v
                          for k, v in given.items()})
    return method


class _stream_context:
    """``self.X_ctx``, which the package makes as ``torch.cuda.stream(self.X)``."""

    def __init__(self, obj, name):
        self.obj, self.name = obj, name

    def __enter__(self):
        stream = getattr(self.obj, self.name, None) or torch.cuda.Stream()
        self.entered = torch.cuda.stream(stream)
        return self.entered.__enter__()

    def __exit__(self, *exc):
        return self.entered.__exit__(*exc)


def _consume(value):
    """The caller's next kernels read what the call returned, on the current stream."""
    if isinstance(value, torch.Tensor):
        value.sum()
    elif isinstance(value, (list, tuple)):
        for v in value:
            _consume(v)
    elif isinstance(value, dict):
        for v in value.values():
            _consume(v)
'''


def render(spec: str, file: str, fn: Function, findings: list[hazards.Finding],
           args: harness_args.Arguments, attrs: dict[str, str],
           closure: Function | None = None, skip: str | None = None) -> str:
    """The harness source; ``closure``: the function of the findings, defined inside
    ``fn``, which the harness calls; ``skip``: why it cannot check anything here."""
    findings = sorted(findings, key=lambda f: (-f.score, f.line))
    name = _ident((closure or fn).qualname)
    head = f"{closure.qualname} ({file}:{closure.node.lineno}), a closure: the harness " \
        f"calls {fn.qualname}, which defines and calls it" if closure else \
        f"{fn.qualname} ({file}:{fn.node.lineno})"
    lines = [
        f'"""streamfuzz harness for {head}.',
        "",
        "Written by `python -m streamfuzz scan --harness`. Run it with",
        "`pytest THIS_FILE --streamfuzz-device cpu` (simulated CUDA streams, no GPU) or",
        "`--streamfuzz-device cuda`. A finding fails the test with the checker's message.",
        '"""',
        "",
        "import os",
        "import threading  # noqa: F401 - where the class keeps a lock",
        "",
        *(["import numpy as np"] if any("np." in v for v in args.values.values()) else []),
        *(["import pytest"] if skip else []),
        "import torch",
        "from hypothesis import given, settings",
        "from hypothesis import strategies as st",
        "",
        "import streamfuzz",
        "from streamfuzz.standins import load",
        "",
        f"SOURCE = os.environ.get({env.SOURCE!r}, {spec!r})",
        f"FILE = {file!r}",
        'DEVICE = "cuda"  # simulated on CPU under --streamfuzz-device cpu',
        "",
        "# The real code, compiled unchanged, with the package's files it imports; imports",
        "# that fail here are stood in: `TARGET.stood_in` lists them.",
        "TARGET = load(SOURCE, FILE)",
        "",
        "# What the scan found in this function, and the interleaving each needs:",
    ]
    if not findings:
        lines += ["#   (no finding: the harness still checks the function as it runs)"]
    for f in findings:
        lines += [f"#   [{f.score}] {f.hazard.value} at line {f.line}: {f.what}"]
        lines += ["#       " + w for w in textwrap.wrap(_INTERLEAVING[f.hazard], 76)]
        lines += ["#       " + w for w in textwrap.wrap(f.safe_if, 76)]
    lines += _HELPERS.splitlines()
    if fn.cls is not None:
        cls_path = ".".join(fn.qualname.split(".")[:-1])
        lines += ["", "",
                  "def _object(n):",
                  "    \"\"\"The object, made without __init__, with the attributes its class "
                  "reads.\"\"\"",
                  f"    cls = TARGET.module.{cls_path}",
                  "    obj = cls.__new__(cls)"]
        for a, v in attrs.items():
            lines += [f"    if not hasattr(cls, {a!r}):", f"        obj.{a} = {v}"]
        lines += ["    return obj"]
        target = f"obj.{fn.name}"
    else:
        target = f"TARGET.module.{fn.qualname}"
    lines += ["", "", "def _arguments(n):"]
    where = ", ".join(args.callers[:3]) or "none in the package"
    lines += [f"    \"\"\"What the package's callers pass (read at: {where}).\"\"\""]
    lines += ["    return {"]
    for k, v in args.values.items():
        lines += [f"        {k!r}: {v},  # {args.why[k]}"]
    lines += ["    }"]
    lines += ["", ""]
    if skip:
        lines += [f"@pytest.mark.skip(reason={skip!r})"]
    lines += ["@settings(max_examples=20, deadline=None)",
              "@given(n=st.integers(min_value=1, max_value=64))",
              f"def test_{name}(n):",
              "    with streamfuzz.checked():"]
    body: list[str] = []
    if fn.cls is not None:
        body += ["obj = _object(n)",
                 "torch.cuda.synchronize()  # an engine builds it at start-up, long before a "
                 "step"]
    if "side" in args.contexts:
        body += ["context = torch.cuda.Stream()  # every caller calls it under a stream "
                 "context",
                 "context.wait_stream(torch.cuda.current_stream())"]
    sides = [k for k, v in args.values.items() if v == harness_args.SIDE]
    if sides:  # an engine makes its streams once: both calls get the same one
        body += ["streams = {" + ", ".join(f"{k!r}: torch.cuda.Stream()" for k in sides) + "}"]
    body += ["# Two calls in a row, as the engine's steps make them; the caller drops its",
             "# references after each.",
             "for _step in range(2):"]
    call = f"{target}(**args)"
    if _generator(fn):  # its callers draw it step by step (a layer a step): all steps
        call = f"list({call})"
    body += ["    args = _arguments(n)"]
    if sides:
        body += ["    args.update(streams)"]
    body += [f"    args[{k!r}].wait_stream(torch.cuda.current_stream())  # as every caller "
             "does first" for k in args.waits]
    if "side" in args.contexts:
        body += ["    with torch.cuda.stream(context):", f"        result = {call}"]
    else:
        body += [f"    result = {call}"]
    if args.uses_result:
        body += ["    _consume(result)  # the callers use what it returns"]
    body += ["    del result, args"]
    lines += ["        " + b for b in body]
    lines += [""]
    return "\n".join(lines)
