"""The streams of a run: real CUDA streams, or simulated ones on CPU.

A target uses them through plain torch.cuda (on CPU, ``streamfuzz.fuzz.sim.cuda_on_cpu``
puts torch.cuda on the simulated streams for the length of an example) or,
as older targets do, through ``ctx.streams``: ``Stream()``, ``stream(s)``,
``current_stream()``, ``Event()`` and ``synchronize()`` with torch.cuda's
meaning. Simulated streams run every op at once, in program order, and report
each stream operation to listeners (the lifetime oracle is one) so that races
can be reasoned about without a GPU.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.sim import cuda_on_cpu, stream_types, threads
from streamfuzz.fuzz.sim.cuda_on_cpu import storage_key
from streamfuzz.fuzz.sim.dispatch import Handle, Receiving, SimDispatch
from streamfuzz.fuzz.sim.stream_names import Names, site_name
from streamfuzz.fuzz.sim.stream_types import NoSimulation, SimEvent, SimStream, running
from streamfuzz.fuzz.tensors import tensors_in

__all__ = ["CudaStreams", "NoSimulation", "SimEvent", "SimStream", "SimStreams", "running"]

Listener = Callable[..., None]


_CUDA_SITES: dict[int, str] = {}
"""Each real CUDA stream's own name, by handle (``CudaStreams``): a stream
made in one block and used in a later one keeps it. torch hands out streams
from a pool, so a handle made again takes the newer stream's name."""


class CudaStreams:
    """torch.cuda's stream API bound to one device, plus harness-only helpers.

    ``gates`` is the rank's gate pool (``streamfuzz.fuzz.gates.Gates``), or None where
    gates are unavailable; ``hold`` then returns None and callers spin.
    """

    kind = "cuda"

    def __init__(self, device: torch.device, gates: Any = None) -> None:
        self.device = device
        self.gates = gates
        self.created: list[Any] = []
        self._names = Names()

    def Stream(self, priority: int = 0) -> torch.cuda.Stream:  # noqa: N802 - torch's name
        s = torch.cuda.Stream(self.device, priority=priority)
        if not any(c is s for c in self.created):  # a session notes it already
            self._note(s)
        return s

    def _note(self, s: Any) -> None:
        self.created.append(s)
        _CUDA_SITES[s.cuda_stream] = self._names.of(s.cuda_stream, site_name())

    def name_of(self, handle: int) -> str:
        """A stream's name in findings, by its handle (see ``site_name``)."""
        return self._names.of(handle, _CUDA_SITES.get(handle, f"stream{handle:#x}"))

    def name_stream(self, s: Any, name: str) -> None:
        """Call ``s`` ``name`` in findings, in this run and later ones."""
        _CUDA_SITES[s.cuda_stream] = name
        self._names.rename(s.cuda_stream, name)

    def stream(self, s: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(s)

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def Event(self, **kwargs: Any) -> torch.cuda.Event:  # noqa: N802
        return torch.cuda.Event(**kwargs)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def spin(self, s: Any, cycles: int, idle: bool = False) -> str:
        """Hold ``s`` for about ``cycles`` GPU cycles; returns how it was held.
        With ``idle``, where the gates can, the stream waits that long running
        nothing ("timed"), so that the GPU stays free for other worlds."""
        if cycles > 0:
            if idle and self.gates is not None and self.gates.hold_for(s, cycles):
                return "timed"
            with torch.cuda.stream(s):
                torch.cuda._sleep(cycles)
        return "spin"

    def hold(self, s: Any, opener: Any = None) -> Any:
        """A gate holding ``s`` until ``opener`` (a stream; None: the host)
        opens it (harness-only); None without gates."""
        return self.gates.hold(s, opener) if self.gates is not None else None

    def hold_polls(self, n: int) -> None:
        """Nothing: on a GPU, whether polled work is done is the GPU's answer."""

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Note the streams a target makes with ``torch.cuda.Stream`` too: the
        scenario's holds and churn use its first one as "side"."""
        real = torch.cuda.Stream
        note = self._note

        class _Real(type(real)):  # type: ignore[misc]
            """``isinstance(s, torch.cuda.Stream)`` holds for every real stream
            (an ``ExternalStream`` too), not only for those made here; a class a
            target derives from it keeps the plain check (the metaclass is
            inherited, and a lane class must not claim the current stream)."""

            def __instancecheck__(cls, obj: Any) -> bool:
                if cls is _Noted:
                    return isinstance(obj, real)
                return type.__instancecheck__(cls, obj)

            def __subclasscheck__(cls, sub: type) -> bool:
                if cls is _Noted:
                    return issubclass(sub, real)
                return type.__subclasscheck__(cls, sub)

        class _Noted(real, metaclass=_Real):  # type: ignore[valid-type, misc]
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                s = real.__new__(cls, *args, **kwargs)
                # torch.cuda.current_stream() wraps an existing stream through this
                # class too (stream_id=...): only a new stream is the target's.
                if "stream_id" not in kwargs:
                    note(s)
                return s

        torch.cuda.Stream = _Noted  # type: ignore[misc]
        span = _GpuSpan(self) if stages.enabled else None
        try:
            with threads.modes_follow_threads():
                yield
        finally:
            torch.cuda.Stream = real  # type: ignore[misc]
            if span is not None:
                span.stop()


class _GpuSpan:
    """An example's device time, for the stage counters only: from an event on
    the current stream as the example starts to the last of its streams'
    work. Best effort: a failure here leaves the counter out, nothing else."""

    def __init__(self, streams: CudaStreams) -> None:
        self.streams = streams
        try:
            self.start: Any = torch.cuda.Event(enable_timing=True)
            self.start.record(streams.current_stream())
        except Exception:
            self.start = None

    def stop(self) -> None:
        if self.start is None:
            return
        try:
            ends = []
            for s in [self.streams.current_stream(), *self.streams.created]:
                end = torch.cuda.Event(enable_timing=True)
                end.record(s)
                ends.append(end)
            for end in ends:
                end.synchronize()
            stages.add(stages.GPU, max(self.start.elapsed_time(e) for e in ends) / 1000)
        except Exception:
            pass


class SimStreams:
    """Simulated streams for CPU tensors.

    Every op runs eagerly, so values never race here; what the listeners see
    is the order the program *asked for*, which is what a race detector needs.
    """

    kind = "sim"
    stream_type = SimStream
    event_type = SimEvent
    external_stream_type = stream_types.SimExternalStream
    """What ``torch.cuda.Stream``, ``Event`` and ``ExternalStream`` are in a session."""
    stream_context_type = stream_types.SimStreamContext
    """What ``torch.cuda.stream`` and ``torch.cuda.StreamContext`` are in a session."""
    generic_stream_type = stream_types.GenericStream
    generic_event_type = stream_types.GenericEvent
    """What ``torch.Stream`` and ``torch.Event`` are in a session."""
    device = cuda_on_cpu.DEVICE
    """What ``ctx.device`` is: tensors made on it stand for device memory."""

    def __init__(self, simulation: cuda_on_cpu.Simulation = cuda_on_cpu.FUZZ) -> None:
        self.simulation = simulation
        """What runs these streams, as messages name it (``NotSimulated``)."""
        self.main = SimStream._make(self, 0)
        self._names = Names()
        self._local = threading.local()
        self._lock = threading.RLock()
        self.created: list[SimStream] = []
        self.listeners: list[Listener] = []
        self._by_id = {0: self.main}
        self.sending: list[Any] = []
        """Broadcasts this rank is the root of, still being sent
        (``streamfuzz.fuzz.sim.dispatch``)."""
        self.receiving: list[Receiving] = []
        """Broadcasts this rank receives, still arriving (``streamfuzz.fuzz.sim.dispatch``): each
        lands in the program's tensors before anything touches them."""
        self._arriving: set[int | None] = set()
        """The storages ``receiving`` lands in."""
        self.handles: list[Handle] = []
        """The work handles of async calls handed to the program
        (``streamfuzz.fuzz.sim.dispatch.Handle``), kept for the example: C++ holds them
        only through their boxed form, and the program must get these objects
        back, not a bare ``Work``."""
        self.memory = cuda_on_cpu.Memory()
        self._polls_unfinished = 0
        self.unfinished: Callable[[Any], bool] | None = None
        """Whether the host does not know a stream's, event's or work handle's
        work done (the lifetime checker's answer); None: every poll says done."""

    def Stream(self, priority: int = 0,  # noqa: N802
               kind: type[SimStream] | None = None) -> SimStream:
        """A new stream, of ``kind`` where the program derived a class of its own."""
        stream_id = next(stream_types.stream_ids)
        while stream_id in stream_types.EXTERNAL:
            stream_id = next(stream_types.stream_ids)
        s = (kind or SimStream)._make(self, stream_id, priority,
                                      self._names.of(stream_id, site_name()))
        stream_types.STREAMS[stream_id] = s
        self._add(s)
        return s

    def external(self, handle: int, kind: type[SimStream] | None = None) -> SimStream:
        """The stream whose handle (``cuda_stream``, its id) is ``handle``, as
        an object of ``kind``: one this run or an earlier one made, else a
        stream of its own that a library made outside torch."""
        kind = kind or SimStream
        known = self._by_id.get(handle) or stream_types.STREAMS.get(handle)
        if known is None:
            s = kind._make(self, handle, 0, self._names.of(handle, site_name()))
            stream_types.EXTERNAL.add(handle)
            stream_types.STREAMS[handle] = s
            self._add(s)
            return s
        self.adopt(known)
        if isinstance(known, kind):
            return known
        return kind._make(self, handle, known.priority, known._name)

    def _add(self, s: SimStream) -> None:
        self.created.append(s)
        self._by_id[s.stream_id] = s
        self.emit("new_stream", s)

    def adopt(self, s: SimStream) -> None:
        """Make a stream an earlier run made (a module-level cache of streams)
        one of these: the listeners see it from now on, as a new stream
        whose work so far is done, as an earlier run's is for the checker."""
        with self._lock:
            if s._api is self:
                return
            s._api = self
            if s.stream_id != 0 and s.stream_id not in self._by_id:
                self._add(s)

    def stream(self, s: Any) -> stream_types.SimStreamContext:
        return stream_types.SimStreamContext(s, self)

    @property
    def _current(self) -> SimStream:
        # Per thread, as CUDA's current stream: a new thread starts on the default one.
        return getattr(self._local, "stream", self.main)

    @_current.setter
    def _current(self, s: SimStream) -> None:
        self._local.stream = s

    def current_stream(self) -> SimStream:
        return self._current

    def set_stream(self, s: SimStream) -> None:
        if isinstance(s, SimStream) and s._api is not self:
            self.adopt(s)
        self._current = s

    def Event(self, **kwargs: Any) -> SimEvent:  # noqa: N802
        return SimEvent(_api=self, **kwargs)

    def synchronize(self) -> None:
        self.land()
        self.emit("sync_device")

    def spin(self, s: Any, cycles: int, idle: bool = False) -> str:
        return "none"

    gates = None

    def hold(self, s: Any, opener: Any = None) -> None:
        """No gates on simulated streams: every op has already run."""
        return None

    def hold_polls(self, n: int) -> None:
        """The next ``n`` polls of work the host does not know done answer
        "not done" (``query()``, ``is_completed()``): the path a program takes
        while the GPU is still busy, which the simulation, every op already
        run, would otherwise never take. Work the host has synchronized with
        is done, as on a GPU; without the lifetime checker nobody knows which
        is which, and every poll says done."""
        self._polls_unfinished = n

    def answer_poll(self, polled: Any) -> bool:
        """A poll's answer (see ``hold_polls``)."""
        if self._polls_unfinished > 0 and self.unfinished is not None and self.unfinished(polled):
            self._polls_unfinished -= 1
            return False
        return True

    def by_id(self, stream_id: int) -> SimStream:
        """The simulated stream behind a plain ``torch.Stream`` seen by aten."""
        s = self._by_id.get(stream_id)
        if s is None:
            s = stream_types.STREAMS[stream_id]
            self.adopt(s)
        return s

    def name_of(self, s: SimStream) -> str:
        """A stream's name in findings (see ``site_name``)."""
        if s.stream_id == 0:
            return "main"
        return self._names.of(s.stream_id, s._name)

    def name_stream(self, s: SimStream, name: str) -> None:
        """Call ``s`` ``name`` in findings, in this run and later ones."""
        s._name = name
        self._names.rename(s.stream_id, name)

    def emit(self, what: str, *args: Any) -> None:
        with self._lock:  # one event at a time, from whichever thread
            for listener in self.listeners:
                listener(what, *args)

    def host_read(self, t: torch.Tensor, op: str) -> None:
        """The host reads ``t`` with no aten op (``tolist``, ``numpy``)."""
        if self._arriving and storage_key(t) in self._arriving:
            self.land()
        self.emit("host_read", t, op)

    def resized(self, storage: torch.UntypedStorage, before: int) -> None:
        """``storage.resize_`` ran on the current stream, from ``before`` bytes."""
        self.emit("resize", storage, before, self._current)

    def touches_arriving(self, args: tuple, kwargs: dict) -> bool:
        """Whether an op's tensors share a storage with a broadcast still arriving."""
        arriving = self._arriving
        return any(storage_key(t) in arriving for t in tensors_in([*args, *kwargs.values()]))

    def receive(self, receiving: Receiving, into: list[torch.Tensor]) -> None:
        """A broadcast this rank receives, to land in ``into`` (see ``land``)."""
        with self._lock:
            self.receiving.append(receiving)
            self._arriving.update(storage_key(t) for t in into)

    def land(self, quiet: bool = False) -> None:
        """Wait for every broadcast still arriving and copy it into the
        program's tensors, in the order they were called. ``quiet``: an error
        is already on its way out."""
        with self._lock:
            if not self.receiving:
                self._arriving.clear()
                return
            stages.enter(stages.COLLECTIVES)
            try:
                while self.receiving:
                    self.receiving.pop(0).land(quiet)
            finally:
                self.receiving.clear()
                self._arriving.clear()
                stages.leave()

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Run the example with torch.cuda on these streams, under the dispatch
        mode that makes CPU streams work; at its end, wait until every
        broadcast this rank sent has been received."""
        self._current = self.main
        stream_types.ACTIVE.append(self)
        ended = False
        try:
            with cuda_on_cpu.session(self, self.simulation) as memory, \
                    threads.modes_follow_threads():
                self.memory = memory
                with SimDispatch(self):
                    yield
            ended = True
        finally:
            stream_types.ACTIVE.remove(self)
            self.land(quiet=not ended)
            self._sent(quiet=not ended)

    def _sent(self, quiet: bool) -> None:
        """Wait for this rank's sends, even after an error: an example never ends
        with one unmatched (a peer that never gets there makes this rank hang,
        as it would on a GPU). ``quiet``: an error is already on its way out."""
        stages.enter(stages.COLLECTIVES)
        try:
            while self.sending:
                work = self.sending.pop(0)
                try:
                    work.wait()
                except Exception:
                    if not quiet:
                        raise
        finally:
            self.sending.clear()
            stages.leave()

