"""The static pass of ``fuzz scan``: each function's stream code as a list of ops.

A function is walked once, statement by statement in source order, with the
stack of stream contexts it is in. What it does to tensors, streams and events
becomes an ``Op`` (an allocation on the current stream, a use, a
``record_stream``, a wait, an event record, a host sync, a non-blocking copy,
a free...), so that ``fuzz.scan.hazards`` can judge orderings by position in
one flat list. Loop bodies are walked twice, so that what one iteration leaves
pending meets the next one. Branches are walked in turn; an op under an ``if``
carries the branches it is under (``guards``), so a wait that only some paths
take can be told from one they all take.

Nothing is imported or run: names are matched by shape (``x.wait_stream(y)``,
``with torch.cuda.stream(s)`` or ``with self.device_module.stream(s)``), and
what is a tensor, a stream or an event is read from how the name is made and
used (``Trace.tensors``, ``streams``, ``events``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from enum import Enum

CURRENT = "<current>"
"""The stream current when the function is entered: its caller's."""
THREAD = "<thread>"
"""The current stream of a function that a thread runs (not its submitter's)."""
SUBMITTER = "<submitter>"
"""Where a thread's inputs were made: the stream of the code that handed them over."""
ANY = "<any>"
"""A stream or event a callee orders without naming it to the caller."""


class K(str, Enum):
    ALLOC = "alloc"          # key made on stream (flag: pinned, host)
    USE = "use"              # key read (or written, .write) by work on stream
    RECORD = "record_stream"
    WAIT = "wait_stream"     # stream waits for other
    WAIT_EVENT = "wait_event"
    EVENT_RECORD = "event_record"
    HOST_SYNC = "host_sync"  # key: the stream or event synced ('' for the device)
    HOST_READ = "host_read"
    HOST_WRITE = "host_write"
    NB_COPY = "nb_copy"      # key <- other without blocking (flag: d2h, h2d, ?)
    FREE = "free"
    KEEP = "keep"            # key outlives the call (stored, returned)
    COLLECTIVE = "collective"  # key handed to an async collective; other: its work
    WORK_WAIT = "work_wait"


@dataclass(frozen=True)
class Op:
    kind: K
    line: int
    stream: str = ""
    key: str = ""
    other: str = ""
    write: bool = False
    flag: str = ""
    guards: tuple[int, ...] = ()


@dataclass
class Trace:
    """One function's ops and what its names were found to be."""

    file: str
    qualname: str
    line: int
    cls: str | None
    params: tuple[str, ...]
    thread: bool
    ops: list[Op] = field(default_factory=list)
    tensors: set[str] = field(default_factory=set)
    host: set[str] = field(default_factory=set)
    pinned: set[str] = field(default_factory=set)
    persistent: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    timing_events: set[str] = field(default_factory=set)
    calls: list[tuple[str, int, int, frozenset[str]]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # made-here key -> how the code names it
    entered: set[str] = field(default_factory=set)  # streams made current here (contexts)

    maybe: set[str] = field(default_factory=set)  # made here, tensors only if used as ones
    recorded: set[str] = field(default_factory=set)  # x.record() seen
    waited: set[str] = field(default_factory=set)  # x.wait() / x.query() seen

    def name(self, key: str) -> str:
        root, dot, rest = key.partition(".")
        return self.names.get(key) or (self.names.get(root, root) + dot + rest)

    @property
    def base(self) -> str:
        return THREAD if self.thread else CURRENT

    @property
    def producer(self) -> str:
        """Where tensors the function did not make were made."""
        return SUBMITTER if self.thread else CURRENT

    def uses_streams(self) -> bool:
        return any(o.kind in _STREAM_KINDS or (o.kind in (K.USE, K.ALLOC)
                                                and o.stream != self.base) for o in self.ops)


_STREAM_KINDS = {K.RECORD, K.WAIT, K.WAIT_EVENT, K.EVENT_RECORD, K.NB_COPY, K.COLLECTIVE,
                 K.WORK_WAIT}

# Method names, by what they do to their receiver.
_META = {"size", "dim", "numel", "data_ptr", "stride", "element_size", "is_pinned",
         "is_contiguous", "get_device", "nelement", "storage_offset", "type", "is_shared",
         "untyped_storage_nbytes", "nbytes", "__len__"}
_META_ATTRS = {"shape", "dtype", "device", "is_cuda", "ndim", "requires_grad", "layout",
               "is_cpu", "itemsize", "names", "grad_fn"}
_VIEWS = {"view", "view_as", "reshape", "narrow", "flatten", "unflatten", "unsqueeze",
          "squeeze", "permute", "transpose", "t", "expand", "expand_as", "as_strided", "split",
          "chunk", "unbind", "select", "diagonal", "detach", "contiguous", "numpy", "data",
          "untyped_storage", "movedim", "swapaxes", "tensor_split", "split_with_sizes"}
_HOST_READS = {"tolist", "item", "__int__", "__float__", "__bool__"}
_HOST_BUILTINS = {"int", "float", "bool", "list", "tuple", "sum", "max", "min", "sorted",
                  "enumerate", "zip", "any", "all", "set", "dict"}
_TENSOR_METHODS = _VIEWS | _HOST_READS | {
    "copy_", "to", "cuda", "cpu", "clone", "index_select", "gather", "scatter_", "index_copy_",
    "index_fill_", "fill_", "zero_", "record_stream", "pin_memory", "masked_fill_", "add_",
    "mul_", "div_", "sub_", "resize_", "data_ptr", "numel", "is_pinned", "index_put_",
    "masked_scatter_", "float", "half", "bfloat16", "long", "repeat", "cumsum", "argmax",
    "nonzero", "topk", "index_add_", "scatter_add_", "copy", "element_size", "new_empty",
    "new_zeros", "new_full", "new_tensor", "bool", "masked_select", "repeat_interleave",
    "sum", "flatten", "clamp_", "uniform_", "normal_", "exponential_"}
_NOT_TENSOR_TORCH = re.compile(
    r"^torch\.(cuda|distributed|device|dtype|Size|get_|set_|is_|no_grad|inference_mode|"
    r"enable_grad|manual_seed|compile|jit|library|ops\.|_dynamo|autograd|backends|nn\.Module|"
    r"Stream|Event|Generator|iinfo|finfo|float|int|bool|long|half|bfloat16|uint8|accelerator|"
    r"xpu|npu|mps|_C|fx|testing|utils|profiler|version|__)")
_HOSTISH = re.compile(r"(^|[._])(cpu|host|pinned|pin|np|numpy)($|[._])|_cpu$|_host$|_np$",
                      re.I)
_STREAMISH = re.compile(r"stream", re.I)
_STREAM_CONTEXT = re.compile(r"stream_?(context|ctx)$", re.I)
"""A helper of the package's own that enters the stream it is given."""
_INDEXISH = re.compile(r"indices|idx_mapping|mapping|mask|_ids$|^ids$|perm|idxs$|index_tensor",
                       re.I)
"""Index names that hold tensors (a bare ``idx`` is as often an int)."""
_EVENTISH = re.compile(r"event|fence", re.I)
_THREAD_SPAWNERS = {"Thread", "submit", "start_new_thread", "run_in_executor", "Process"}
_ASYNC_COLLECTIVE = {"isend", "irecv", "batch_isend_irecv"}
_SCALAR_ANN = re.compile(r"^(int|float|bool|str|bytes|None|list\[int\]|dict|set)", re.I)


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` as text, or None for anything that is not a name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _callee_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return ""


def _negated(test: ast.expr, call: ast.Call) -> bool:
    """Is ``call`` under a ``not`` in ``test``?"""
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and any(
                n is call for n in ast.walk(node.operand)):
            return True
    return False


def _inplace(method: str) -> bool:
    return method.endswith("_") and not method.endswith("__") and method != "record_stream"


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _is_cpu_device(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("cpu")
    if isinstance(node, ast.Call) and dotted(node.func) in ("torch.device",) and node.args:
        return _is_cpu_device(node.args[0])
    text = dotted(node) or ""
    return bool(_HOSTISH.search(text)) and "device" not in text.lower().replace("cpu_device", "")


@dataclass
class ClassFacts:
    """What a class's methods make its attributes (``self.x``) into."""

    tensors: set[str] = field(default_factory=set)
    pinned: set[str] = field(default_factory=set)
    host: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    alias: dict[str, str] = field(default_factory=dict)  # self.x_np -> self.x
    contexts: dict[str, str] = field(default_factory=dict)  # self.ctx -> the stream it enters


class Walker:
    """Walks one function body into a ``Trace``.

    ``callee`` answers what a same-package callee does to ordering (see
    ``fuzz.scan.package``): ``'wait'`` (it waits for another stream
    unconditionally), ``'sync'`` (the host waits), or record_stream of the
    call's arguments, by position.
    """

    def __init__(self, trace: Trace, facts: ClassFacts | None, module_facts: ClassFacts,
                 callee: object = None) -> None:
        self.t = trace
        self.facts = facts or ClassFacts()
        self.module = module_facts
        self.callee = callee
        self.stack = [trace.base]
        self.alias: dict[str, str] = {}
        self.guards: list[int] = []
        self.bound: set[str] = set()
        self.contexts = {**self.module.contexts, **self.facts.contexts}
        for k in self.facts.alias:
            self.alias[k] = self.facts.alias[k]
        t = self.t
        t.tensors |= self.facts.tensors | self.module.tensors
        t.pinned |= self.facts.pinned | self.module.pinned
        t.host |= self.facts.host | self.module.host | self.facts.pinned | self.module.pinned
        t.streams |= self.facts.streams | self.module.streams
        t.events |= self.facts.events | self.module.events

    # -- names ---------------------------------------------------------------

    def key(self, node: ast.AST) -> str | None:
        """The storage an expression names (a view names its base), or None."""
        while True:
            if isinstance(node, ast.Subscript):
                if self._is_gather(node):
                    return None
                node = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and (node.func.attr in _VIEWS or _inplace(node.func.attr))):
                node = node.func.value
            elif isinstance(node, ast.Attribute) and node.attr in ("data", "T", "mT"):
                node = node.value
            elif isinstance(node, ast.Starred):
                node = node.value
            else:
                break
        text = dotted(node)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        if text in self.alias:
            return self.alias[text]
        if head in self.alias:
            base = self.alias[head]
            return f"{base}.{rest}" if rest else base
        return text

    def _is_gather(self, node: ast.Subscript) -> bool:
        """``t[idx]`` with a tensor (or list) index makes a new tensor; slices are views."""
        base = dotted(node.value)
        if base and (_STREAMISH.search(base) or _EVENTISH.search(base)):
            return False
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for p in parts:
            if isinstance(p, (ast.Slice, ast.Constant)) or (
                    isinstance(p, ast.UnaryOp) and isinstance(p.operand, ast.Constant)):
                continue
            k = dotted(p)
            if k is not None and (self.alias.get(k, k) in self.t.tensors
                                  or _INDEXISH.search(k.rsplit(".", 1)[-1])):
                return True
            if isinstance(p, (ast.List, ast.Subscript)):
                return True
        return False

    def stream_of(self, node: ast.AST | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Call):
            name = _callee_name(node)
            if name in ("current_stream", "default_stream"):
                return self.stack[-1] if name == "current_stream" else self.t.base
            if name in ("Stream", "ExternalStream") or _STREAMISH.search(name):
                return None
            return None
        if isinstance(node, ast.IfExp):
            return self.stream_of(node.body) or self.stream_of(node.orelse)
        if isinstance(node, ast.BoolOp):
            return next((s for s in map(self.stream_of, node.values) if s), None)
        if isinstance(node, ast.Subscript):  # streams[i]: one of a set of streams
            base = self.key(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) \
                else None
            if base and _STREAMISH.search(base.rsplit(".", 1)[-1]):
                self.t.streams.add(base + "[]")
                return base + "[]"
            return None
        k = self.key(node)
        if k is None:
            return None
        if k in (CURRENT, THREAD, SUBMITTER) or k in self.t.streams:
            return k
        last = k.rsplit(".", 1)[-1]
        if _STREAMISH.search(last) and not last.endswith(("streams", "_pool")):
            self.t.streams.add(k)
            return k
        return None

    def event_of(self, node: ast.AST) -> str | None:
        k = self.key(node)
        if k is None:
            return None
        if k in self.t.events or _EVENTISH.search(k.rsplit(".", 1)[-1]):
            self.t.events.add(k)
            return k
        return None

    def _emit(self, kind: K, line: int, **kw: object) -> None:
        self.t.ops.append(Op(kind, line, guards=tuple(self.guards), **kw))  # type: ignore[arg-type]

    @property
    def cur(self) -> str:
        return self.stack[-1]

    # -- statements ----------------------------------------------------------

    def walk(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:  # noqa: C901 - one arm per statement kind
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(s, (ast.With, ast.AsyncWith)):
            self._with(s)
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            self._assign(s)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self.expr(s.value)
                self._keep(s.value, s.lineno)
        elif isinstance(s, ast.Delete):
            for tgt in s.targets:
                k = self.key(tgt) if not isinstance(tgt, ast.Subscript) else None
                if k:
                    self._emit(K.FREE, s.lineno, key=k)
        elif isinstance(s, ast.If):
            self.expr(s.test)
            self.guards.append(id(s))
            for node in ast.walk(s.test):  # `if ev.query():` the work before ev is done
                if isinstance(node, ast.Call) and _callee_name(node) == "query" and \
                        isinstance(node.func, ast.Attribute):
                    target = self.stream_of(node.func.value) or self.key(node.func.value)
                    if target and not _negated(s.test, node):
                        self._emit(K.HOST_SYNC, s.lineno, key=target)
            self.walk(s.body)
            self.guards[-1] = -id(s)
            self.walk(s.orelse)
            self.guards.pop()
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            if isinstance(s, ast.While):
                self.expr(s.test)
            else:
                self.expr(s.iter)
            items = s.iter.elts if isinstance(s, (ast.For, ast.AsyncFor)) and isinstance(
                s.iter, (ast.Tuple, ast.List)) and isinstance(s.target, ast.Name) and all(
                isinstance(e, (ast.Name, ast.Attribute)) for e in s.iter.elts) else None
            if items and not isinstance(s, ast.While):  # for t in (x, y): once for each
                for e in items:
                    self._bind(s.target, None, s.lineno)
                    self._bind_items(s.target, e)
                    self.walk(s.body)
            for _ in range(0 if items else 2):
                if not isinstance(s, ast.While):
                    self._bind(s.target, None, s.lineno)
                    self._bind_items(s.target, s.iter)
                self.walk(s.body)
            self.walk(s.orelse)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            self.walk(s.body)  # type: ignore[attr-defined]
            for h in s.handlers:  # type: ignore[attr-defined]
                self.guards.append(id(h))
                self.walk(h.body)
                self.guards.pop()
            self.walk(s.orelse)  # type: ignore[attr-defined]
            self.walk(s.finalbody)  # type: ignore[attr-defined]
        elif isinstance(s, ast.Expr):
            self.expr(s.value)
        elif isinstance(s, ast.Match):
            self.expr(s.subject)
            for case in s.cases:
                self.guards.append(id(case))
                self.walk(case.body)
                self.guards.pop()
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def _with(self, s: ast.With | ast.AsyncWith) -> None:
        pushed = 0
        for item in s.items:
            stream = self._context_stream(item.context_expr)
            if stream is not None:
                self.stack.append(stream)
                self.t.entered.add(stream)
                pushed += 1
            else:
                self.expr(item.context_expr)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, None, s.lineno)
        self.walk(s.body)
        del self.stack[len(self.stack) - pushed:]

    def _context_stream(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.IfExp):
            return self._context_stream(node.body) or self._context_stream(node.orelse)
        if isinstance(node, ast.Call):
            name = _callee_name(node)
            if (name in ("stream", "StreamContext", "use_stream", "cuda_stream") or
                    _STREAM_CONTEXT.search(name)) and node.args:
                s = self.stream_of(node.args[0])
                if s is None:
                    s = self.key(node.args[0])
                    if s is None:
                        return None
                    self.t.streams.add(s)
                return s
            return None
        k = self.key(node)
        if k is not None and k in self.t.streams:
            return k
        if k is not None and k in self.contexts:
            return self.contexts[k]
        return None

    def _assign(self, s: ast.Assign | ast.AnnAssign | ast.AugAssign) -> None:
        value = s.value
        if value is None:
            return
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        if isinstance(s, ast.AugAssign):
            self.expr(value)
            k = self.key(s.target)
            if k:
                self._emit(K.USE, s.lineno, stream=self.cur, key=k, write=True)
                self._host_write(k, s.lineno)
            return
        if isinstance(s, ast.AnnAssign) and "Tensor" in ast.unparse(s.annotation):
            for tgt in targets:
                k = self.key(tgt)
                if k:
                    self.t.tensors.add(k)
        made = self.expr(value)
        for tgt in targets:
            self._bind(tgt, value, s.lineno, made)

    def _bind(self, tgt: ast.expr, value: ast.expr | None, line: int,
              made: str | None = None) -> None:
        if isinstance(tgt, (ast.Tuple, ast.List)):
            split = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(
                tgt.elts)
            for i, t in enumerate(tgt.elts):
                v = value.elts[i] if split else None  # type: ignore[union-attr]
                m = self.expr(v) if v is not None else None
                if v is None and isinstance(value, ast.Call) and self.cur != self.t.base and \
                        isinstance(t, ast.Name):
                    m = self._fresh(t)  # unpacked from a call made on a side stream
                    self.t.maybe.add(m)
                self._bind(t, v, line, m)
            return
        if isinstance(tgt, ast.Starred):
            self._bind(tgt.value, None, line)
            return
        if isinstance(tgt, ast.Subscript):
            k = self.key(tgt.value)
            self.expr(tgt.slice)
            if k:
                self._emit(K.USE, line, stream=self.cur, key=k, write=True)
                self._host_write(k, line)
            if value is not None:
                self._keep(value, line)
            return
        name = dotted(tgt)
        if name is None:
            return
        if value is None:
            self.alias.pop(name, None)
            self._rebind(name, line)
            if made and "." not in name:
                self.alias[name] = made
                self.t.names[made] = name
            return
        vk = self.key(value) if made is None else None
        stream = self._stream_value(value)
        if stream is not None:
            self.t.streams.add(name)
            before = self.alias.get(name)
            if stream == self.t.base and self.guards and before not in (None, self.t.base) \
                    and before in self.t.streams:
                return  # `s = side` on one path, `s = current` on another: keep the side
            self.alias[name] = stream
            return
        ctx = self._context_stream(value) if isinstance(value, ast.Call) else None
        if ctx is not None:
            self.contexts[name] = ctx
            return
        if isinstance(value, ast.Call) and _callee_name(value) in ("Stream", "ExternalStream"):
            self.t.streams.add(name)
            self.alias.pop(name, None)
            return
        if isinstance(value, ast.Call) and _callee_name(value) in ("Event", "record_event"):
            self.t.events.add(name)
            self.alias.pop(name, None)
            if _true(_kw(value, "enable_timing")):
                self.t.timing_events.add(name)
            return
        if "." in name:  # self.x = v: v now outlives the call
            if vk:
                self._emit(K.KEEP, line, key=vk)
            if made:
                self._emit(K.KEEP, line, key=made)
            k = self.key(tgt) or name
            if k in self.t.tensors:
                self._emit(K.FREE, line, key=k)  # the reference it held is dropped
            self.alias.pop(name, None)
            if made:
                self.alias[name] = made
                if made.startswith("<tmp@"):
                    self.t.names[made] = name
                self.t.persistent.add(made)
            return
        self._rebind(name, line)
        if made is None and isinstance(value, ast.Call) and self.cur != self.t.base and \
                vk is None:
            made = self._fresh(value)  # what a call returns on a side stream is made there
            self.t.maybe.add(made)
        if made:
            self.alias[name] = made
            if made.startswith("<tmp@"):
                self.t.names[made] = name
        elif vk and vk != name:
            self.alias[name] = vk
            if vk in self.t.events:
                self.t.events.add(name)
        else:
            self.alias.pop(name, None)

    def _bind_items(self, target: ast.expr, it: ast.expr) -> None:
        """``for x in xs``: ``x`` stands for the storage of ``xs``'s items, which its
        owner holds (``zip`` and ``enumerate`` are looked through)."""
        if isinstance(it, ast.Call) and _callee_name(it) in ("zip", "enumerate", "reversed"):
            if _callee_name(it) == "enumerate" and isinstance(target, ast.Tuple) and len(
                    target.elts) == 2 and it.args:
                self._bind_items(target.elts[1], it.args[0])
            elif _callee_name(it) == "zip" and isinstance(target, ast.Tuple) and len(
                    target.elts) == len(it.args):
                for t, a in zip(target.elts, it.args):
                    self._bind_items(t, a)
            elif _callee_name(it) == "reversed" and it.args:
                self._bind_items(target, it.args[0])
            return
        name = dotted(target)
        k = self.key(it) if isinstance(it, (ast.Name, ast.Attribute)) else None
        if name and k and k not in self.t.streams and k not in self.t.events:
            self.alias[name] = k
            if name in self.t.tensors:
                self.t.tensors.add(k)

    def _stream_value(self, value: ast.expr) -> str | None:
        if isinstance(value, ast.Call) and _callee_name(value) in ("current_stream",
                                                                      "default_stream"):
            return self.stream_of(value)
        if isinstance(value, (ast.Name, ast.Attribute, ast.IfExp)):
            return self.stream_of(value)
        return None

    def _rebind(self, name: str, line: int) -> None:
        """A local name bound again: the storage it held is dropped here."""
        old = self.alias.get(name, name)
        if name in self.bound and old.startswith("<tmp@") and old not in self.t.persistent:
            self._emit(K.FREE, line, key=old)
        self.bound.add(name)

    def _keep(self, value: ast.expr, line: int) -> None:
        """What ``value`` hands on (returned or stored): itself, the items of a
        literal, the arguments of a constructor call (``Output(a, b)``)."""
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            parts: list[ast.expr] = list(value.elts)
        elif isinstance(value, ast.Dict):
            parts = [v for v in value.values if v is not None]
        elif isinstance(value, ast.Call) and _callee_name(value)[:1].isupper():
            parts = [*value.args, *(k.value for k in value.keywords)]
        else:
            parts = [value]
        for node in parts:
            if isinstance(node, (ast.Tuple, ast.List, ast.Dict, ast.Call)) and node is not value:
                self._keep(node, line)
                continue
            k = self.key(node)
            if k:
                self._emit(K.KEEP, line, key=k)

    def _host_write(self, k: str, line: int) -> None:
        if k in self.t.host or _HOSTISH.search(k):
            self._emit(K.HOST_WRITE, line, key=k)

    # -- expressions ---------------------------------------------------------

    def expr(self, node: ast.expr | None) -> str | None:
        """Record what evaluating ``node`` does; the key of a tensor it makes, if any."""
        if node is None:
            return None
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            # a container only holds references: no stream touches its items here
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr) and not isinstance(
                        child, (ast.Name, ast.Attribute)):
                    self.expr(child)
            return None
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            if not isinstance(node, ast.Lambda):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.expr):
                        self.expr(child)
                    elif isinstance(child, ast.comprehension):
                        self.expr(child.iter)
            return None
        if isinstance(node, ast.Attribute) and node.attr in _META_ATTRS:
            return None
        if isinstance(node, (ast.Name, ast.Attribute)):
            k = self.key(node)
            if k and k not in self.t.streams and k not in self.t.events:
                self._emit(K.USE, node.lineno, stream=self.cur, key=k)
            return None
        if isinstance(node, ast.Subscript):
            self.expr(node.slice)
            base = self.key(node.value)
            if self._is_gather(node):
                self.expr(node.value)
                made = self._fresh(node)
                self.t.tensors.add(made)
                if base:
                    self.t.tensors.add(base)
                for part in ast.walk(node.slice):
                    k = self.key(part) if isinstance(part, (ast.Name, ast.Attribute)) else None
                    if k and _INDEXISH.search(k.rsplit(".", 1)[-1]):
                        self.t.tensors.add(k)
                return made
            if base:
                self._emit(K.USE, node.lineno, stream=self.cur, key=base)
                if base in self.t.host and isinstance(node.ctx, ast.Load):
                    self._emit(K.HOST_READ, node.lineno, key=base, flag="index")
            else:
                self.expr(node.value)
            return None
        if isinstance(node, ast.BinOp):
            a, b = self.expr(node.left), self.expr(node.right)
            ka, kb = self.key(node.left), self.key(node.right)
            if a or b or (ka in self.t.tensors) or (kb in self.t.tensors):
                made = self._fresh(node)
                self.t.tensors.add(made)
                return made
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
        return None

    def _fresh(self, node: ast.AST) -> str:
        k = f"<tmp@{node.lineno}:{node.col_offset}:{node.end_col_offset}>"  # type: ignore[attr-defined]
        text = ast.unparse(node)
        self.t.names.setdefault(k, text if len(text) <= 40 else text[:37] + "...")
        self._emit(K.ALLOC, node.lineno, stream=self.cur, key=k)  # type: ignore[attr-defined]
        return k

    def _call(self, c: ast.Call) -> str | None:  # noqa: C901 - one arm per call shape
        name = _callee_name(c)
        line = c.lineno
        recv = c.func.value if isinstance(c.func, ast.Attribute) else None
        rk = self.key(recv) if recv is not None else None
        full = dotted(c.func) or ""
        if name == "record_stream" and rk:
            self.t.tensors.add(rk)
            s = self.stream_of(c.args[0]) if c.args else None
            self._emit(K.RECORD, line, key=rk, stream=s or ANY)
            return None
        if name == "wait_stream" and recv is not None:
            waiter = self.stream_of(recv) or rk or ANY
            waited = self.stream_of(c.args[0]) if c.args else None
            self._emit(K.WAIT, line, stream=waiter, other=waited or ANY)
            return None
        if name == "wait_event" and recv is not None:
            waiter = self.stream_of(recv) or rk or ANY
            ev = self.event_of(c.args[0]) if c.args else None
            if ev is None and c.args:
                ev = self.key(c.args[0])
            self._emit(K.WAIT_EVENT, line, stream=waiter, key=ev or ANY)
            return None
        if name == "record" and rk:
            self.t.recorded.add(rk)
        if name in ("wait", "query") and rk:
            self.t.waited.add(rk)
        if name == "record" and rk and (rk in self.t.events or _EVENTISH.search(rk)):
            self.t.events.add(rk)
            s = self.stream_of(c.args[0]) if c.args else self.cur
            if c.args and s is None:
                s = self.key(c.args[0]) or ANY
            self._emit(K.EVENT_RECORD, line, key=rk, stream=s or self.cur)
            return None
        if name == "record_event":
            s = self.stream_of(recv) if recv is not None else self.cur
            made = f"<event@{line}:{c.col_offset}>"
            self.t.events.add(made)
            self._emit(K.EVENT_RECORD, line, key=made, stream=s or self.cur)
            return made
        if name == "wait" and rk is not None:
            if rk in self.t.events or _EVENTISH.search(rk):
                s = self.stream_of(c.args[0]) if c.args else self.cur
                self._emit(K.WAIT_EVENT, line, stream=s or self.cur, key=rk)
            else:
                self._emit(K.WORK_WAIT, line, key=rk)
            return None
        if name != "synchronize" and name.endswith("synchronize") and recv is None:
            # a saved alias of Event.synchronize / Stream.synchronize: its argument
            target = ""
            if c.args:
                a0 = c.args[0]
                target = self.stream_of(a0) or self.key(a0) or ""
            self._emit(K.HOST_SYNC, line, key=target)
            return None
        if name == "synchronize":
            target = ""
            if isinstance(recv, ast.Call):  # current_stream().synchronize(), else a device
                target = self.stream_of(recv) or ""
            elif recv is not None and dotted(recv) not in ("torch.cuda", "torch",
                                                           "torch.accelerator"):
                target = self.stream_of(recv) or (self.event_of(recv) if rk else None) or \
                    rk or ast.unparse(recv)
            self._emit(K.HOST_SYNC, line, key=target)
            return None
        if name in ("Thread", "Process") or name in _THREAD_SPAWNERS:
            for a in [*c.args, *(k.value for k in c.keywords)]:
                self.expr(a) if not isinstance(a, (ast.Name, ast.Attribute)) else None
            return None
        # Work queued by the call: its receiver and arguments, on the current stream.
        async_op = _true(_kw(c, "async_op")) or name in _ASYNC_COLLECTIVE
        nb = _true(_kw(c, "non_blocking"))
        if isinstance(recv, ast.Subscript) and rk is not None:
            self.expr(recv.slice)  # x[i].copy_(...): a view of x, not a host read of it
        elif recv is not None and not isinstance(recv, (ast.Name, ast.Attribute)):
            made_recv = self.expr(recv)  # a chained call or an index: its own work first
            if made_recv is not None:
                rk = made_recv
        args = [a for a in c.args]
        arg_keys = []
        for a in args:
            m = self.expr(a)
            arg_keys.append(m or self.key(a))
        for kw in c.keywords:
            if kw.arg in ("out",):
                k = self.key(kw.value)
                if k:
                    self.t.tensors.add(k)
                    self._emit(K.USE, line, stream=self.cur, key=k, write=True)
                    self._host_write(k, line)
            else:
                self.expr(kw.value)
        if name in _HOST_READS and rk:
            self.t.tensors.add(rk)
            self._emit(K.HOST_READ, line, key=rk, flag=name)
            return None
        if name == "numpy" and rk:
            self.t.host.add(rk)
            return None
        if recv is None and name in _HOST_BUILTINS:
            for k in arg_keys:
                if k and k in self.t.host:
                    self._emit(K.HOST_READ, line, key=k, flag=name)
            return None
        if rk and name in _META:
            return None
        if rk in ("self", "cls"):
            rk = None
        tensor_recv = rk is not None and (name in _TENSOR_METHODS or rk in self.t.tensors)
        if rk and name in _TENSOR_METHODS:
            self.t.tensors.add(rk)
        if async_op:
            work = f"<work@{line}:{c.col_offset}>"
            for k in arg_keys:
                if k:
                    self.t.tensors.add(k)
                    self._emit(K.COLLECTIVE, line, key=k, other=work, stream=self.cur)
            return work
        if name == "copy_" and rk:
            src = arg_keys[0] if arg_keys else None
            self._emit(K.USE, line, stream=self.cur, key=rk, write=True)
            if nb and src:
                self.t.tensors.add(src)
                self._emit(K.NB_COPY, line, stream=self.cur, key=rk, other=src,
                           flag=self._direction(rk, src))
            else:
                self._host_write(rk, line)
            if src:
                self.t.tensors.add(src)
            return None
        if rk and tensor_recv:
            write = name.endswith("_") and not name.endswith("__")
            self._emit(K.USE, line, stream=self.cur, key=rk, write=write)
            if write:
                if name == "resize_" and c.args and isinstance(c.args[0], ast.Constant) and \
                        c.args[0].value == 0:
                    self._emit(K.FREE, line, key=rk)
                else:
                    self._host_write(rk, line)
            if write:
                return rk  # in-place ops return their receiver
            if name in _VIEWS:
                return None
            made = self._fresh(c)
            self.t.tensors.add(made)
            if name == "pin_memory":
                self.t.pinned.add(made)
                self.t.host.add(made)
            elif name == "cpu" or (name == "to" and (
                    _is_cpu_device(c.args[0] if c.args else _kw(c, "device")))):
                self.t.host.add(made)
            if nb and name in ("to", "cuda", "cpu"):
                self._emit(K.NB_COPY, line, stream=self.cur, key=made, other=rk,
                           flag="d2h" if made in self.t.host else "h2d")
            return made
        module_fn = full.startswith(("torch.", "F.", "np.", "numpy."))
        if rk and recv is not None and not module_fn:
            self._emit(K.USE, line, stream=self.cur, key=rk)
        if module_fn and not _NOT_TENSOR_TORCH.match(full):
            if full.startswith(("np.", "numpy.")):
                for i, k in enumerate(arg_keys):
                    if not k:
                        continue
                    if i == 0 and full.split(".")[-1] in ("copyto", "put", "place"):
                        self._host_write(k, line)
                    elif k in self.t.host:
                        self._emit(K.HOST_READ, line, key=k, flag="numpy")
                return None
            made = self._fresh(c)
            self.t.tensors.add(made)
            for k in arg_keys:
                if k:
                    self._emit(K.USE, line, stream=self.cur, key=k)
            dev = _kw(c, "device")
            if _true(_kw(c, "pin_memory")):
                self.t.pinned.add(made)
                self.t.host.add(made)
            elif full.endswith("from_numpy") or (dev is None and full.split(".")[-1] in (
                    "empty", "zeros", "ones", "full", "tensor", "arange", "as_tensor")) or \
                    _is_cpu_device(dev):
                self.t.host.add(made)
            return made
        for k in arg_keys:
            if k:
                self._emit(K.USE, line, stream=self.cur, key=k)
        self.t.calls.append((name, line, len(c.args), frozenset(
            k.arg for k in c.keywords if k.arg)))
        if callable(self.callee):
            for eff in self.callee(c):  # type: ignore[operator]
                if eff.what == "wait":
                    self._emit(K.WAIT, line, stream=ANY, other=ANY)
                elif eff.what == "sync":
                    self._emit(K.HOST_SYNC, line, key="")
                else:
                    k = self.key(ast.parse(eff.param, mode="eval").body) if eff.param else None
                    if not k:
                        continue
                    k += eff.suffix
                    if eff.what == "record":
                        self._emit(K.RECORD, line, key=k, stream=ANY)
                    elif eff.what == "free":
                        self._emit(K.FREE, line, key=k)
                    else:
                        self.t.tensors.add(k)
                        self._emit(K.USE, line, stream=self.cur, key=k, write=eff.write)
        return None

    def _direction(self, dst: str, src: str) -> str:
        dh = dst in self.t.host or bool(_HOSTISH.search(dst))
        sh = src in self.t.host or bool(_HOSTISH.search(src))
        if dh and not sh:
            return "d2h"
        if sh and not dh:
            return "h2d"
        return "?"


def is_scalar_annotation(node: ast.expr | None) -> bool:
    return node is not None and bool(_SCALAR_ANN.match(ast.unparse(node)))
