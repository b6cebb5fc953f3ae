"""A ``streamfuzz.checked()`` harness from a recorded call (``scan --harness --record``).

Where the record of a checked run (``pytest --streamfuzz-record``, ``check
--record``) holds a sketch of the function's first call
(``streamfuzz._callsketch``), the harness makes that call again rather than
guessing it from the package's source: the object is made with
``object.__new__`` and given the attributes it had, tensors are zeros of
the recorded shape, dtype, strides and device (pinned where they were),
streams are the caller's current stream, the default one or side streams
named as they were, and the caller's own stream is the one it ran on. An
engine's state is built at start from its configuration, which a reading of
its source cannot do. The checked block is the static harness's: two calls
in a row, references dropped after each.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

from streamfuzz import _callsketch as cs
from streamfuzz._record import Record
from streamfuzz.fuzz import env
from streamfuzz.fuzz.scan import hazards
from streamfuzz.fuzz.scan.marks import functions_at
from streamfuzz.fuzz.scan.package import Function
from streamfuzz.fuzz.scan.sources import ScanInputError, Source
from streamfuzz.fuzz.scan.standins import module_name

ZEROS = 256 << 20
"""Tensors larger than this are made with ``torch.empty`` (their pages stay untouched)."""


def sketch_for(record: Record, record_file: str, source: Source, file: str,
               fn: Function) -> cs.CallSketch:
    """The record's sketch of ``fn``'s call; bad input (no sketch) is one line."""
    ran = functions_at(record, source, file, fn.qualname, fn.node.lineno)
    calls = {c.key: c for c in record.calls}
    for f in ran:
        if f.key in calls:
            return calls[f.key]
    said = "did no stream work in that run" if not ran else "has no sketch of its call there"
    raise ScanInputError(f"--record {record_file}: {fn.qualname} ({file}:{fn.node.lineno}) "
                         f"{said}; run a test that calls it under pytest --streamfuzz "
                         "--streamfuzz-record, or leave out --record for a harness read "
                         "from the source")


_HELPERS = '''

def _named(module, qualname, file=None):
    """What the record names by import path: the package's own as this harness
    loaded it (its other files loaded from the source where not loaded yet)."""
    found = sys.modules.get(f"{PREFIX}.{module}")
    if found is None:
        found = load(SOURCE, file).module if file else importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _new(cls):
    """The object without its __init__: the record gives its attributes."""
    return object.__new__(cls)


def _stream(check, name):
    """A side stream, named in findings as the recorded run named it."""
    stream = torch.cuda.Stream()
    if name:
        check.name(stream, name)
    return stream


def _tensor(shape, dtype, device, strides=None, offset=0, storage_bytes=0, pinned=False,
            requires_grad=False):
    """A tensor of the recorded layout: zeros, as values are not recorded."""
    numel = math.prod(shape)
    if strides is None:
        size, strides = numel, None
    else:
        reach = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if numel else 0
        size = max(reach, -(-storage_bytes // dtype.itemsize))
    make = torch.zeros if size * dtype.itemsize <= _ZEROS else torch.empty
    extra = {"pin_memory": True} if pinned else {}
    t = make(size if strides is not None else shape, dtype=dtype, device=device, **extra)
    if strides is not None:
        t = t.as_strided(shape, strides, offset)
    return t.requires_grad_() if requires_grad else t


def _view(base, shape, strides, offset, dtype):
    """A view of another recorded tensor's memory, where the recorded one was."""
    if base.dtype == dtype:
        return base.as_strided(shape, strides, offset)
    view = torch.empty(0, dtype=dtype, device=base.device)
    return view.set_(base.untyped_storage(), offset, shape, strides)


class _Unrecorded:
    """A value the record could not sketch: any use says so."""

    def __init__(self, what):
        self._what = what

    def __getattr__(self, name):
        raise RuntimeError(f"the record has no sketch of {self._what}: set it in this harness")

    def __call__(self, *args, **kwargs):
        return self.__getattr__("__call__")

    def __iter__(self):
        return self.__getattr__("__iter__")
'''


@dataclass
class _Render:
    """One harness's statements; module names mapped to the source's."""

    modules: dict[str, str]  # recorded module -> (the source's module, its file)
    files: dict[str, str]
    tensors: dict[str, cs.Tensor] = field(default_factory=dict)

    def build(self, v: cs.Value, target: str, out: list[str]) -> None:
        """Statements that set ``target`` to ``v``."""
        if _leaf(v):
            out.append(f"{target} = {self.expr(v, target)}")
            return
        if isinstance(v, cs.Object):
            out.append(f"{target} = _new({self.ref(v.cls)})")
            for name, a in v.attributes:
                if v.plain and name.isidentifier():
                    self.build(a, f"{target}.{name}", out)
                else:
                    tmp = f"_{len(out)}"
                    self.build(a, tmp, out)
                    out.append(f"object.__setattr__({target}, {name!r}, {tmp})")
            if v.more:
                out.append(f"# ({v.more} more attribute(s) not recorded)")
            return
        if isinstance(v, cs.Items) and len(v.items) == 1 < v.length and v.cls is None and \
                v.kind in ("list", "tuple", "deque"):
            inner: list[str] = []  # all alike: the one sketch, made for each
            each = f"_i{target.count('[_i')}"
            self.build(v.items[0], f"{target}[{each}]", inner)
            out += [f"{target} = [None] * {v.length}", f"for {each} in range({v.length}):",
                    *("    " + line for line in inner)]
            if v.kind != "list":
                out.append(f"{target} = {self._sequence(v, target)}")
            return
        if isinstance(v, cs.Items):
            first = (self.expr(i, f"{target}[{n}]") if _leaf(i) else "None"
                     for n, i in enumerate(v.items))
            out.append(f"{target} = [{', '.join(first)}]")
            for i, item in enumerate(v.items):
                if not _leaf(item):
                    self.build(item, f"{target}[{i}]", out)
            if v.length > len(v.items):
                out.append(f"# ({v.length - len(v.items)} more item(s) not recorded)")
            if v.kind != "list":
                out.append(f"{target} = {self._sequence(v, target)}")
            return
        if isinstance(v, cs.Mapping):
            out.append(f"{target} = {self._mapping(v)}")
            for k, item in v.items:
                if not _leaf(item):
                    self.build(item, f"{target}[{self.expr(k, '')}]", out)
            return
        raise AssertionError(type(v))

    def expr(self, v: cs.Value, path: str) -> str:
        """A leaf's expression (``path``: where it is put, for the views of it)."""
        if isinstance(v, cs.Literal):
            return v.text
        if isinstance(v, cs.Bytes):
            return f"bytes.fromhex({v.hex!r})"
        if isinstance(v, cs.Tensor):
            if path:
                self.tensors[path] = v
            return self._tensor(v)
        if isinstance(v, cs.Array):
            return f"importlib.import_module('numpy').zeros({v.shape!r}, dtype={v.dtype!r})"
        if isinstance(v, cs.Stream):
            return {"current": "current", "default": "torch.cuda.default_stream()"}.get(
                v.role, f"_stream(check, {v.name!r})")
        if isinstance(v, cs.Event):
            return "torch.cuda.Event()"
        if isinstance(v, cs.Ref):
            return self._ref_value(v)
        if isinstance(v, cs.Same):
            return v.path
        if isinstance(v, cs.Opaque):
            return f"_Unrecorded({f'{v.type} ({v.why})'!r})"
        if isinstance(v, cs.Items):
            return self._sequence(v, "")
        if isinstance(v, cs.Mapping):
            return self._mapping(v)
        return f"_Unrecorded({'a ' + v.cls.qualname + ' inside a set or a named tuple'!r})"

    def _sequence(self, v: cs.Items, built: str) -> str:
        """A sequence's expression; ``built``: a list already holding its items."""
        if built:
            inner = built
        elif v.items and v.length > len(v.items) and len(set(v.items)) == 1:
            inner = f"[{self.expr(v.items[0], '')} for _ in range({v.length})]"
        else:
            inner = f"[{', '.join(self.expr(i, '') for i in v.items)}]"
        if v.cls is not None:  # a named tuple: its fields in order
            return f"{self.ref(v.cls)}(*{inner})" if built else \
                f"{self.ref(v.cls)}({', '.join(self.expr(i, '') for i in v.items)})"
        if v.kind == "list":
            return inner
        if v.kind == "tuple":
            if built or not v.items:
                return f"tuple({inner})"
            return f"({', '.join(self.expr(i, '') for i in v.items)}{',' * (len(v.items) == 1)})"
        if v.kind == "deque":
            return f"importlib.import_module('collections').deque({inner})"
        return f"{v.kind}({inner})"

    def _mapping(self, v: cs.Mapping) -> str:
        """A dict's expression; its objects are ``None`` here, set by ``build``."""
        body = "{" + ", ".join(
            f"{self.expr(k, '')}: {self.expr(i, '') if _leaf(i) else 'None'}"
            for k, i in v.items) + "}"
        if v.kind == "defaultdict" and v.factory is not None:
            return (f"importlib.import_module('collections').defaultdict("
                    f"{self.expr(v.factory, '')}, {body})")
        if v.kind == "OrderedDict":
            return f"importlib.import_module('collections').OrderedDict({body})"
        return body

    def _tensor(self, t: cs.Tensor) -> str:
        dtype = f"torch.{t.dtype}"
        if t.view_of and t.view_of in self.tensors and self.tensors[t.view_of].device == t.device:
            return f"_view({t.view_of}, {t.shape!r}, {t.strides!r}, {t.offset}, {dtype})"
        device = "DEVICE" if t.device == "cuda" else repr(t.device)
        extra = []
        itemsize = _ITEMSIZE.get(t.dtype, 0)
        plain = t.offset == 0 and t.strides == _contiguous(t.shape) and (
            t.storage_bytes in (0, math.prod(t.shape) * itemsize) or not itemsize)
        if not plain:
            extra += [f"strides={t.strides!r}", f"offset={t.offset}",
                      f"storage_bytes={t.storage_bytes}"]
        if t.pinned:
            extra.append("pinned=True")
        if t.requires_grad:
            extra.append("requires_grad=True")
        return f"_tensor({', '.join([repr(t.shape), dtype, device, *extra])})"

    def ref(self, r: cs.Ref) -> str:
        module, file = r.module, None
        if r.module in self.modules:
            module = self.modules[r.module]
            file = self.files.get(module)
        args = f"{module!r}, {r.qualname!r}" + (f", file={file!r}" if file else "")
        return f"_named({args})"

    def _ref_value(self, r: cs.Ref) -> str:
        if r.kind in ("class", "function"):
            return self.ref(r)
        if r.kind == "global":
            return f"{r.module}.{r.qualname}" if r.module == "torch" else self.ref(r)
        if r.kind == "device":
            return "torch.device(DEVICE)" if r.module == "cuda" else f"torch.device({r.module!r})"
        if r.kind == "module":
            return f"importlib.import_module({r.module!r})"
        if r.kind == "enum":
            return f"{self.ref(r)}[{r.member!r}]"
        if r.kind == "fresh":
            if r.module == "threading":
                return f"threading.{r.qualname}()"
            return f"{self.ref(r)}()"
        if r.kind == "method":
            return f"{r.module}.{r.qualname}"
        raise AssertionError(r.kind)


def _leaf(v: cs.Value) -> bool:
    """Made in one expression: no object inside, nothing another value points into."""
    if isinstance(v, cs.Object):
        return False
    if isinstance(v, cs.Items):
        return all(_leaf(i) and not isinstance(i, cs.Tensor) for i in v.items) or (
            v.kind in ("set", "frozenset") or v.cls is not None)
    if isinstance(v, cs.Mapping):
        return all(_leaf(i) and not isinstance(i, cs.Tensor) for _, i in v.items)
    return True


_ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
             "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8,
             "complex128": 16}
"""Bytes per element, to tell a tensor that fills its storage (0: not known)."""


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _mapped(recorded: set[str], source: Source) -> tuple[dict[str, str], dict[str, str]]:
    """The recorded module names that are the source's modules (the run imported
    ``pkg.mod``, the scan reads ``src/pkg/mod.py`` or ``pkg/mod.py``)."""
    files = {module_name(f.path): f.path for f in source.files()}
    out = {}
    for name in recorded:
        if name in files:
            out[name] = name
            continue
        tails = [m for m in files if m.endswith("." + name) or name.endswith("." + m)]
        if len(tails) == 1:
            out[name] = tails[0]
    return out, files


def _refs(v: cs.Value) -> set[str]:
    """The modules a value names."""
    if isinstance(v, cs.Ref):
        return {v.module} if v.kind in ("class", "function", "global", "enum", "fresh") else set()
    if isinstance(v, cs.Object):
        return _refs(v.cls).union(*(_refs(a) for _, a in v.attributes))
    if isinstance(v, cs.Items):
        return set().union(*(_refs(i) for i in v.items), _refs(v.cls) if v.cls else set())
    if isinstance(v, cs.Mapping):
        return set().union(*(_refs(a) | _refs(b) for a, b in v.items),
                           _refs(v.factory) if v.factory else set())
    return set()


def render(source: Source, file: str, fn: Function, findings: list[hazards.Finding],
           call: cs.CallSketch, record_file: str) -> str:
    """The harness source."""
    name = "".join(c if c.isalnum() else "_" for c in fn.qualname)
    modules, files = _mapped(set().union({call.module}, *(_refs(p.value) for p in call.params)),
                             source)
    r = _Render(modules, files)
    lines = [
        f'"""streamfuzz harness for {fn.qualname} ({file}:{fn.node.lineno}), from a recorded call.',
        "",
        f"Written by `python -m streamfuzz scan --harness --record {record_file}`: the object",
        "and the arguments are those of the call the checked run recorded (tensors of the",
        "recorded layouts, zeros; streams as the call saw them). Run it with",
        "`pytest THIS_FILE --streamfuzz-device cpu` (simulated CUDA streams, no GPU) or",
        "`--streamfuzz-device cuda`. A finding fails the test with the checker's message.",
        '"""',
        "",
        "import importlib",
        "import math",
        "import os",
        "import sys",
        "import threading  # noqa: F401 - where the object keeps a lock",
        "",
        "import torch",
        "",
        "import streamfuzz",
        "from streamfuzz.standins import load",
        "",
        f"SOURCE = os.environ.get({env.SOURCE!r}, {source.spec!r})",
        f"FILE = {file!r}",
        'DEVICE = "cuda"  # simulated on CPU under --streamfuzz-device cpu',
        f"_ZEROS = {ZEROS}  # larger tensors are left uninitialised",
        "",
        "# The real code, compiled unchanged, with the package's files it imports; imports",
        "# that fail here are stood in: `TARGET.stood_in` lists them.",
        "TARGET = load(SOURCE, FILE)",
        'PREFIX = TARGET.module.__name__.split(".")[0]',
        "",
        "# What the scan found in this function:",
    ]
    if not findings:
        lines += ["#   (no finding: the harness still checks the function as it runs)"]
    for f in sorted(findings, key=lambda f: (-f.score, f.line)):
        lines += [f"#   [{f.score}] {f.hazard.value} at line {f.line}: {f.what}"]
        lines += ["#       " + w for w in textwrap.wrap(f.safe_if, 76)]
    if call.cut:
        lines += [f"# The record cut this call's sketch at {cs.NODES} values: the rest are "
                  "_Unrecorded."]
    lines += _HELPERS.splitlines()
    params = {p.name: p for p in call.params}
    self_param = params.get(call.self_param)
    if self_param is not None:
        body: list[str] = []
        r.build(self_param.value, "obj", body)
        lines += ["", "", "def _object(check, current):",
                  '    """The object as the recorded call found it."""',
                  *("    " + b for b in body), "    return obj"]
    body = ["args = {}"]
    for p in call.params:
        if p.name != call.self_param:
            r.build(p.value, f"args[{p.name!r}]", body)
    lines += ["", "", "def _arguments(obj, check, current):",
              '    """The call\'s arguments, as recorded."""',
              *("    " + b for b in body), "    return args"]
    target = _target(fn, call, self_param)
    call_args = []
    for p in call.params:
        if p.name == call.self_param:
            continue
        a = f"args[{p.name!r}]"
        call_args.append({"positional_only": a, "positional_or_keyword": a,
                          "var_positional": f"*{a}", "keyword_only": f"{p.name}={a}",
                          "var_keyword": f"**{a}"}[p.kind])
    side = call.current.role == "side"
    lines += ["", "", f"def test_{name}():",
              "    with streamfuzz.checked() as check:"]
    body = []
    if side:
        body += [f"current = _stream(check, {call.current.name!r})  # the recorded call ran "
                 "on this side stream"]
    else:
        body += ["current = torch.cuda.current_stream()  # the recorded call ran on the "
                 "default stream"]
    body += ["obj = _object(check, current)" if self_param is not None else "obj = None"]
    if side:
        body += ["current.wait_stream(torch.cuda.current_stream())  # the object is ready"]
    body += ["# Two calls in a row, as the engine's steps make them; the caller drops its",
             "# references after each.",
             "for _step in range(2):"]
    step = ["args = _arguments(obj, check, current)",
            f"result = {target}({', '.join(call_args)})",
            "del result, args"]
    if side:
        body += ["    with torch.cuda.stream(current):", *("        " + s for s in step)]
    else:
        body += ["    " + s for s in step]
    lines += ["        " + b for b in body]
    lines += [""]
    return "\n".join(lines)


def _target(fn: Function, call: cs.CallSketch, obj: cs.Param | None) -> str:
    """What is called: the method of the object where the object is of the
    function's own class, else the function through its class or module."""
    cls_path = fn.qualname.rpartition(".")[0]
    if obj is not None and isinstance(obj.value, cs.Object) and \
            obj.value.cls.qualname == cls_path:
        return f"obj.{fn.name}"
    if obj is not None:
        return f"TARGET.module.{fn.qualname}.__get__(obj)"
    return f"TARGET.module.{fn.qualname}"
