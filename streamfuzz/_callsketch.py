"""A typed sketch of a real call: what a harness needs to make the call again.

A recording run (``streamfuzz._record``) sketches the first call of each user
function that did stream work, as the checker first meets it: each argument
and, for a method, the object's attributes, a few levels deep. A tensor is
its layout (shape, dtype, device, strides, pinned, which other recorded
tensor it is a view of), never its values; a stream is the caller's current
stream, the default one or a side stream and its name; an object is its
class's import path and its attributes. ``scan --harness --record`` writes
the harness from it (``streamfuzz.fuzz.scan.harness_recorded``): an engine's
state, built from its configuration at start, cannot be read off its source.

A sketch is plain data: the capture keeps no reference to what it read, and
it is bounded (``DEPTH`` levels, ``ITEMS`` items of a container, ``NODES``
values a call). Nothing here imports torch at import time: ``scan`` reads
sketches too.
"""

from __future__ import annotations

import enum
import inspect
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

VERSION = 1
"""The sketches' format in a record; sketches of another version are refused."""
DEPTH = 4
"""Levels below an argument still sketched (``self.pool.blocks[0]`` is three)."""
ITEMS = 16
"""Items of a list, tuple, set or dict sketched; the rest are counted."""
ATTRIBUTES = 64
"""Attributes of one object sketched; the rest are counted."""
NODES = 1000
"""Values sketched per call, at most: a sketch stays small whatever the call holds."""
TEXT = 2000
"""The longest ``str`` or ``bytes`` kept literally."""


@dataclass(frozen=True)
class Literal:
    """``None``, a bool, a number or a string: its ``repr``, which reads back as it."""

    text: str


@dataclass(frozen=True)
class Bytes:
    hex: str


@dataclass(frozen=True)
class Tensor:
    """A tensor's layout. ``device`` is what the memory stands for ("cuda" for
    device memory, also when the checker simulates it on the CPU)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: str  # ``float16``: torch's name without ``torch.``
    device: str
    pinned: bool
    storage_bytes: int
    view_of: str = ""  # the path of an earlier tensor of the same storage
    requires_grad: bool = False


@dataclass(frozen=True)
class Array:
    """A NumPy array: shape and dtype."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Stream:
    """``role``: "current" (the caller's current stream at the call), "default"
    or "side" (a stream of its own, ``name`` in findings)."""

    role: str
    name: str = ""


@dataclass(frozen=True)
class Event:
    pass


@dataclass(frozen=True)
class Ref:
    """Something named, not built: a class, a function, a module's attribute, a
    device, a module, an enum member
    (``member``), a fresh lock or queue (``kind`` "fresh"), or a bound method of an
    object already sketched (``kind`` "method": ``module`` is that object's path)."""

    kind: str  # class, function, global, device, module, enum, fresh, method
    module: str
    qualname: str = ""
    member: str = ""


@dataclass(frozen=True)
class Items:
    """A list, tuple, set, frozenset or deque (``cls``: a named tuple's class);
    ``length`` the whole length, ``items`` its first ``ITEMS`` (one, where
    those are all alike)."""

    kind: str
    items: tuple[Value, ...]
    length: int
    cls: Ref | None = None


@dataclass(frozen=True)
class Mapping:
    """A dict (``kind`` dict, OrderedDict or defaultdict, with its ``factory``)."""

    kind: str
    items: tuple[tuple[Value, Value], ...]
    length: int
    factory: Value | None = None


@dataclass(frozen=True)
class Object:
    """An object: its class, and its attributes as ``vars()`` and ``__slots__`` hold
    them. ``plain``: its class sets attributes as ``object`` does."""

    cls: Ref
    attributes: tuple[tuple[str, Value], ...]
    more: int = 0
    plain: bool = True


@dataclass(frozen=True)
class Same:
    """The very object sketched earlier at ``path`` (a stream two attributes share)."""

    path: str


@dataclass(frozen=True)
class Opaque:
    """What a sketch cannot rebuild: ``type`` and why."""

    type: str
    why: str


Value = (Literal | Bytes | Tensor | Array | Stream | Event | Ref | Items | Mapping | Object | Same
         | Opaque)


@dataclass(frozen=True)
class Param:
    """One parameter: ``kind`` is ``inspect.Parameter``'s kind's name, lowercase."""

    name: str
    kind: str
    value: Value


@dataclass(frozen=True)
class CallSketch:
    """The first call of one function: where it is, the caller's current stream, and
    its parameters (``self_param``: the one that is the method's object)."""

    path: str  # absolute, as ``streamfuzz._record.Function``
    function: str
    first_line: int
    module: str
    current: Stream
    params: tuple[Param, ...]
    self_param: str = ""
    cut: bool = False  # NODES reached: later values are Opaque

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.function, self.first_line


# -- JSON ----------------------------------------------------------------------

_KINDS: dict[str, type] = {"literal": Literal, "bytes": Bytes, "tensor": Tensor,
                           "array": Array, "stream": Stream, "event": Event, "ref": Ref,
                           "items": Items, "mapping": Mapping, "object": Object,
                           "same": Same, "opaque": Opaque}
_NAMES = {cls: name for name, cls in _KINDS.items()}


def value_to_json(v: Value) -> dict[str, Any]:
    out: dict[str, Any] = {"k": _NAMES[type(v)]}
    if isinstance(v, Items):
        out.update(kind=v.kind, items=[value_to_json(i) for i in v.items], length=v.length,
                   cls=None if v.cls is None else value_to_json(v.cls))
    elif isinstance(v, Mapping):
        out.update(kind=v.kind, length=v.length,
                   items=[[value_to_json(a), value_to_json(b)] for a, b in v.items],
                   factory=None if v.factory is None else value_to_json(v.factory))
    elif isinstance(v, Object):
        out.update(cls=value_to_json(v.cls), more=v.more, plain=v.plain,
                   attributes=[[n, value_to_json(a)] for n, a in v.attributes])
    else:
        out.update({k: list(x) if isinstance(x, tuple) else x for k, x in vars(v).items()})
    return out


def value_from_json(d: dict[str, Any]) -> Value:
    """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed value."""
    cls = _KINDS[d["k"]]
    if cls is Items:
        ref = d.get("cls")
        return Items(str(d["kind"]), tuple(value_from_json(i) for i in d["items"]),
                     int(d["length"]), None if ref is None else _ref(value_from_json(ref)))
    if cls is Mapping:
        factory = d.get("factory")
        return Mapping(str(d["kind"]), tuple((value_from_json(a), value_from_json(b))
                                             for a, b in d["items"]), int(d["length"]),
                       None if factory is None else value_from_json(factory))
    if cls is Object:
        return Object(_ref(value_from_json(d["cls"])),
                      tuple((str(n), value_from_json(a)) for n, a in d["attributes"]),
                      int(d["more"]), bool(d["plain"]))
    fields = {k: tuple(x) if isinstance(x, list) else x for k, x in d.items() if k != "k"}
    value: Value = cls(**fields)
    return value


def _ref(v: Value) -> Ref:
    if not isinstance(v, Ref):
        raise TypeError("a class that is not a ref")
    return v


def to_json(s: CallSketch) -> dict[str, Any]:
    return {"path": s.path, "function": s.function, "first_line": s.first_line,
            "module": s.module, "current": value_to_json(s.current),
            "params": [[p.name, p.kind, value_to_json(p.value)] for p in s.params],
            "self_param": s.self_param, "cut": s.cut}


def from_json(d: dict[str, Any]) -> CallSketch:
    """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed sketch."""
    current = value_from_json(d["current"])
    if not isinstance(current, Stream):
        raise TypeError("a current stream that is not a stream")
    return CallSketch(str(d["path"]), str(d["function"]), int(d["first_line"]),
                      str(d["module"]), current,
                      tuple(Param(str(n), str(k), value_from_json(v)) for n, k, v in d["params"]),
                      str(d["self_param"]), bool(d["cut"]))


# -- capture -------------------------------------------------------------------

_capturing = threading.local()
"""Set in a thread while it sketches: an op the sketch makes sketches nothing."""


def capture(frame: types.FrameType, path: str, function: str) -> CallSketch | None:
    """The call ``frame`` is running, as it stands at its first stream op; None
    where it cannot be read (never an error in the user's run)."""
    if getattr(_capturing, "on", False):
        return None
    _capturing.on = True
    try:
        return _Capture().call(frame, path, function)
    except Exception:  # a sketch is a help, never a reason for the run to fail
        return None
    finally:
        _capturing.on = False


_LITERALS = (type(None), bool, int, float, complex, str)
_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_THREADING = {"lock": "Lock", "RLock": "RLock"}


class _Capture:
    def __init__(self) -> None:
        import torch

        from streamfuzz.fuzz.sim import stream_types

        self.torch = torch
        self.seen: dict[int, str] = {}  # id of what is sketched -> its path
        self.storages: dict[tuple[str, int], str] = {}  # (device, storage) -> first path
        self.nodes = 0
        self.cut = False
        self.sim = stream_types.running()
        self.memory = getattr(self.sim, "memory", None)
        self.current = self._current_stream()

    def _current_stream(self) -> Any:
        if self.sim is not None:
            return self.sim.current_stream()
        if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            return self.torch.cuda.current_stream()
        return None

    def call(self, frame: types.FrameType, path: str, function: str) -> CallSketch | None:
        code = frame.f_code
        if not code.co_flags & inspect.CO_OPTIMIZED:
            return None  # a class body's or a module's code: no call to make again
        n = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:n])
        kinds = (["positional_only"] * code.co_posonlyargcount
                 + ["positional_or_keyword"] * (code.co_argcount - code.co_posonlyargcount)
                 + ["keyword_only"] * code.co_kwonlyargcount)
        if code.co_flags & inspect.CO_VARARGS:
            names.append(code.co_varnames[n])
            kinds.append("var_positional")
            n += 1
        if code.co_flags & inspect.CO_VARKEYWORDS:
            names.append(code.co_varnames[n])
            kinds.append("var_keyword")
        local = frame.f_locals
        try:
            return self._call(frame, path, function, names, kinds, local)
        finally:
            if type(local) is dict:
                # Before Python 3.13 this is a copy of the frame's variables that the
                # frame keeps: emptied, so that a ``del t`` still frees ``t`` there.
                local.clear()

    def _call(self, frame: types.FrameType, path: str, function: str, names: list[str],
              kinds: list[str], local: Any) -> CallSketch:
        code = frame.f_code
        current = Stream("default")  # the stream the caller ran the call on
        if self.current is not None and getattr(self.current, "stream_id", 0) != 0:
            current = Stream("side", self._stream_name(self.current))
        if self.current is not None:
            self.seen[id(self.current)] = "current"
        cls_path = function.rpartition(".")[0]
        self_param = ""
        if names and cls_path and kinds[0] != "var_positional" and names[0] in local and any(
                c.__qualname__ == cls_path for c in type(local[names[0]]).__mro__):
            self_param = names[0]
        params = []
        for name, kind in zip(names, kinds):
            if name not in local:
                continue
            where = "obj" if name == self_param else f"args[{name!r}]"
            params.append(Param(name, kind, self.value(local[name], where, 0)))
        return CallSketch(path, function, code.co_firstlineno,
                          str(frame.f_globals.get("__name__", "")), current, tuple(params),
                          self_param, self.cut)

    def stream(self, s: Any) -> Stream:
        if self.current is not None and s == self.current:
            return Stream("current", self._stream_name(s))
        if getattr(s, "stream_id", None) == 0:
            return Stream("default")
        return Stream("side", self._stream_name(s))

    def _stream_name(self, s: Any) -> str:
        name = getattr(s, "_name", None)  # a simulated stream's
        if isinstance(name, str):
            return name
        from streamfuzz.fuzz import streams

        return streams._CUDA_SITES.get(getattr(s, "cuda_stream", -1), "")

    def value(self, v: Any, path: str, depth: int) -> Value:
        self.nodes += 1
        if self.nodes > NODES:
            self.cut = True
            return Opaque(_type_name(type(v)), f"past the sketch's {NODES} values")
        t = type(v)
        if t in _LITERALS:
            if t is str and len(v) > TEXT:
                return Opaque("str", f"{len(v)} characters")
            return Literal(repr(v))
        if t in (bytes, bytearray):
            return Bytes(bytes(v).hex()) if len(v) <= TEXT else Opaque(
                t.__name__, f"{len(v)} bytes")
        same = self.seen.get(id(v))
        if same is not None:
            return Same(same)
        if path:
            self.seen[id(v)] = path
        torch = self.torch
        if isinstance(v, torch.Tensor):
            return self.tensor(v, path)
        if t.__name__ == "ndarray" and t.__module__ == "numpy":
            return Array(tuple(int(x) for x in v.shape), str(v.dtype))
        if isinstance(v, torch.Stream):
            return self.stream(v)
        if isinstance(v, torch.dtype):
            return Ref("global", "torch", str(v).removeprefix("torch."))
        if isinstance(v, torch.device):
            return Ref("device", v.type)
        if isinstance(v, torch.Size):
            return Items("tuple", tuple(Literal(repr(int(x))) for x in v), len(v))
        if _is_event(v, torch):
            return Event()
        if isinstance(v, enum.Enum):
            return Ref("enum", t.__module__, t.__qualname__, v.name)
        if isinstance(v, types.ModuleType):
            return Ref("module", v.__name__)
        if isinstance(v, type):
            return _named("class", v)
        if isinstance(v, types.MethodType):
            owner = self.seen.get(id(v.__self__))
            if owner is not None:
                return Ref("method", owner, v.__func__.__name__)
            return Opaque("method", f"{v.__qualname__} of an object not sketched")
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType)):
            return _named("function", v)
        if t.__module__ in ("_thread", "threading", "queue", "asyncio.locks", "asyncio.queues"):
            return Ref("fresh", "threading" if t.__module__ == "_thread" else t.__module__,
                       _THREADING.get(t.__name__, t.__qualname__))
        if depth >= DEPTH:
            return Opaque(_type_name(t), f"deeper than {DEPTH} levels")
        if t in _SEQUENCES or t.__name__ == "deque" and t.__module__ == "collections" or (
                isinstance(v, tuple) and hasattr(t, "_fields")):
            return self.items(v, path, depth)
        if isinstance(v, dict) and t.__module__ in ("builtins", "collections"):
            return self.mapping(v, path, depth)
        return self.object(v, path, depth)

    def tensor(self, v: Any, path: str) -> Tensor:
        device = v.device.type
        pinned = False
        if self.memory is not None:
            from streamfuzz.fuzz.tensors import DEVICE, PINNED

            kind = self.memory.kind(v)
            device = "cuda" if kind == DEVICE else device
            pinned = kind == PINNED
        elif device == "cpu":
            pinned = bool(v.is_pinned())
        view_of = ""
        storage_bytes = 0
        try:
            storage = v.untyped_storage()
            storage_bytes = int(storage.nbytes())
            key = (device, int(storage.data_ptr()) or id(storage))
            view_of = self.storages.setdefault(key, path)
            view_of = "" if view_of == path else view_of
        except (RuntimeError, NotImplementedError):
            pass
        return Tensor(tuple(int(x) for x in v.shape), tuple(int(x) for x in v.stride()),
                      int(v.storage_offset()), str(v.dtype).removeprefix("torch."), device,
                      pinned, storage_bytes, view_of, bool(v.requires_grad))

    def items(self, v: Any, path: str, depth: int) -> Items:
        t = type(v)
        kind = _SEQUENCES.get(t, "deque" if t.__name__ == "deque" else "tuple")
        indexable = kind in ("list", "tuple", "deque")
        out = []
        for i, item in enumerate(v):
            if i == ITEMS:
                break
            out.append(self.value(item, f"{path}[{i}]" if indexable else "", depth + 1))
        if len(out) > 1 and all(o == out[0] for o in out):
            out = out[:1]  # a layer's cache per layer: one sketch says them all
        cls = _named("class", t) if hasattr(t, "_fields") else None
        return Items(kind, tuple(out), len(v), cls if isinstance(cls, Ref) else None)

    def mapping(self, v: dict, path: str, depth: int) -> Mapping:
        t = type(v)
        out = []
        for i, (key, item) in enumerate(v.items()):
            if i == ITEMS:
                break
            k = self.value(key, "", depth + 1)
            where = f"{path}[{k.text}]" if isinstance(k, Literal) else ""
            out.append((k, self.value(item, where, depth + 1)))
        factory = None
        if t.__name__ == "defaultdict":
            factory = self.value(getattr(v, "default_factory", None), "", depth + 1)
        return Mapping(t.__name__, tuple(out), len(v), factory)

    def object(self, v: Any, path: str, depth: int) -> Value:
        t = type(v)
        attrs: dict[str, Any] = {}
        own = getattr(v, "__dict__", None)
        if isinstance(own, dict):
            attrs.update(own)
        for c in t.__mro__:
            slots = c.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(v, name):
                    attrs[name] = getattr(v, name)
        if not attrs and (t.__module__ == "builtins" or own is None):
            return Opaque(_type_name(t), "an object with no attributes to set")
        cls = _named("class", t)
        if not isinstance(cls, Ref):
            return cls
        out = []
        for i, (name, item) in enumerate(attrs.items()):
            if i == ATTRIBUTES:
                break
            where = f"{path}.{name}" if name.isidentifier() else ""
            out.append((name, self.value(item, where, depth + 1)))
        return Object(cls, tuple(out), max(0, len(attrs) - ATTRIBUTES),
                      t.__setattr__ is object.__setattr__)


def _is_event(v: Any, torch: Any) -> bool:
    from streamfuzz.fuzz.sim.stream_types import SimEvent

    return isinstance(v, (torch.cuda.Event, torch.Event, SimEvent))


def _named(kind: str, v: Any) -> Value:
    """A class or function by its import path; a local one cannot be named
    (``global``: a module's attribute, ``torch.float16``; ``device``: a
    ``torch.device`` of that type, the harness's own for "cuda")."""
    qual = getattr(v, "__qualname__", "")
    module = getattr(v, "__module__", None) or ""
    name = getattr(v, "__name__", "")
    if name and getattr(sys.modules.get(module), name, None) is v:
        qual = name  # a builtin that its module hands out under a shorter path (torch.cat)
    if not qual or "<" in qual or not module:
        return Opaque(_type_name(type(v)), f"{kind} {qual or v!r} has no import path")
    return Ref(kind, module, qual)


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"
