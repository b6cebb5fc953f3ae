"""What a function's names and expressions are, read from their shape.

Nothing is imported or run: names are matched by shape (``x.wait_stream(y)``,
``with torch.cuda.stream(s)`` or ``with self.device_module.stream(s)``), and
what is a tensor, a stream or an event is read from how the name is made and
used. ``Namer`` holds one walk's state (the stream stack, aliases, branches)
and answers, for an expression, the storage, stream or event it names; the
call rules (``streamfuzz.fuzz.scan.calls``), the binding rules (``streamfuzz.fuzz.scan.binding``)
and the statement walker (``streamfuzz.fuzz.scan.streams_ast``) build on it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from typing import Any

from streamfuzz.fuzz.scan.ops import CURRENT, OWN, SUBMITTER, THREAD, ClassFacts, K, Op, Trace

# Method names, by what they do to their receiver.
META = {"size", "dim", "numel", "data_ptr", "stride", "element_size", "is_pinned",
         "is_contiguous", "get_device", "nelement", "storage_offset", "type", "is_shared",
         "untyped_storage_nbytes", "nbytes", "__len__"}
META_ATTRS = {"shape", "dtype", "device", "is_cuda", "ndim", "requires_grad", "layout",
               "is_cpu", "itemsize", "names", "grad_fn"}
VIEWS = {"view", "view_as", "reshape", "narrow", "flatten", "unflatten", "unsqueeze",
          "squeeze", "permute", "transpose", "t", "expand", "expand_as", "as_strided", "split",
          "chunk", "unbind", "select", "diagonal", "detach", "contiguous", "numpy", "data",
          "untyped_storage", "movedim", "swapaxes", "tensor_split", "split_with_sizes"}
SPLITS = {"chunk", "split", "unbind", "tensor_split", "split_with_sizes"}
"""Views that cut a tensor into parts, unpacked one name each."""
HOST_READS = {"tolist", "item", "__int__", "__float__", "__bool__"}
HOST_BUILTINS = {"int", "float", "bool", "list", "tuple", "sum", "max", "min", "sorted",
                  "enumerate", "zip", "any", "all", "set", "dict"}
TENSOR_METHODS = VIEWS | HOST_READS | {
    "copy_", "to", "cuda", "cpu", "clone", "index_select", "gather", "scatter_", "index_copy_",
    "index_fill_", "fill_", "zero_", "record_stream", "pin_memory", "masked_fill_", "add_",
    "mul_", "div_", "sub_", "resize_", "data_ptr", "numel", "is_pinned", "index_put_",
    "masked_scatter_", "float", "half", "bfloat16", "long", "repeat", "cumsum", "argmax",
    "nonzero", "topk", "index_add_", "scatter_add_", "element_size", "new_empty",
    "new_zeros", "new_full", "new_tensor", "bool", "masked_select", "repeat_interleave",
    "sum", "flatten", "clamp_", "uniform_", "normal_", "exponential_"}
NOT_TENSOR_TORCH = re.compile(
    r"^torch\.(cuda|distributed|device|dtype|Size|get_|set_|is_|no_grad|inference_mode|"
    r"enable_grad|manual_seed|compile|jit|library|ops\.|_dynamo|autograd|backends|nn\.Module|"
    r"Stream|Event|Generator|iinfo|finfo|float|int|bool|long|half|bfloat16|uint8|accelerator|"
    r"xpu|npu|mps|_C|fx|testing|utils|profiler|version|__)")
HOSTISH = re.compile(r"(^|[._])(cpu|host|pinned|pin|np|numpy)($|[._])|_cpu$|_host$|_np$",
                      re.I)
STREAMISH = re.compile(r"stream", re.I)
STREAM_CONTEXT = re.compile(r"stream_?(context|ctx)$", re.I)
"""A helper of the package's own that enters the stream it is given."""
STREAM_SWITCH = re.compile(r"stream", re.I)
"""A context manager from elsewhere named for a stream (``npu_stream_switch(s)``,
``device_stream(s)``): given something that is a stream, it makes it current."""
INDEXISH = re.compile(r"indices|idx_mapping|mapping|mask|_ids$|^ids$|perm|idxs$|index_tensor",
                       re.I)
"""Index names that hold tensors (a bare ``idx`` is as often an int)."""
EVENTISH = re.compile(r"event|fence", re.I)
THREAD_SPAWNERS = {"Thread", "submit", "start_new_thread", "run_in_executor", "Process"}
ASYNC_COLLECTIVE = {"isend", "irecv", "batch_isend_irecv"}
CONTAINER_ANN = re.compile(r"^(typing\.)?(list|dict|tuple|set|deque|defaultdict|List|Dict|Tuple|"
                           r"Set|Sequence|Mapping|MutableMapping|Deque|DefaultDict)\b")
"""An annotation of a Python container: its items may be tensors, it is not one."""
CONTAINER_MAKERS = {"list", "dict", "set", "deque", "defaultdict", "OrderedDict"}
MAPPING_ANN = re.compile(r"^(typing\.|collections\.)?(dict|Dict|Mapping|MutableMapping|"
                         r"defaultdict|DefaultDict|OrderedDict)\b")
"""An annotation of a mapping: looked up by a tensor, it hashes the tensor's identity."""
CONTAINER_METHODS = {"append", "extend", "insert", "appendleft", "add", "update",
                     "setdefault"}
"""A container's methods that store references: no stream touches a tensor there."""
NOT_STREAM_CALLS = {"stream", "Stream", "ExternalStream", "wait_stream", "record_stream",
                    "set_stream", "current_stream", "default_stream", "cuda_stream", "use_stream"}
"""Calls named like a stream that do not give one back."""
DEVICE_MODULES = {"cuda", "accelerator", "xpu", "npu", "mps", "device_module"}
"""The last name of a device module's path (``torch.cuda``, ``self.device_module``)."""
MODULES = frozenset({"torch", "np", "numpy", "F", "math"})
"""Module names that are never tensors, wherever the file imports them from."""
OTHER_FRAMEWORKS = frozenset({"mlx", "jax", "jaxlib", "tensorflow", "paddle"})
"""Array frameworks with streams of their own, which order no torch work."""
_SCALAR_ANN = re.compile(r"^(int|float|bool|str|bytes|None|list\[int\]|dict|set)", re.I)


def covers(s: str, t: str) -> bool:
    """Does an order of stream ``s`` hold for stream ``t``? ``xs[]`` (each or any of a
    set of streams, as a loop over them names them) covers ``xs[0]``, ``xs['copy']``."""
    return s == t or (s.endswith("[]") and t.startswith(s[:-1]))


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


def callee_name(call: ast.Call) -> str:
    f = call.func
    if isinstance(f, ast.Attribute):
        return f.attr
    if isinstance(f, ast.Name):
        return f.id
    return ""


def negated(test: ast.expr, call: ast.Call) -> bool:
    """Is ``call`` under a ``not`` in ``test``?"""
    for node in ast.walk(test):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and any(
                n is call for n in ast.walk(node.operand)):
            return True
    return False


def inplace(method: str) -> bool:
    return method.endswith("_") and not method.endswith("__") and method != "record_stream"


def kw_arg(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_cpu_device(node: ast.expr | None) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("cpu")
    if isinstance(node, ast.Call) and dotted(node.func) in ("torch.device",) and node.args:
        return is_cpu_device(node.args[0])
    text = dotted(node) or ""
    return bool(HOSTISH.search(text)) and "device" not in text.lower().replace("cpu_device", "")


def is_container(node: ast.expr | None) -> bool:
    """Is ``node`` a Python container made here (a literal, ``[x] * n``, ``list()``)?"""
    if isinstance(node, (ast.List, ast.ListComp, ast.Dict, ast.DictComp, ast.Set,
                         ast.SetComp)):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return isinstance(node.left, (ast.List, ast.ListComp)) or isinstance(
            node.right, (ast.List, ast.ListComp))
    return isinstance(node, ast.Call) and callee_name(node) in CONTAINER_MAKERS


def is_scalar_annotation(node: ast.expr | None) -> bool:
    return node is not None and bool(_SCALAR_ANN.match(ast.unparse(node)))


class Namer:
    """One walk's state, and what its expressions name.

    ``callee`` answers what a same-package callee does to ordering (see
    ``streamfuzz.fuzz.scan.package``): ``'wait'`` (it waits for another stream
    unconditionally), ``'sync'`` (the host waits), or record_stream of the
    call's arguments, by position.
    """

    def __init__(self, trace: Trace, facts: ClassFacts | None, module_facts: ClassFacts,
                 callee: Callable[[ast.Call], Iterable[Any]] | None = None,
                 helper: Callable[[ast.Call], tuple[str, ast.expr | str] | None] | None = None,
                 holds: Callable[[ast.Call], bool] | None = None) -> None:
        self.t = trace
        self.facts = facts or ClassFacts()
        self.module = module_facts
        self.callee = callee
        self.helper = helper
        self.holds = holds
        """Whether a call makes an object of the package's that only stores what it is
        given (a dataclass, a named tuple, an ``__init__`` of assignments)."""
        self.stack = [trace.base]
        self.alias: dict[str, str] = {}
        self.guards: list[int] = []
        self.bound: set[str] = set()
        self.parts: dict[str, str] = {}  # a local name -> the region of its storage (part)
        self.stream_lists: dict[str, list[str]] = {}  # a local list of streams -> them
        self.unset: list[str] = []  # names an enclosing `if x is None` says hold nothing
        self.compares: dict[str, ast.Compare] = {}  # a local name -> the test bound to it
        self.nones: set[str] = set()  # local names last bound to None
        self.also_holds: dict[str, set[str]] = {}  # a handle -> works it still may hold
        self.contexts = {**self.module.contexts, **self.facts.contexts}
        self.modules = MODULES | self.module.modules
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
                if self.is_gather(node):
                    return None
                node = node.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and (node.func.attr in VIEWS or inplace(node.func.attr))):
                # torch.narrow(x, ...): a view of x
                inner: ast.AST | None = (node.args[0] if node.args else None) if \
                    self.is_module(node.func.value) else node.func.value
                if inner is None:
                    return None
                node = inner
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
        if head in self.modules and head not in self.alias and head not in self.bound:
            return None  # a module or a name in it, never a tensor
        if text in self.alias:
            return self.alias[text]
        if head in self.alias:
            base = self.alias[head]
            return f"{base}.{rest}" if rest else base
        return text

    def part(self, node: ast.AST) -> str:
        """The region of its storage an expression names (``ops.disjoint_parts``): an
        item ``x[0]``, a side of a cut ``x[:n]``/``x[n:]``, a chunk unpacked from
        ``x.chunk(2)``; '' for all of it or where unknown."""
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in VIEWS and node.func.attr not in SPLITS:
            node = node.func.value
        if isinstance(node, ast.Name):
            return self.parts.get(node.id, "")
        if not isinstance(node, ast.Subscript) or self.part(node.value):
            return ""
        sl = node.slice
        if isinstance(sl, ast.Constant) and isinstance(sl.value, int):
            return f"i{sl.value}"
        if isinstance(sl, ast.Slice) and sl.step is None:
            if sl.lower is None and sl.upper is not None:
                return f"s:{ast.unparse(sl.upper)}"
            if sl.upper is None and sl.lower is not None:
                return f"s{ast.unparse(sl.lower)}:"
        return ""

    def is_module(self, node: ast.AST) -> bool:
        text = dotted(node)
        head = (text or "").split(".")[0]
        return text is not None and head in self.modules and head not in self.alias and \
            head not in self.bound

    def is_gather(self, node: ast.Subscript) -> bool:
        """``t[idx]`` with a tensor (or list) index makes a new tensor; slices are views."""
        base = dotted(node.value)
        if base and (STREAMISH.search(base) or EVENTISH.search(base) or base in self.t.mappings):
            return False
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for p in parts:
            if isinstance(p, (ast.Slice, ast.Constant)) or (
                    isinstance(p, ast.UnaryOp) and isinstance(p.operand, ast.Constant)):
                continue
            k = dotted(p)
            if k is not None and (self.alias.get(k, k) in self.t.tensors
                                  or INDEXISH.search(k.rsplit(".", 1)[-1])):
                return True
            if isinstance(p, (ast.List, ast.Subscript)):
                return True
        return False

    def stream_of(self, node: ast.AST | None) -> str | None:
        if node is None:
            return None
        if isinstance(node, ast.Call):
            name = callee_name(node)
            if name in ("current_stream", "default_stream"):
                return self.stack[-1] if name == "current_stream" else self.t.base
            found = self.helped(node, "stream")
            if found is not None:
                return found
            if name not in NOT_STREAM_CALLS and name.lower().endswith("stream"):
                made = (dotted(node.func) or name) + "()"  # get_stream(): the stream it gives
                self.t.streams.add(made)
                return made
            return None
        if isinstance(node, ast.IfExp):
            return self.stream_of(node.body) or self.stream_of(node.orelse)
        if isinstance(node, ast.BoolOp):  # a name still None is no stream: the next one
            return next((s for s in map(self.stream_of, [
                v for v in node.values if not (isinstance(v, ast.Name) and v.id in self.nones)])
                if s), None)
        if isinstance(node, ast.Subscript):  # streams[i]: one of a set of streams
            base = self.key(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) \
                else None
            if base and (STREAMISH.search(base.rsplit(".", 1)[-1]) or
                         base + "[]" in self.t.streams):
                lit = node.slice
                listed = self.stream_lists.get(base, [])
                if isinstance(lit, ast.Constant) and isinstance(lit.value, int) and \
                        -len(listed) <= lit.value < len(listed):
                    return listed[lit.value]  # [self.copy_stream, ...][0]: that stream
                # streams["copy"], streams[0]: a stream of its own; streams[i]: any of them
                name = base + (f"[{ast.unparse(lit)}]" if isinstance(lit, ast.Constant) or (
                    isinstance(lit, ast.UnaryOp) and isinstance(lit.operand, ast.Constant))
                    else "[]")
                self.t.streams.add(name)
                return name
            return None
        k = self.key(node)
        if k is None:
            return None
        if k in (CURRENT, THREAD, SUBMITTER) or k in self.t.streams:
            return k
        last = k.rsplit(".", 1)[-1]
        if STREAMISH.search(last) and not last.endswith(("streams", "_pool")):
            self.t.streams.add(k)
            return k
        return None

    def own(self, call: ast.Call) -> bool:
        """Is ``call`` of a function of the package's own that neither returns nor
        enters a stream (its name then says nothing)?"""
        found = self.helper(call) if self.helper is not None else None
        return found is not None and found[0] == OWN

    def helped(self, call: ast.Call, kind: str) -> str | None:
        """The stream a package helper returns (``kind='stream'``) or enters
        (``'context'``), as this function names it."""
        found = self.helper(call) if self.helper is not None else None
        if found is None or found[0] != kind:
            return None
        what = found[1]
        if isinstance(what, str):
            self.t.streams.add(what)
            return what
        # the helper's argument may itself be a call that gives a stream (``global_stream()``)
        s = self.stream_of(what) if not isinstance(what, ast.Call) or \
            callee_name(what) != callee_name(call) else None
        if s is None:
            s = self.key(what)
            if s is None:
                return None
            self.t.streams.add(s)
        return s

    def event_of(self, node: ast.AST) -> str | None:
        k = self.key(node)
        if k is None:
            return None
        if k in self.t.events or EVENTISH.search(k.rsplit(".", 1)[-1]):
            self.t.events.add(k)
            return k
        return None

    def emit(self, kind: K, line: int, **kw: object) -> None:
        self.t.ops.append(Op(kind, line, guards=tuple(self.guards), **kw))  # type: ignore[arg-type]

    @property
    def cur(self) -> str:
        return self.stack[-1]

    # -- statements ----------------------------------------------------------
    def context_stream(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.IfExp):
            return self.context_stream(node.body) or self.context_stream(node.orelse)
        if isinstance(node, ast.Call):
            name = callee_name(node)
            if (dotted(node.func) or "").split(".")[0] in self.module.foreign | OTHER_FRAMEWORKS:
                return None  # another framework's stream (``mx.stream``): no torch stream
            if (name in ("stream", "StreamContext", "use_stream", "cuda_stream") or
                    STREAM_CONTEXT.search(name)) and node.args:
                s = self.stream_of(node.args[0])
                if s is None:
                    s = self.key(node.args[0])
                    if s is None:
                        return None
                    self.t.streams.add(s)
                return s
            found = self.helped(node, "context")
            if found is None and self.own(node):
                return None  # a context manager of the package's own that enters no stream
            if found is None and node.args and STREAM_SWITCH.search(name):
                found = self.stream_of(node.args[0])  # a platform's npu_stream_switch(s)
            if found is None and STREAM_CONTEXT.search(name) and not node.args:
                found = (dotted(node.func) or name) + "()"  # self.copy_stream_ctx()
                self.t.streams.add(found)
            return found
        k = self.key(node)
        if k is not None and k in self.t.streams:
            return k
        if k is not None and k in self.contexts:
            return self.contexts[k]
        return None
    def keep(self, value: ast.expr, line: int, into: str = "") -> None:
        """What ``value`` hands on (returned or stored, ``into`` a local container):
        itself, the items of a literal, the arguments of a constructor call
        (``Output(a, b)``)."""
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            parts: list[ast.expr] = list(value.elts)
        elif isinstance(value, ast.Dict):
            parts = [v for v in value.values if v is not None]
        elif isinstance(value, ast.Call) and callee_name(value)[:1].isupper():
            parts = [*value.args, *(k.value for k in value.keywords)]
        else:
            parts = [value]
        for node in parts:
            if isinstance(node, (ast.Tuple, ast.List, ast.Dict, ast.Call)) and node is not value:
                self.keep(node, line, into)
                continue
            k = self.key(node)
            if k:
                self.emit(K.KEEP, line, key=k, other=into)

    def host_write(self, k: str, line: int) -> None:
        if k in self.t.host or HOSTISH.search(k):
            self.emit(K.HOST_WRITE, line, key=k)

    # -- expressions ---------------------------------------------------------
    def fresh(self, node: ast.AST) -> str:
        k = f"<tmp@{node.lineno}:{node.col_offset}:{node.end_col_offset}>"  # type: ignore[attr-defined]
        text = ast.unparse(node)
        self.t.names.setdefault(k, text if len(text) <= 40 else text[:37] + "...")
        self.emit(K.ALLOC, node.lineno, stream=self.cur, key=k)  # type: ignore[attr-defined]
        return k

    def expr(self, node: ast.expr | None) -> str | None:
        """Record what evaluating ``node`` does; the key of a tensor it makes, if any
        (the statement walker's; the call and binding rules evaluate through it)."""
        raise NotImplementedError
