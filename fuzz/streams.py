"""The streams of a run: real CUDA streams, or simulated ones on CPU.

A target uses them through plain torch.cuda (on CPU, ``fuzz.sim.cuda_on_cpu``
puts torch.cuda on the simulated streams for the length of an example) or,
as older targets do, through ``ctx.streams``: ``Stream()``, ``stream(s)``,
``current_stream()``, ``Event()`` and ``synchronize()`` with torch.cuda's
meaning. Simulated streams run every op at once, in program order, and report
each stream operation to listeners (the lifetime oracle is one) so that races
can be reasoned about without a GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup, Work, _create_work_from_future
from torch.multiprocessing.reductions import StorageWeakRef

from fuzz import stages
from fuzz.dispatch_mode import BROADCAST, RECORD_STREAM, DispatchMode, run_op, unobserved
from fuzz.errors import FuzzError
from fuzz.sim import cuda_on_cpu, threads
from fuzz.sim.cuda_on_cpu import storage_key
from fuzz.sim.stream_names import Names, site_name
from fuzz.tensors import tensors_in

Listener = Callable[..., None]


_CUDA_SITES: dict[int, str] = {}
"""Each real CUDA stream's own name, by handle (``CudaStreams``): a stream
made in one block and used in a later one keeps it. torch hands out streams
from a pool, so a handle made again takes the newer stream's name."""


class CudaStreams:
    """torch.cuda's stream API bound to one device, plus harness-only helpers.

    ``gates`` is the rank's gate pool (``fuzz.gates.Gates``), or None where
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

    def spin(self, s: Any, cycles: int) -> str:
        """Hold ``s`` for about ``cycles`` GPU cycles; returns how it was held."""
        if cycles > 0:
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

        class _Noted(real):  # type: ignore[valid-type, misc]
            def __new__(cls, *args: Any, **kwargs: Any) -> Any:
                s = real.__new__(cls, *args, **kwargs)
                # torch.cuda.current_stream() wraps an existing stream through this
                # class too (stream_id=...): only a new stream is the target's.
                if "stream_id" not in kwargs:
                    note(s)
                return s

        torch.cuda.Stream = _Noted
        span = _GpuSpan(self) if stages.enabled else None
        try:
            with threads.modes_follow_threads():
                yield
        finally:
            torch.cuda.Stream = real
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


class SimStream(cuda_on_cpu.TORCH_STREAM):
    """A CPU stream that exists only as an identity and a clock for listeners.

    Under CUDA on CPU it is also ``torch.cuda.Stream``: ``SimStream()`` then
    makes a new stream of the example's simulated streams. A stream made in
    an earlier example or block (kept in a module-level cache) belongs to the
    one running when it is used (``SimStreams.adopt``): its ids are unique in
    the process, and the default stream (id 0) is every run's ``main``.
    """

    _api: SimStreams

    def __new__(cls, device: Any = None, priority: int = 0, **_: Any) -> SimStream:
        return _active("torch.cuda.Stream()").Stream(priority)

    PRIORITIES = (0, -3)
    """``priority_range()``: (least, greatest), what torch gives on current GPUs."""

    @classmethod
    def _make(cls, api: SimStreams, stream_id: int, priority: int = 0,
              name: str = "main") -> SimStream:
        self = cuda_on_cpu.TORCH_STREAM.__new__(cls, stream_id=stream_id, device_type=0,
                                                device_index=0)
        self._api = api
        self._name = name
        """Its own name in findings: its creation site's, or the user's (``site_name``)."""
        least, greatest = cls.PRIORITIES
        self._priority = min(least, max(greatest, priority))  # clamped, as CUDA does
        return self

    def _now(self, what: str) -> SimStreams:
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
        return cuda_on_cpu.DEVICE

    @property
    def priority(self) -> int:
        return self._priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return SimStream.PRIORITIES

    def wait_stream(self, other: Any) -> None:  # type: ignore[override]
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
        """True unless the scenario holds this poll (``SimStreams.hold_polls``).
        A program that goes on because of a True has seen the stream's work
        done, as a host polling until True on a GPU has: a synchronize for
        the listeners."""
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


class SimEvent:
    """An event on simulated streams: its clock is kept by the listeners.

    Under CUDA on CPU it is also ``torch.cuda.Event``.
    """

    _ids = itertools.count(1)

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, *, _api: SimStreams | None = None) -> None:
        self._api = _api if _api is not None else _active("torch.cuda.Event()")
        self.event_id = next(self._ids)
        self._at = 0.0

    def _now(self, what: str) -> SimStreams:
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


_ACTIVE: list[SimStreams] = []

_stream_ids = itertools.count(1)
"""Simulated stream ids, unique in the process: a stream kept from an earlier
run is never taken for one of the current run's."""

_handle_keys = itertools.count(1)
"""Work handles' keys among the listeners' events, unique in the process too."""

_STREAMS: weakref.WeakValueDictionary[int, SimStream] = weakref.WeakValueDictionary()
"""Every simulated stream still alive, by id: aten names a stream by its id
only (``record_stream``), and it may be one an earlier run made."""


class NoSimulation(FuzzError, RuntimeError):
    """A simulated stream or event used while no simulation runs."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: simulated CUDA streams and events work only while an "
                         f"example runs on --device cpu or a streamfuzz.checked(device=\"cpu\") "
                         f"block runs, and none does now")


def running() -> SimStreams | None:
    """The simulation the current example or block runs on, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _active(what: str = "a simulated CUDA stream") -> SimStreams:
    sim = running()
    if sim is None:
        raise NoSimulation(what)
    return sim


class SimStreams:
    """Simulated streams for CPU tensors.

    Every op runs eagerly, so values never race here; what the listeners see
    is the order the program *asked for*, which is what a race detector needs.
    """

    kind = "sim"
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
        """Broadcasts this rank is the root of, still being sent (``_collective``)."""
        self.receiving: list[_Receiving] = []
        """Broadcasts this rank receives, still arriving (``_collective``): each
        lands in the program's tensors before anything touches them."""
        self._arriving: set[int] = set()
        """The storages ``receiving`` lands in."""
        self.handles: list[_Handle] = []
        """The work handles of async calls handed to the program (``_Handle``),
        kept for the example: C++ holds them only through their boxed form, and
        the program must get these objects back, not a bare ``Work``."""
        self.memory = cuda_on_cpu.Memory()
        self._polls_unfinished = 0
        self.unfinished: Callable[[Any], bool] | None = None
        """Whether the host does not know a stream's, event's or work handle's
        work done (the lifetime checker's answer); None: every poll says done."""

    def Stream(self, priority: int = 0) -> SimStream:  # noqa: N802
        stream_id = next(_stream_ids)
        s = SimStream._make(self, stream_id, priority, self._names.of(stream_id, site_name()))
        _STREAMS[stream_id] = s
        self._add(s)
        return s

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

    @contextlib.contextmanager
    def stream(self, s: Any) -> Iterator[None]:
        if s is None:
            yield
            return
        if isinstance(s, SimStream) and s._api is not self:
            self.adopt(s)
        before, self._current = self._current, s
        try:
            yield
        finally:
            self._current = before

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

    def spin(self, s: Any, cycles: int) -> str:
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
            s = _STREAMS[stream_id]
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

    def touches_arriving(self, args: tuple, kwargs: dict) -> bool:
        """Whether an op's tensors share a storage with a broadcast still arriving."""
        arriving = self._arriving
        return any(storage_key(t) in arriving for t in tensors_in([*args, *kwargs.values()]))

    def receive(self, receiving: _Receiving, into: list[torch.Tensor]) -> None:
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
        _ACTIVE.append(self)
        ended = False
        try:
            with cuda_on_cpu.session(self, self.simulation) as memory, \
                    threads.modes_follow_threads():
                self.memory = memory
                with _SimDispatch(self):
                    yield
            ended = True
        finally:
            _ACTIVE.remove(self)
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


class _SimDispatch(DispatchMode):
    """Routes every aten op through the listeners; executes ``record_stream``.

    CPU tensors have no ``record_stream`` kernel; here it becomes an event for
    the listeners, which is exactly the information a lifetime checker needs.
    Collectives run on private copies (``_collective``).
    """

    def __init__(self, api: SimStreams) -> None:
        super().__init__()
        self.api = api

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        api = self.api
        if func is RECORD_STREAM:
            api.emit("record_stream", args[0], api.by_id(args[1].stream_id))
            return None
        if api._arriving and api.touches_arriving(args, kwargs):
            api.land()
        stages.enter(stages.SIMULATION)
        try:
            handle = None
            if func.namespace == "c10d":
                stages.enter(stages.COLLECTIVES)
                out, handle = _collective(func, args, kwargs, api)
            else:
                stages.enter(stages.RUNNER)
                out = run_op(func, args, kwargs)
        finally:
            stages.leave()
        api.memory.classify(args, out)
        stages.leave()
        if api.listeners:
            if handle is None:
                api.emit("op", func, args, kwargs, out, api._current)
            else:
                api.emit("async_op", func, args, kwargs, out, api._current, handle)
        return out


def _collective(func: Any, args: tuple, kwargs: dict,
                api: SimStreams) -> tuple[Any, _Handle | None]:
    """Run a c10d op on copies of its tensors and copy the results back; the
    op's result, and the handle of an async call (``_Handle``), else None.

    gloo keeps its own reference to a collective's tensors for a moment after
    the call returns; a storage the program drops then would be freed (and
    judged) at a time that depends on gloo's thread. With copies, the
    program's storages live exactly as long as the program holds them, so a
    verdict never depends on when a backend lets go. Collectives other than
    broadcasts wait here, which changes no verdict: the listeners model the
    collective as enqueued, not as done.

    The root of a broadcast gets nothing back: it does not wait here (gloo's
    root waits until every receiver has got there, which put the ranks in
    lockstep at every broadcast) but goes on, as a rank goes on once NCCL has
    enqueued a collective; its work goes to ``sending``, waited for when the
    example ends, so no example ends with a send still unmatched. The copies
    are the harness's own: torch functions skip the simulation's mode for them.

    A rank that receives a broadcast does not wait here either: a gloo
    receive is a round trip between the ranks (the receiver says it is ready,
    the sender then sends), and a program that makes several in a row would
    pay one each. It goes on, as it would once NCCL has enqueued the receive;
    the data lands in its tensors (``SimStreams.land``) before any op or host
    read touches their storage, at a synchronize, or when the example ends,
    so every read sees what it would have seen had the call waited.
    """
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    asynchronous = _is_async(func, args, kwargs)
    with torch._C.DisableTorchFunction():
        out = run_op(func, _own(args, pairs), {k: _own(v, pairs) for k, v in kwargs.items()})
        originals = {id(copy): orig for orig, copy in pairs}
        programs = [orig for orig, _ in pairs]
        if func is BROADCAST:
            tensors, work = out
            if _sends_only(func, args, kwargs):
                api.sending.append(work)
            else:
                api.receive(_Receiving(work, pairs), programs)
            if not asynchronous:
                return _back((tensors, _finished(programs)), originals), None
            handle = _Handle(api, func, args, kwargs, programs, None)
            return _back((tensors, handle.boxed()), originals), handle
        handles: list[_Handle] = []

        def finished(work: Any) -> Any:
            if not asynchronous:
                return _finished(programs)
            source = Work.unbox(work)._source_rank() if func is _RECV_ANY_SOURCE else None
            handles.append(_Handle(api, func, args, kwargs, programs, source))
            return handles[-1].boxed()

        out = _waited(out, finished)
        for orig, copy in pairs:
            orig.copy_(copy)
    return _back(out, originals), (handles[0] if handles else None)


class _Receiving:
    """A broadcast on its way into the program's tensors, each held as a weak
    reference to its storage and where in it the tensor lies: the tensor the
    program passed may be a view it drops at once (``table[:n]``) while it
    keeps the storage, and a storage the program drops is freed when it
    drops it (the lifetime oracle judges that moment), with nothing landed."""

    __slots__ = ("work", "into")

    def __init__(self, work: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.work = work
        self.into = [(StorageWeakRef(orig.untyped_storage()), orig.dtype, orig.storage_offset(),
                      orig.size(), orig.stride(), copy) for orig, copy in pairs]

    def land(self, quiet: bool) -> None:
        try:
            self.work.wait()
        except Exception:
            if not quiet:
                raise
            return
        with torch._C.DisableTorchFunction(), unobserved():
            for ref, dtype, offset, size, stride, copy in self.into:
                storage = None if ref.expired() else torch.UntypedStorage._new_with_weak_ptr(
                    ref.cdata)
                if storage is not None:
                    torch.empty(0, dtype=dtype).set_(storage, offset, size, stride).copy_(copy)


def _sends_only(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this rank is the root of a broadcast (it sends, receives nothing)."""
    if func is not BROADCAST:
        return False
    bound = dict(zip(("tensors", "process_group", "root_rank"), args))
    bound.update(kwargs)
    try:
        group = ProcessGroup.unbox(bound["process_group"])
        return bound["root_rank"] == group.rank()
    except (KeyError, RuntimeError, AttributeError):
        return False


def _finished(result: Any) -> Any:
    """A work handle already complete: the program's ``wait`` returns at once."""
    done = torch.futures.Future()
    done.set_result(result)
    return _create_work_from_future(done).boxed()  # what a c10d op returns


_RECV_ANY_SOURCE = torch.ops.c10d.recv_any_source_.default
_POINT_TO_POINT = frozenset({torch.ops.c10d.send.default, torch.ops.c10d.recv_.default,
                             _RECV_ANY_SOURCE})
_SYNC_ONLY = frozenset({"c10d::barrier", "c10d::monitored_barrier_"})
"""Ops that move none of the program's data: whatever their ``async_op``,
nothing to follow on a backend stream."""


def _is_async(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether NCCL runs the call on a stream of its own: point-to-point calls
    always, collectives called with ``async_op`` (a blocking collective runs on
    the current stream and returns no work to wait for)."""
    if func in _POINT_TO_POINT:
        return True
    where = _ASYNC_ARG.get(func)
    if where is None:
        where = _ASYNC_ARG[func] = next(
            ((i, a.default_value) for i, a in enumerate(func._schema.arguments)
             if a.name == "async_op" and func._schema.name not in _SYNC_ONLY), (-1, False))
    i, default = where
    if i < 0:
        return False
    return bool(args[i] if i < len(args) else kwargs.get("async_op", default))


_ASYNC_ARG: dict[Any, tuple[int, bool]] = {}
"""Per op overload: where its ``async_op`` argument is, and its default (-1: none)."""


def _waited(x: Any, finished: Callable[[Any], Any]) -> Any:
    """``x`` with every work handle in it waited for and replaced by
    ``finished(handle)``. The program waits for the handle it gets too, and
    gloo's point-to-point handles (``send``, ``recv``) block for good on a
    second wait."""
    if isinstance(x, (list, tuple)):
        return type(x)(_waited(v, finished) for v in x)
    if not isinstance(x, torch.Tensor) and hasattr(x, "wait"):
        x.wait()
        return finished(x)
    return x


class _Handle(Work):
    """The work handle of an async call on simulated streams (an ``isend``, a
    ``broadcast(..., async_op=True)``), as the program gets it.

    NCCL runs such a call on a stream of its own (one per process group, one
    per pair of ranks for point-to-point calls), after the current stream's
    work so far; waiting for the handle makes the waiting thread's current
    stream wait for it, and NCCL holds the call's tensors until then. Here the
    data is there before anything reads it (the call waited for it, or it
    lands first: ``_Receiving``); the listeners get the call as ``async_op``
    and each wait as ``wait_work``. A receive from any source keeps the rank
    it came from."""

    def __init__(self, api: SimStreams, func: Any, args: tuple, kwargs: dict,
                 result: list[torch.Tensor], source: int | None) -> None:
        super().__init__()
        # Weakly: the handle lives as long as the example, the tensors as long
        # as the program keeps them.
        self._api, self._source = api, source
        self._result = [weakref.ref(t) for t in result]
        self.key = ("work", next(_handle_keys))
        """The handle's event among the listeners' events."""
        self.stream, self.stream_name = _backend_stream(func, args, kwargs, source)
        """The backend stream the call runs on: its key and its name in reports."""
        api.handles.append(self)

    def _now(self) -> SimStreams:
        """The simulated streams running now (a handle kept from an earlier run
        is theirs), else its own: with none running its data has landed."""
        if _ACTIVE:
            self._api = _ACTIVE[-1]
        return self._api

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        api = self._now()
        api.emit("wait_work", self, api.current_stream())
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        return self._now().answer_poll(self)

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return [t for t in (ref() for ref in self._result) if t is not None]

    def get_future(self) -> torch.futures.Future:
        """A completed future whose ``wait`` is the handle's (as NCCL's is)."""
        done = _HandleFuture(self)
        done.set_result(self.result())
        return done

    def _source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("source rank is known only for a receive from any source")
        return self._source

    source_rank = _source_rank


class _HandleFuture(torch.futures.Future):
    def __init__(self, handle: _Handle) -> None:
        super().__init__()
        self._handle = handle

    def wait(self) -> Any:
        self._handle.wait()
        return super().wait()


def _backend_stream(func: Any, args: tuple, kwargs: dict,
                    source: int | None) -> tuple[tuple[Any, ...], str]:
    bound = {**dict(zip((a.name for a in func._schema.arguments), args)), **kwargs}
    group = ProcessGroup.unbox(bound["process_group"])
    name = group.group_name
    if func not in _POINT_TO_POINT:
        return ("nccl", name), f"nccl(group {name})"
    peer = source if func is _RECV_ANY_SOURCE else bound.get("dst", bound.get("src"))
    low, high = sorted((group.rank(), peer))
    return ("nccl", name, low, high), f"nccl(group {name}, p2p {low}-{high})"


def _own(x: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """``x`` with every tensor (in lists and tuples) replaced by a copy, noted in ``pairs``."""
    if isinstance(x, torch.Tensor):
        pairs.append((x, x.clone()))
        return pairs[-1][1]
    if isinstance(x, (list, tuple)):
        return type(x)(_own(v, pairs) for v in x)
    return x


def _back(x: Any, originals: dict[int, torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return originals.get(id(x), x)
    if isinstance(x, (list, tuple)):
        return type(x)(_back(v, originals) for v in x)
    return x
