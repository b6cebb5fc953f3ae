"""What a harness passes a function: read from what the package itself passes it.

Each argument is decided from, in order: the callers' own stream (a stream
parameter every caller passes its current stream gets the current stream,
``callers.current_stream_params``), the callers' arguments at their call
sites in any file of the package (a literal is passed as it is; a lambda, a
list or an iterator keeps its kind), the parameter's annotation, and last how
the function itself uses the parameter (called, iterated, its attributes
read: an object with those attributes). A parameter with a default that no
caller overrides keeps its default. Uses are read across the class's methods
and through the locals that hold a value (``kind_of_use``): a tensor's method
makes a tensor, arithmetic or an index a number, a factory's ``dtype=`` a
dtype; an engine's state then has the types its code needs, not objects that
break at the first comparison. The scan's names (tensors, host and
pinned memory, streams, events) decide a tensor's device and a stream's kind.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamfuzz.fuzz.scan import callers, harness_reads, harness_results, harness_state
from streamfuzz.fuzz.scan.names import EVENTISH, INDEXISH, STREAMISH
from streamfuzz.fuzz.scan.nodes import text as _text
from streamfuzz.fuzz.scan.ops import Trace
from streamfuzz.fuzz.scan.package import Function, Package
from streamfuzz.fuzz.scan.sources import SourceFile

CURRENT = "torch.cuda.current_stream()"
SIDE = "torch.cuda.Stream()"
_CALLABLE = "lambda *args, **kwargs: None"
_SCALARS = {"int": "n", "float": "1.0", "bool": "False", "str": "'x'", "bytes": "b''",
            "dict": "{}", "list": "[]", "set": "set()", "tuple": "()"}


@dataclass
class Arguments:
    """The harness's arguments: ``values`` by parameter (source text), and why."""

    values: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    callers: list[str] = field(default_factory=list)  # "file:line" of each call site read
    contexts: set[str] = field(default_factory=set)  # 'side' where every caller enters one
    uses_result: bool = False  # a caller uses what the call returns
    waits: list[str] = field(default_factory=list)  # side streams every caller orders first


class CallSites:
    """Every call of a name in the package, any file (not only those with stream
    words): found by text first, parsed only where the name is called."""

    def __init__(self, files: Iterable[SourceFile]) -> None:
        self.files = list(files)
        self._trees: dict[str, ast.Module | None] = {}

    def of(self, name: str) -> list[tuple[str, ast.Call, list[ast.AST]]]:
        """(file, call, the call's enclosing ``with`` statements and function) for each
        call of ``name``."""
        want = re.compile(rf"\b{re.escape(name)}\s*\(")
        out = []
        for f in self.files:
            if not want.search(f.text):
                continue
            tree = self._tree(f)
            if tree is None:
                continue
            for call, withs in _calls(tree, []):
                fn = call.func
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if called == name:
                    out.append((f.path, call, withs))
        return out

    def _tree(self, f: SourceFile) -> ast.Module | None:
        if f.path not in self._trees:
            try:
                self._trees[f.path] = ast.parse(f.text)
            except (SyntaxError, ValueError, RecursionError):
                self._trees[f.path] = None
        return self._trees[f.path]


def _calls(node: ast.AST, withs: list[ast.AST]) -> Iterable[tuple[ast.Call, list[ast.AST]]]:
    for child in ast.iter_child_nodes(node):
        inner = [*withs, child] if isinstance(child, (ast.With, ast.AsyncWith)) else withs
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = [child]  # the enclosing function first, then its withs
        if isinstance(child, ast.Call):
            child._streamfuzz_unused = isinstance(node, ast.Expr)  # type: ignore[attr-defined]
            yield child, withs
        yield from _calls(child, inner)


def decide(pkg: Package, sites: CallSites, fn: Function, trace: Trace) -> Arguments:
    """The arguments for one call of ``fn``."""
    out = Arguments()
    current = callers.current_stream_params(pkg, fn)
    params = fn.params()
    a = fn.node.args
    defaults = dict(zip([p.arg for p in [*a.posonlyargs, *a.args]][-len(a.defaults):],
                        a.defaults)) if a.defaults else {}
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    kwonly = [p for p in a.kwonlyargs if p.arg not in defaults]
    calls = _calls_of(sites, fn)
    out.callers = [f"{file}:{call.lineno}" for file, call, _ in calls]
    out.uses_result = any(not getattr(call, "_streamfuzz_unused", True) for _, call, _ in calls)
    if calls and all(_in_side_context(withs) for _, _, withs in calls):
        out.contexts.add("side")
    for p in [*params, *kwonly]:
        passed = [x for x in (_passed(fn, call, p.arg) for _, call, _ in calls) if x is not None]
        value, why = _value(p, passed, p.arg in current, p.arg in defaults, trace, fn)
        if value is None:
            continue  # its default
        out.values[p.arg] = value
        out.why[p.arg] = why
    if a.kwarg is not None:  # ``kwargs["slot_mapping"]``: the keys the function reads
        for key, local, ann in _keyword_keys(fn.node, a.kwarg.arg):
            if key in out.values:
                continue
            value = _tensor(local or key, trace, fn) if re.match(
                r"(Optional\[)?(torch\.)?Tensor\b", ann) else annotated_value(
                ann, local or key, trace, fn) if ann else None
            out.values[key] = value or (use_of(local, fn, trace) if local else
                                        _tensor(key, trace, fn))
            out.why[key] = f"read from **{a.kwarg.arg}" + (f" as {local}" if local else "")
    sides = [k for k, v in out.values.items() if v == SIDE]
    out.waits = [k for k in sides if calls and all(
        _waited_before(withs, call, _passed(fn, call, k)) for _, call, withs in calls)]
    return out


def _keyword_keys(node: ast.AST, kwargs: str) -> list[tuple[str, str, str]]:
    """(key, the local it is read into or '', that local's annotation or '') for each
    constant key the function reads of its ``**kwargs``: ``kwargs["k"]``,
    ``kwargs.get("k")``, ``"k" in kwargs``."""
    def read(n: ast.AST) -> str | None:
        """The constant key ``n`` reads of ``kwargs``, if it reads one."""
        got = n.slice if isinstance(n, ast.Subscript) and _text(n.value) == kwargs else \
            n.args[0] if isinstance(n, ast.Call) and _text(n.func) == f"{kwargs}.get" and \
            n.args else n.left if isinstance(n, ast.Compare) and len(n.ops) == 1 and \
            isinstance(n.ops[0], ast.In) and _text(n.comparators[0]) == kwargs else None
        return got.value if isinstance(got, ast.Constant) and isinstance(
            got.value, str) and got.value.isidentifier() else None

    found: dict[str, tuple[str, str]] = {}
    for n in ast.walk(node):
        key = read(n)
        if key is not None:
            found.setdefault(key, ("", ""))
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            target = n.targets[0] if isinstance(n, ast.Assign) else n.target
            key = None if isinstance(n.value, ast.Compare) else read(n.value)  # a value
            if isinstance(target, ast.Name) and key is not None:
                ann = _text(n.annotation) if isinstance(n, ast.AnnAssign) else ""
                found[key] = (target.id, ann)
    return [(k, local, ann) for k, (local, ann) in found.items()]


def _waited_before(withs: list[ast.AST], call: ast.Call, arg: ast.expr | None) -> bool:
    """Does the caller make the stream it passes wait (``wait_stream``/``wait_event``)
    before the call? A wait under ``if stream is not None`` counts: the call passes it."""
    scope = next((w for w in withs if isinstance(w, (ast.FunctionDef, ast.AsyncFunctionDef))),
                 None)
    if scope is None or arg is None:
        return False
    name = _text(arg)
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
               n.func.attr in ("wait_stream", "wait_event") and _text(n.func.value) == name
               and n.lineno < call.lineno for n in ast.walk(scope))


def _calls_of(sites: CallSites, fn: Function) -> list[tuple[str, ast.Call, list[ast.AST]]]:
    found = sites.of(fn.name)
    method = fn.cls is not None
    return [(file, call, withs) for file, call, withs in found
            if isinstance(call.func, ast.Attribute) == method or not method][:20]


def _in_side_context(withs: list[ast.AST]) -> bool:
    for w in withs:
        for item in getattr(w, "items", ()):
            text = ast.unparse(item.context_expr)
            if STREAMISH.search(text) and "current_stream" not in text:
                return True
    return False


def _passed(fn: Function, call: ast.Call, param: str) -> ast.expr | None:
    arg = next((k.value for k in call.keywords if k.arg == param), None)
    names = [p.arg for p in fn.params()]
    if arg is None and param in names:
        i = names.index(param)
        if i < len(call.args) and not any(isinstance(x, ast.Starred) for x in call.args[:i + 1]):
            arg = call.args[i]
    return arg


def _value(p: ast.arg, passed: list[ast.expr], current: bool, has_default: bool,
           trace: Trace, fn: Function) -> tuple[str | None, str]:
    name = p.arg
    ann = _unwrap(ast.unparse(p.annotation)) if p.annotation is not None else ""
    tied = harness_state.fixed(name)
    if tied is not None:
        return tied, "the keys another argument is looked up in"
    if current:
        return CURRENT, "every caller passes its current stream"
    if has_default and not passed:
        return None, "its default"
    literal = _common_literal(passed)
    if literal is not None:
        return literal, "the callers' literal"
    shape = _passed_shape(passed)
    array = _numpy(ann, name, fn)
    if array is not None:
        return array, f"a NumPy array (its annotation, {ann})"
    if ann.partition("[")[0].rsplit(".", 1)[-1] in _QUEUES:  # of events or tensors: a queue
        return _by_use(name, trace, fn)
    if name in trace.streams or "Stream" in ann:
        return SIDE, "a stream the callers make apart from the current one"
    if name in trace.events or "Event" in ann:
        return "_recorded_event()", "an event, recorded on the current stream"
    kind = _annotated(ann, _tensor(name, trace, fn))
    if kind is not None and not re.match(r"(torch\.)?Tensor\b", ann):  # stated not a tensor
        if kind == "n":
            return _int(name), f"its annotation ({ann}), by its name"
        indexed = harness_reads.indexed_items({name}, fn, trace, ()) if kind == "[]" else None
        if indexed is not None:
            return indexed, f"its annotation ({ann}), items for the index it is looked up by"
        return kind, f"its annotation ({ann})"
    used = {n.attr for n in ast.walk(fn.node) if isinstance(n, ast.Attribute) and
            _text(n.value) == name}
    stated = re.search(r"(?<![\w.])(torch\.)?Tensor\b", ann)
    if stated or (name in trace.tensors and not (  # a class of the package named ...Tensors
            ann and used - _TENSOR_USES and harness_reads.defined_class(ann))):
        listed = shape == "list" or re.match(r"(list|List|Sequence|tuple|Tuple)\[", ann)
        tensor = _tensor(name, trace, fn)
        return (f"[{tensor}, {tensor}]" if listed else tensor), "a tensor (the scan's)"
    if used and used <= _TENSOR_USES and kind_of_use({name}, [fn.node]) == "tensor":
        # Its own use outweighs what a call of the same name elsewhere passes.
        return _tensor(name, trace, fn), "a tensor (the function's use of it)"
    indexed = harness_reads.indexed_items({name}, fn, trace, ()) if shape == "list" else None
    if indexed is not None:
        return indexed, "the callers pass a list, with items for the index it is looked up by"
    if shape is not None:
        return {"lambda": _CALLABLE, "list": "[]", "dict": "{}", "iter": "iter([])"}[shape], \
            f"the callers pass a {shape}"
    made = harness_reads.dataclass_of(ann, fn)
    if made is not None:
        return use_of(name, fn, trace, made=made), \
            f"its dataclass ({made.name}): the fields read by it and its callees by their use"
    return _by_use(name, trace, fn)


_QUEUES = frozenset(("deque", "Deque", "Queue", "SimpleQueue"))


def _numpy(ann: str, name: str, fn: Function) -> str | None:
    """A host array where the annotation says NumPy (``np.ndarray``, ``npt.NDArray[np.int32]``):
    its dtype where stated, else int32 (a mask or an index, the common host arrays)."""
    if not re.match(r"(np|numpy|npt|numpy\.typing)\.(ndarray|NDArray)\b|NDArray\b", ann):
        return None
    dtype = re.search(r"\b(?:np|numpy)\.(u?int\d+|float\d+|bool_)\b", ann)
    ndim = _ndim(name, fn.text)
    shape = f"(n, {', '.join(['4'] * (ndim - 1))})" if ndim > 1 else "n"
    return f"np.zeros({shape}, dtype=np.{dtype.group(1) if dtype else 'int32'})"


def int_by_name(name: str) -> str:
    """The int a harness gives ``name`` (an argument or an attribute) by its name."""
    return _int(name)


def _int(name: str) -> str:
    """An int by its name: a rank or an offset is 0, a size or capacity is large
    (a slot must hold what is written), anything else the example's size."""
    leaf = name.rsplit(".", 1)[-1].lower()
    if re.search(r"rank|^src$|^dst$|root|offset|start|begin|^idx|index|(^|_)id$", leaf):
        return "0"
    if re.search(r"size|capacity|bytes|limit|max", leaf):
        return "1 << 20"
    if re.search(r"len$|length", leaf):  # holds any example's n tokens
        return "64"
    return "n"


def _unwrap(ann: str) -> str:
    m = re.fullmatch(r"(?:typing\.)?Optional\[(.*)\]", ann)
    if m:
        return m.group(1)
    parts = [x.strip() for x in ann.split("|")]
    rest = [x for x in parts if x != "None"]
    return rest[0] if len(rest) == 1 else ann


def _common_literal(passed: list[ast.expr]) -> str | None:
    texts = {ast.unparse(x) for x in passed if isinstance(x, ast.Constant)}
    if passed and len(texts) == 1 and all(isinstance(x, ast.Constant) for x in passed):
        return texts.pop()
    return None


def _passed_shape(passed: list[ast.expr]) -> str | None:
    for x in passed:
        if isinstance(x, ast.Lambda):
            return "lambda"
        if isinstance(x, (ast.List, ast.ListComp, ast.Tuple)):
            return "list"
        if isinstance(x, (ast.Dict, ast.DictComp)):
            return "dict"
        if isinstance(x, (ast.GeneratorExp,)) or (isinstance(x, ast.Call) and getattr(
                x.func, "id", "") in ("iter", "zip", "enumerate", "map")):
            return "iter"
    return None


def _annotated(ann: str, tensor: str = "None") -> str | None:
    """A value of the annotated type: scalars, callables, iterators and containers,
    with tensors inside where the annotation says so (an ``Iterator[tuple[str,
    Tensor]]`` of parameters gets two named tensors)."""
    if not ann:
        return None
    ann = ann.replace("typing.", "").replace("collections.abc.", "")
    head, _, inner = ann.partition("[")
    inner = inner[:-1] if inner.endswith("]") else inner
    if head in _SCALARS and not inner:
        return _SCALARS[head]
    if head == "Callable":
        returns = inner.rsplit(",", 1)[-1].strip() if inner else ""
        return "_first_tensor" if re.match(r"(torch\.)?Tensor$", returns) else _CALLABLE
    if head in ("Iterator", "Iterable", "Generator", "list", "List", "Sequence"):
        item = _annotated(_args(inner)[0], tensor) if inner else None
        if item is None and inner and re.match(r"(torch\.)?Tensor$", _args(inner)[0]):
            item = tensor
        items = f"[{item}, {item}]" if item is not None else "[]"
        return f"iter({items})" if head in ("Iterator", "Generator") else items
    if head in ("tuple", "Tuple") and inner:
        parts = []
        for a in _args(inner):
            v = tensor if re.match(r"(torch\.)?Tensor$", a) else _annotated(a, tensor)
            parts.append("'x'" if a == "str" else v if v is not None else "None")
        return f"({', '.join(parts)},)"
    if head in ("Dict", "Mapping", "dict"):
        return "{}"
    return None


def annotated_container(ann: str, key: str, trace: Trace, fn: Function) -> str | None:
    """A list or tuple of items that its annotation names (``list[torch.Tensor]``,
    ``list[int]``), two of them; None for any other annotation or an empty one."""
    ann = _unwrap(ann)
    if not re.match(r"(typing\.)?(list|List|Sequence|tuple|Tuple)\[", ann):
        return None
    value = _annotated(ann, _tensor(key, trace, fn))
    return value if value not in (None, "[]", "()") else None


def _args(inner: str) -> list[str]:
    """The top-level arguments of a subscript's text: ``str, tuple[int, int]``."""
    out, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch in "[(" and 1 or 0
        depth -= ch in "])" and 1 or 0
        cur += ch
    return [*out, cur.strip()] if cur.strip() else out


def _ndim(key: str, text: str) -> int:
    """How many dimensions the function's use of ``key`` needs: the names its shape is
    unpacked into (``rows, _, hidden = x.shape``), else 2 where it reads a second
    dimension, else 1."""
    leaf = re.escape(key)
    unpacked = re.search(rf"^\s*\(?((?:\w+\s*,\s*)+\w+)\)?\s*=\s*{leaf}\.shape\s*$", text,
                         re.M)
    if unpacked:
        return len(unpacked.group(1).split(","))
    stated = re.search(rf"len\(\s*{leaf}\.shape\s*\)\s*==\s*(\d)|\b{leaf}\.(?:dim\(\)|ndim)"
                       rf"\s*==\s*(\d)", text)  # ``assert len(w.shape) == 3``
    if stated:
        return int(stated.group(1) or stated.group(2))
    if re.search(rf"\b{leaf}(\.shape\[1\]|\.size\(1\)|\[:, |\.stride\(1\)|\.shape\[-1\])",
                 text):
        return 2
    return 1


def _tensor(key: str, trace: Trace, fn: Function, scalar: str = "n", dtype: str = "") -> str:
    """A tensor for ``key``; ``dtype``: the one the package makes it with, where stated
    (a byte pool, ``torch.uint8``, holds any slot's bytes: 1 MiB)."""
    if dtype:
        size = "1 << 20" if dtype == "torch.uint8" else scalar
        place = "pin_memory=True" if key in trace.pinned else "" if key in trace.host else \
            "device=DEVICE"
        return f"torch.zeros({size}, dtype={dtype}{', ' + place if place else ''})"
    ndim = _ndim(key, fn.text)
    shape = f"({scalar}, {', '.join(['4'] * (ndim - 1))})" if ndim > 1 else scalar
    if _LENGTHS.search(key.rsplit(".", 1)[-1]) and ndim == 1:  # one token per request
        return f"torch.ones({scalar}, device=DEVICE, dtype=torch.int64)"
    if key in trace.pinned:
        return f"torch.zeros({shape}, pin_memory=True)"
    if key in trace.host:
        return f"torch.zeros({shape})"
    if INDEXISH.search(key.rsplit(".", 1)[-1]) and ndim == 1:
        return f"torch.randperm({scalar}, device=DEVICE)"
    if ndim == 1:
        return f"torch.arange({scalar}, device=DEVICE, dtype=torch.float32)"
    return f"torch.arange({scalar} * {4 ** (ndim - 1)}, device=DEVICE, " \
           f"dtype=torch.float32).view({shape})"


def _aliases(key: str, scopes: Iterable[ast.AST]) -> set[str]:
    """``key`` and the locals that hold it: ``attn = self.attn`` then ``streams =
    attn.aux_stream_list`` make ``streams`` an alias of ``self.attn.aux_stream_list``."""
    pairs = []
    for scope in scopes:
        for n in ast.walk(scope):
            if not isinstance(n, ast.Assign) or len(n.targets) != 1:
                continue
            t, v = n.targets[0], n.value
            if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(
                    v.elts):  # ``indexer, compressor = attn.indexer, attn.compressor``
                pairs += [(_text(a), _text(b)) for a, b in zip(t.elts, v.elts)]
            elif isinstance(t, ast.Name):
                pairs += [(t.id, _text(x)) for x in (
                    [v.body, v.orelse] if isinstance(v, ast.IfExp) else [v])]
    same = {key}
    for _ in range(3):
        for target, value in pairs:
            for known in list(same):
                if value == known:
                    same.add(target)
                elif known.startswith(value + "."):
                    same.add(target + known[len(value):])
    return same


_MAPPING_USES = frozenset(("get", "items", "keys", "values", "setdefault"))
_STREAM_USES = frozenset(("wait_event", "wait_stream", "synchronize", "query"))
_EVENT_USES = frozenset(("record", "synchronize", "wait", "query", "elapsed_time"))


def indexed_items(key: str, trace: Trace, fn: Function, scopes: tuple[ast.AST, ...]) -> str | None:
    """A list that the class fills later and indexes (``self.done[slot].record()``): four
    items of the kind their use says (events, tensors); None where it is not indexed."""
    uses = {n.attr for scope in (fn.node, *scopes) for n in ast.walk(scope)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Subscript)
            and _text(n.value.value) in _aliases(key, (fn.node, *scopes))}
    if uses and uses <= _EVENT_USES:
        return "[_recorded_event() for _ in range(4)]"
    if uses and uses <= _TENSOR_USES:
        return f"[{_tensor(key, trace, fn)} for _ in range(4)]"
    return None


def _unpacked_into(key: str, scopes: Iterable[ast.AST]) -> list[str]:
    """The names ``key`` is unpacked into somewhere (``a, b = self._events``); []."""
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Tuple) and _text(node.value) == key:
                return [_text(t) for t in node.targets[0].elts]
    return []


def attribute_value(key: str, trace: Trace, fn: Function, depth: int = 0,
                    scopes: tuple[ast.AST, ...] = (), dtype: str = "") -> str:
    """What ``self.x`` (or ``param.x``) is set to: the scan's kind of it, else by its
    use in ``fn`` and ``scopes`` (the other methods of its class). Where it is
    unpacked, a tuple of as many, each of that kind or by its own name's use."""
    tied = harness_state.fixed(key)
    if tied is not None:
        return tied
    parts = _unpacked_into(key, (fn.node, *scopes)) if depth < 2 else []
    if parts:
        kind = {**dict.fromkeys(trace.streams, SIDE), **dict.fromkeys(
            trace.events, "_recorded_event()")}.get(key)
        items = [kind or ("None" if p == "_" else attribute_value(
            p, trace, fn, depth + 1, scopes)) for p in parts]
        return f"({', '.join(items)},)"
    same = _aliases(key, (fn.node, *scopes))
    indexed = any(isinstance(n, ast.Subscript) and _text(n.value) in same
                  for scope in (fn.node, *scopes) for n in ast.walk(scope))
    if key in trace.streams and not re.fullmatch(r"_*(\w+_)?device", key.rsplit(".", 1)[-1]):
        return f"[{SIDE} for _ in range(4)]" if indexed else SIDE
    if key in trace.events:
        return "[_recorded_event() for _ in range(4)]" if indexed else "_recorded_event()"
    if key in trace.tensors or key in trace.pinned or key in trace.host:
        return _tensor(key, trace, fn, dtype=dtype)
    return use_of(key, fn, trace, depth, scopes)


def _by_use(name: str, trace: Trace, fn: Function) -> tuple[str, str]:
    value = use_of(name, fn, trace)
    return value, "how the function uses it" if value != "_Object()" else \
        "an object (the function's use says no more)"


# What only a tensor has: a use of one of these on a value makes it a tensor.
_TENSOR_USES = frozenset((
    "to", "contiguous", "shape", "numel", "unsqueeze", "squeeze", "view", "reshape",
    "item", "sum", "dim", "stride", "copy_", "fill_", "zero_", "index_select",
    "index_fill_", "narrow", "split", "flatten", "cumsum", "data_ptr", "element_size",
    "nbytes", "is_cuda", "record_stream", "expand", "permute", "tolist", "long", "int",
    "float", "cpu", "cuda", "clone", "untyped_storage", "device", "dtype", "is_contiguous",
    "as_strided"))
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div, ast.Mod, ast.Pow,
          ast.LShift, ast.RShift)


def _operands(node: ast.expr) -> Iterable[ast.expr]:
    """``node`` and what it computes from without a call or an index: the values a
    method of ``node`` is applied to."""
    yield node
    if isinstance(node, ast.BinOp):  # ``(x - 1).to(...)``: x is the tensor; not ``a * b``
        if isinstance(node.right, ast.Constant):
            yield from _operands(node.left)
        elif isinstance(node.left, ast.Constant):
            yield from _operands(node.right)
    elif isinstance(node, ast.UnaryOp):
        yield from _operands(node.operand)


def kind_of_use(names: set[str], scopes: Iterable[ast.AST]) -> str | None:
    """What the uses of ``names`` say a value is: 'tensor' (a tensor's method or
    attribute is used on it, alone or in arithmetic), 'int' (arithmetic, an
    order comparison, ``range()``, an index or slice bound), 'dtype' or 'device'
    (passed as a tensor factory's ``dtype=``/``device=``); None where none says."""
    kinds: set[str] = set()
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and node.attr in _TENSOR_USES and any(
                    _text(x) in names for x in _operands(node.value)):
                kinds.add("tensor")
            elif isinstance(node, ast.keyword) and node.arg in ("dtype", "device") and \
                    _text(node.value) in names:
                kinds.add(node.arg)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH) and (
                    _text(node.left) in names or _text(node.right) in names):
                kinds.add("int")
            elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                    node.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE)) and _text(
                    node.comparators[0] if isinstance(node.ops[0], (ast.Gt, ast.GtE))
                    else node.left) in names:
                kinds.add("bound")  # ``len(x) > self.entries``: a capacity
            elif isinstance(node, ast.Compare) and not any(
                    isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn, ast.Eq, ast.NotEq))
                    for op in node.ops) and any(_text(x) in names for x in
                                               [node.left, *node.comparators]):
                kinds.add("int")
            elif isinstance(node, ast.Call) and _text(node.func) == "range" and any(
                    _text(a) in names for a in node.args):
                kinds.add("int")
            elif isinstance(node, ast.Slice) and any(
                    x is not None and _text(x) in names for x in (node.lower, node.upper)):
                kinds.add("int")
            elif isinstance(node, ast.Call) and _factory(node) and any(
                    _text(x) in names for a in node.args for x in (
                        a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a])):
                kinds.add("int")  # a size
            elif isinstance(node, ast.Subscript) and _text(node.value) in names:
                kinds.add("sequence")
            elif isinstance(node, ast.Subscript) and _text(node.slice) in names:
                kinds.add("index")  # ``done[slot]``: the first slot
    if "bound" in kinds:
        kinds.discard("bound")
        kinds.add("bound" if kinds <= {"int", "bound"} else "int")
    for kind in ("tensor", "dtype", "device", "index", "bound", "int", "sequence"):
        if kind in kinds:
            return kind
    return None


# Per-request lengths (``seq_lens``, ``extend_seq_lens_cpu``): one each, so that their
# sum is the batch's row count, as every package's layout assumes.
_LENGTHS = re.compile(r"lens(_cpu)?$|lengths(_cpu)?$")
# Names of numbers, not tensors, where a parameter is only used in arithmetic.
_INTISH = re.compile(r"(^|_)(n|num|count|size|len|length|rank|idx|index|offset|id|step|"
                     r"start|end|stride|width|height|dim|bytes|capacity)s?($|_)|^(i|j)$")
_FACTORIES = frozenset(("empty", "zeros", "ones", "full", "rand", "randn", "randint",
                        "arange", "view", "reshape", "expand", "new_empty", "new_zeros",
                        "new_full", "narrow", "split", "repeat"))


def _factory(call: ast.Call) -> bool:
    """A tensor factory or shape method: its positional integers are sizes."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(
        call.func, "id", "")
    return name in _FACTORIES and (not isinstance(call.func, ast.Attribute) or _text(
        call.func.value) in ("torch",) or name not in ("empty", "zeros", "ones", "full",
                                                        "rand", "randn", "randint", "arange"))


def use_of(key: str, fn: Function, trace: Trace | None = None, depth: int = 0,
           scopes: tuple[ast.AST, ...] = (), made: harness_reads.Dataclass | None = None) -> str:
    """A value for ``key`` from how ``fn`` (and ``scopes``: its class's other methods)
    use it (or a local it is copied to): a tensor, a number, a dtype or a device
    by ``kind_of_use``; called, iterated, or an object with the attributes it
    and the callees it is passed to read (``made``: the package's dataclass)."""
    where = (fn.node, *scopes)
    names = _aliases(key, (fn.node,))
    calls, iters, attrs = False, False, set()
    for node in (n for scope in where for n in ast.walk(scope)):
        if isinstance(node, ast.Call) and _text(node.func) in names:
            calls = True
        if isinstance(node, (ast.For, ast.comprehension)) and (_text(node.iter) in names or (
                isinstance(node.iter, ast.Call) and _text(node.iter.func) in (
                    "enumerate", "zip", "list", "sorted", "reversed", "iter") and
                any(_text(a) in names for a in node.iter.args))):
            iters = True
        if isinstance(node, ast.Attribute) and _text(node.value) in names:
            attrs.add(node.attr)
    further = harness_reads.callee_fields(names, fn, trace, depth, where, attrs)
    further |= harness_reads.named_attributes(names, fn, trace, depth, scopes)
    geometry = harness_reads.view_geometry(names, where) or harness_reads.attribute_name(
        names, fn)
    if geometry is not None:
        return geometry
    if calls:  # a collaborator's method: what it gives back by the package's use of it
        shape = harness_results.result_shape(names, where)
        return _gives(shape) if shape is not None else _CALLABLE
    if iters:
        return harness_reads.loop_items(names, fn, trace, scopes) or harness_reads.indexed_items(
            names, fn, trace, scopes) or "[]"
    if made is not None and trace is not None:
        return harness_reads.construct(made, _fields(key, names, attrs, fn, trace, depth, scopes)
                                       | further, key, trace, fn, depth)
    if not attrs and further and set(further) <= _TENSOR_USES and trace is not None:
        return _tensor(key, trace, fn)  # only its callees read it, as a tensor
    if attrs and attrs <= _MAPPING_USES and not any(  # ``.get(k, default)``: a dict's
            isinstance(n, ast.Call) and not n.args and _text(n.func) in {  # (not a queue's)
                f"{name}.get" for name in names} for scope in where for n in ast.walk(scope)):
        return "{}"
    if attrs and attrs <= _STREAM_USES and STREAMISH.search(key.rsplit(".", 1)[-1]):
        return SIDE
    kind = kind_of_use(names, where) if not (attrs - _TENSOR_USES) else None
    leaf = key.rsplit(".", 1)[-1]
    if kind == "dtype" or (kind is None and not attrs and re.search(r"dtype$", leaf)):
        return "torch.float32"
    if kind == "device" or (kind is None and not attrs and re.fullmatch(r"_*(\w+_)?device",
                                                                          leaf)):
        return "DEVICE"
    if re.fullmatch(r"_*(\w+_)?device", leaf) and attrs <= {"index", "type"}:
        return "torch.device(DEVICE, 0)"  # its index or type read: a device, not a name
    if kind == "tensor" and trace is not None:
        return _tensor(key, trace, fn)
    if kind == "index":
        return "0"
    if kind == "bound":  # an upper bound holds any example's n items
        return _int(key) if _int(key) != "n" else "64"
    if kind == "int" and "." not in key and trace is not None and not _INTISH.search(leaf):
        return _tensor(key, trace, fn)  # a bare parameter in arithmetic: a tensor as often
    if kind == "int":
        return _int(key)
    if kind == "sequence":  # by its name: events, streams, lengths, else numbers
        if EVENTISH.search(leaf):
            return "[_recorded_event() for _ in range(4)]"
        if STREAMISH.search(leaf):
            return f"[{SIDE} for _ in range(4)]"
        return "[1] * n" if _LENGTHS.search(leaf) else f"[{_int(key)}, {_int(key)}]"
    if not attrs and trace is not None and _tensor_dict(names, fn, where):
        return f"{{'x': {_tensor(key, trace, fn)}}}"
    if not attrs and (_passed_as(names, fn, where, _EVENT) or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
            n.func.attr == "wait_event" and any(_text(a) in names for a in n.args)
            for scope in where for n in ast.walk(scope))):  # waited for: an event
        return "_recorded_event()"
    if not attrs and any(  # what a stream waits for: a stream
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
            n.func.attr == "wait_stream" and any(_text(a) in names for a in n.args)
            for scope in where for n in ast.walk(scope)):
        return SIDE
    if attrs and attrs <= _DEVICE_MODULE_USES and attrs & {"current_stream", "Stream"}:
        return "torch.cuda"  # ``self.device_module``: the (simulated) device's module
    if (attrs or further) and trace is not None and depth < 2:
        fields = _fields(key, names, attrs, fn, trace, depth, scopes) | further
        return f"_Object({', '.join(f'{a}={v}' for a, v in fields.items())})"
    return "_Object()"


_TENSOR_DICT = re.compile(r"(typing\.)?(Dict|dict|Mapping)\[str,\s*(torch\.)?Tensor\]$")


def _gives(shape: str) -> str:
    """The harness's stand-in for a method whose result is used as ``shape`` says."""
    return "_gives('context')" if shape == "context" else f"_gives({shape})"


def _tensor_dict(names: set[str], fn: Function, where: tuple[ast.AST, ...]) -> bool:
    """Whether the value is a dict of tensors: copied with ``dict(...)``, or passed to
    a parameter of the package annotated ``Dict[str, torch.Tensor]``."""
    if any(isinstance(n, ast.Call) and _text(n.func) == "dict" and len(n.args) == 1 and
           _text(n.args[0]) in names for scope in where for n in ast.walk(scope)):
        return True
    return _passed_as(names, fn, where, _TENSOR_DICT)


_EVENT = re.compile(r"((torch\.)?(cuda\.)?)Event$")
_DEVICE_MODULE_USES = frozenset(("Event", "Stream", "current_stream", "stream", "synchronize",
                                 "set_stream", "device", "current_device", "set_device"))


def _passed_as(names: set[str], fn: Function, where: tuple[ast.AST, ...],
               annotation: re.Pattern[str]) -> bool:
    """Whether the value is passed to a parameter of the package annotated so."""
    for callee, param in harness_reads.passed_to(names, fn, where):
        p = next((a for a in callee.params() if a.arg == param), None)
        if p is not None and p.annotation is not None and annotation.match(
                _unwrap(ast.unparse(p.annotation))):
            return True
    return False


def _fields(key: str, names: set[str], attrs: set[str], fn: Function, trace: Trace,
            depth: int, scopes: tuple[ast.AST, ...]) -> dict[str, str]:
    """A value for each attribute ``fn`` reads of ``key`` (known by ``names``)."""
    fields = {}
    for a in sorted(attrs):
        if any(_is_method_call(fn, name, a) for name in names):
            chained = sorted({n.attr for n in ast.walk(fn.node) if isinstance(
                n, ast.Attribute) and isinstance(n.value, ast.Call) and _text(
                n.value.func) in {f"{name}.{a}" for name in names}})
            unpacked = _unpacked_from(fn, {f"{name}.{a}" for name in names})
            if chained:  # ``ring.submit().wait(...)``: a handle whose methods give results
                handle = ", ".join(f"{c}=lambda *args, **kwargs: []" for c in chained)
                fields[a] = f"lambda *args, **kwargs: _Object({handle})"
            elif unpacked and depth < 2:  # ``event, out = queue.popleft()``: each by its use
                values = ", ".join(use_of(u, fn, trace, depth + 1, scopes) for u in unpacked)
                fields[a] = f"lambda *args, **kwargs: ({values},)"
            elif (shape := harness_results.result_shape(
                    {f"{name}.{a}" for name in names}, (fn.node, *scopes))) is not None:
                fields[a] = _gives(shape)  # a list to extend, a dict to look up
            else:
                fields[a] = "_first_tensor"  # what it is given, as a layer returns
            continue
        sub = next((f"{name}.{a}" for name in names if f"{name}.{a}" in (
            trace.tensors | trace.streams | trace.events | trace.host | trace.pinned)),
            f"{key}.{a}")
        fields[a] = attribute_value(sub, trace, fn, depth + 1, scopes)
    return fields


def annotated_value(ann: str, key: str, trace: Trace, fn: Function) -> str | None:
    """A value of the type ``ann`` states (a number by ``key``'s name), or None."""
    value = _annotated(_unwrap(ann), _tensor(key, trace, fn))
    return _int(key) if value == "n" else value


def tensor_for(key: str, trace: Trace, fn: Function) -> str:
    """A tensor for ``key``, shaped by ``fn``'s use of it."""
    return _tensor(key, trace, fn)


def _unpacked_from(fn: Function, methods: set[str]) -> list[str]:
    """The names ``fn`` unpacks a call of one of ``methods`` into (``a, b = q.pop()``)."""
    for n in ast.walk(fn.node):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                n.targets[0], ast.Tuple) and isinstance(n.value, ast.Call) and _text(
                n.value.func) in methods and all(isinstance(e, ast.Name)
                                                 for e in n.targets[0].elts):
            return [e.id for e in n.targets[0].elts if isinstance(e, ast.Name)]
    return []


def _is_method_call(fn: Function, key: str, attr: str) -> bool:
    return any(isinstance(n, ast.Call) and _text(n.func) == f"{key}.{attr}"
               for n in ast.walk(fn.node))


def stream_param_passed_side(values: dict[str, str]) -> list[str]:
    """The stream parameters given a fresh side stream (said in the harness)."""
    return [k for k, v in values.items() if v == SIDE]
