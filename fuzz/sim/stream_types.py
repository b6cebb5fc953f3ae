"""The simulated stream and event types, and which simulation runs now.

Under CUDA on CPU they are ``torch.cuda.Stream``, ``Event``, ``ExternalStream``
and ``stream``, and ``torch.Stream`` and ``torch.Event``
(``streamfuzz.fuzz.sim.cuda_on_cpu`` installs them for the length of an
example); all are classes, since engine code and torch derive their own. Each
is an identity for the listeners, never a queue: every op has already run.
What they do goes to the simulation running now (``running()``), which a
stream or event made in an earlier example or block joins on first use.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import Any, Protocol

import torch

from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.sim.cuda_on_cpu import DEVICE, TORCH_STREAM
from streamfuzz.fuzz.sim.device import check_index, check_stream

TORCH_EVENT = torch.Event
"""torch's own ``Event``: a session swaps ``GenericEvent`` in for it."""


class Simulated(Protocol):
    """What a stream, an event or a work handle asks of the simulation it is
    part of (``streamfuzz.fuzz.streams.Simulated``)."""

    def Stream(self, priority: int = 0,  # noqa: N802
               kind: type[SimStream] | None = None) -> SimStream: ...
    def Event(self, **kwargs: Any) -> SimEvent: ...  # noqa: N802
    def external(self, handle: int,
                 kind: type[SimStream] | None = None) -> SimStream: ...
    def adopt(self, s: SimStream) -> None: ...
    def current_stream(self) -> SimStream: ...
    def set_stream(self, s: SimStream) -> None: ...
    def emit(self, what: str, *args: Any) -> None: ...
    def answer_poll(self, polled: Any) -> bool: ...
    def name_of(self, s: SimStream) -> str: ...


class SimStream(TORCH_STREAM):
    """A CPU stream that exists only as an identity and a clock for listeners.

    Under CUDA on CPU it is also ``torch.cuda.Stream``: ``SimStream()`` then
    makes a new stream of the example's simulated streams. A stream made in
    an earlier example or block (kept in a module-level cache) belongs to the
    one running when it is used (``streamfuzz.fuzz.streams.SimStreams.adopt``): its ids are
    unique in the process, and the default stream (id 0) is every run's ``main``.
    """

    _api: Simulated
    _name: str
    _priority: int
    _entered: SimStream

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> SimStream:
        api = _active("torch.cuda.Stream()")
        if "stream_id" in kwargs:  # torch's way back to a stream it made already
            return api.external(kwargs["stream_id"], cls)
        # A class the program derives from torch.cuda.Stream makes its own objects.
        return api.Stream(priority, cls)

    PRIORITIES = (0, -3)
    """``priority_range()``: (least, greatest), what torch gives on current GPUs."""

    @classmethod
    def _make(cls, api: Simulated, stream_id: int, priority: int = 0,
              name: str = "main") -> SimStream:
        self = TORCH_STREAM.__new__(cls, stream_id=stream_id, device_type=0,
                                                device_index=0)
        self._api = api
        self._name = name
        """Its own name in findings: its creation site's, or the user's (``site_name``)."""
        least, greatest = cls.PRIORITIES
        self._priority = min(least, max(greatest, priority))  # clamped, as CUDA does
        return self

    def _now(self, what: str) -> Simulated:
        """The simulated streams running now, this stream among them."""
        api = _active(what)
        if api is not self._api:
            api.adopt(self)
        return api

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        """The simulated CUDA device: tensors made on ``stream.device`` stand for its memory."""
        return DEVICE

    @property
    def priority(self) -> int:
        return self._priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return SimStream.PRIORITIES

    def wait_stream(self, other: Any) -> None:  # type: ignore[override]
        check_stream(other, "Stream.wait_stream()")
        api = self._now("torch.cuda.Stream.wait_stream")
        if isinstance(other, SimStream) and other._api is not api:
            api.adopt(other)
        api.emit("wait_stream", self, other)

    def wait_event(self, event: Any) -> None:  # type: ignore[override]
        event.wait(self)

    def record_event(self, event: Any = None) -> SimEvent:  # type: ignore[override]
        event = event or self._now("torch.cuda.Stream.record_event").Event()
        event.record(self)
        return event

    def synchronize(self) -> None:  # type: ignore[override]
        self._now("torch.cuda.Stream.synchronize").emit("sync_stream", self)

    def query(self) -> bool:  # type: ignore[override]
        """True unless the scenario holds this poll
        (``streamfuzz.fuzz.streams.SimStreams.hold_polls``). A program that goes
        on because of a True has seen the stream's work done, as a host polling
        until True on a GPU has: a synchronize for the listeners."""
        if not self._now("torch.cuda.Stream.query").answer_poll(self):
            return False
        self.synchronize()
        return True

    def __enter__(self) -> SimStream:
        api = self._now("torch.cuda.stream(...)")
        self._entered = api.current_stream()
        api.set_stream(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._api.set_stream(self._entered)

    def __repr__(self) -> str:
        return f"SimStream({self._api.name_of(self)})"

    def __hash__(self) -> int:
        return hash(self.stream_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimStream) and other.stream_id == self.stream_id


class SimExternalStream(SimStream):
    """``torch.cuda.ExternalStream(handle)``: the stream a library made,
    known by its handle (``cuda_stream``, which is a simulated stream's id).
    The handle of a simulated stream names that stream; any other is a stream
    of its own, the same one for every ``ExternalStream`` of that handle."""

    def __new__(cls, stream_ptr: int, device: Any = None,  # type: ignore[misc]
                **kwargs: Any) -> SimStream:
        check_index(device)
        return _active("torch.cuda.ExternalStream()").external(stream_ptr, cls)


class SimStreamContext:
    """``torch.cuda.stream(s)`` and ``torch.cuda.StreamContext(s)`` on the
    simulation running when it is entered. An object, as torch's is, so that
    a stored one enters again; entered inside itself, it keeps one saved
    stream, as torch's does (its outer exit then leaves ``s`` current)."""

    def __init__(self, stream: Any, api: Simulated | None = None) -> None:
        self.stream = stream
        self._api = api
        """The simulation it is bound to (``ctx.streams.stream``), else None."""
        self._before: Any = None

    def _now(self) -> Simulated:
        return self._api or _active("torch.cuda.stream(...)")

    def __enter__(self) -> None:
        if self.stream is None:
            return
        check_stream(self.stream, "torch.cuda.stream()")
        api = self._now()
        self._before = api.current_stream()
        api.set_stream(self.stream)

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            self._now().set_stream(self._before)


class SimEvent:
    """An event on simulated streams: its clock is kept by the listeners.

    Under CUDA on CPU it is also ``torch.cuda.Event``.
    """

    _ids = itertools.count(1)
    _api: Simulated
    event_id: int
    _at: float

    def __new__(cls, enable_timing: bool = False, blocking: bool = False,
                interprocess: bool = False, *, _api: Simulated | None = None) -> SimEvent:
        # Made here, not in __init__: a derived class's __init__ need not call
        # it, as torch's constructor does its work in __new__ too.
        self = super().__new__(cls)
        self._api = _api if _api is not None else _active("torch.cuda.Event()")
        self.event_id = next(cls._ids)
        self._at = 0.0
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def _now(self, what: str) -> Simulated:
        """The simulated streams running now: an event made in an earlier run
        is this one's (a wait for a record the run never saw waits for nothing)."""
        self._api = _active(what)
        return self._api

    def record(self, stream: Any = None) -> None:
        api = self._now("torch.cuda.Event.record")
        stream = stream or api.current_stream()
        if isinstance(stream, SimStream) and stream._api is not api:
            api.adopt(stream)
        self._at = time.perf_counter()
        api.emit("record_event", self, stream)

    def wait(self, stream: Any = None) -> None:
        api = self._now("torch.cuda.Event.wait")
        stream = stream or api.current_stream()
        if isinstance(stream, SimStream) and stream._api is not api:
            api.adopt(stream)
        api.emit("wait_event", stream, self)

    def query(self) -> bool:
        """As ``SimStream.query``: True and a synchronize, unless the poll is held."""
        if not self._now("torch.cuda.Event.query").answer_poll(self):
            return False
        self.synchronize()
        return True

    def synchronize(self) -> None:
        self._now("torch.cuda.Event.synchronize").emit("sync_event", self)

    def elapsed_time(self, end: SimEvent) -> float:
        """Host time between the two records, in ms: every op ran when it was issued."""
        return (end._at - self._at) * 1000.0


def _on_cpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


class _GenericStreamType(type):
    """``isinstance`` and ``issubclass`` against ``torch.Stream`` itself ask
    torch's own; a class derived from it answers as any class does."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is GenericStream:
            return isinstance(obj, TORCH_STREAM)
        return type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is GenericStream:
            return issubclass(sub, TORCH_STREAM)
        return type.__subclasscheck__(cls, sub)


class GenericStream(SimStream, metaclass=_GenericStreamType):
    """``torch.Stream(device, priority=...)``, the device-generic stream, under
    CUDA on CPU: on the CUDA device (or the current accelerator, which is CUDA
    here) a new simulated stream; on the CPU, torch's own. A class the program
    derives from it makes simulated streams of its own class."""

    def __new__(cls, device: Any = None, *, priority: int = 0,  # type: ignore[misc]
                **kwargs: Any) -> Any:
        if _on_cpu(device):
            return TORCH_STREAM(device, priority=priority, **kwargs)
        check_index(device)
        return _active("torch.Stream()").Stream(priority,
                                                SimStream if cls is GenericStream else cls)


class _GenericEventType(type):
    """``isinstance`` and ``issubclass`` against ``torch.Event`` itself: torch's
    own events and simulated ones; a class derived from it answers as any class does."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if cls is GenericEvent:
            return isinstance(obj, (TORCH_EVENT, SimEvent))
        return type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        if cls is GenericEvent:
            return issubclass(sub, (TORCH_EVENT, SimEvent))
        return type.__subclasscheck__(cls, sub)


class GenericEvent(TORCH_EVENT, metaclass=_GenericEventType):
    """``torch.Event(device, ...)``, the device-generic event, under CUDA on
    CPU: on the CUDA device a ``SimEvent``, on the CPU torch's own.

    torch derives classes from ``torch.Event`` as it imports its compiler
    (the first optimizer made does), and they outlive the block. So a derived
    class's objects are torch events: while a simulation runs, each stands for
    a simulated one (``_sim``) that its calls go to; after, torch's own.
    """

    _sim: SimEvent | None = None

    def __new__(cls, device: Any = None, **kwargs: Any) -> Any:
        simulated = running() is not None and not _on_cpu(device)
        if simulated:
            check_index(device)
        if cls is GenericEvent:
            return _active("torch.Event()").Event(**kwargs) if simulated else TORCH_EVENT(
                device, **kwargs)
        if not simulated:
            return TORCH_EVENT.__new__(cls, device, **kwargs)
        self = TORCH_EVENT.__new__(cls, "cpu")
        self._sim = _active("torch.Event()").Event(**kwargs)
        return self

    def record(self, stream: Any = None) -> None:
        if self._sim is None:
            return TORCH_EVENT.record(self, stream)
        self._sim.record(stream)

    def wait(self, stream: Any = None) -> None:
        if self._sim is None:
            return TORCH_EVENT.wait(self, stream)
        self._sim.wait(stream)

    def query(self) -> bool:
        return TORCH_EVENT.query(self) if self._sim is None else self._sim.query()

    def synchronize(self) -> None:
        if self._sim is None:
            return TORCH_EVENT.synchronize(self)
        self._sim.synchronize()

    def elapsed_time(self, end: Any) -> float:
        if self._sim is None:
            return TORCH_EVENT.elapsed_time(self, end)
        return self._sim.elapsed_time(end._sim if isinstance(end, GenericEvent)
                                      and end._sim is not None else end)


ACTIVE: list[Simulated] = []
"""The simulations running (``streamfuzz.fuzz.streams.SimStreams.session``), innermost last."""

stream_ids = itertools.count(1)
"""Simulated stream ids, unique in the process: a stream kept from an earlier
run is never taken for one of the current run's."""

EXTERNAL: set[int] = set()
"""The handles ``ExternalStream`` made streams for: ids ``stream_ids`` skips."""

STREAMS: weakref.WeakValueDictionary[int, SimStream] = weakref.WeakValueDictionary()
"""Every simulated stream still alive, by id: aten names a stream by its id
only (``record_stream``), and it may be one an earlier run made."""


class NoSimulation(FuzzError, RuntimeError):
    """A simulated stream or event used while no simulation runs."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: simulated CUDA streams and events work only while an "
                         f"example runs on --device cpu or a streamfuzz.checked(device=\"cpu\") "
                         f"block runs, and none does now")


def running() -> Simulated | None:
    """The simulation the current example or block runs on, or None."""
    return ACTIVE[-1] if ACTIVE else None


def _active(what: str = "a simulated CUDA stream") -> Simulated:
    sim = running()
    if sim is None:
        raise NoSimulation(what)
    return sim
