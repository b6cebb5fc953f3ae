"""The lifetime model fed by real CUDA streams, events and frees.

It runs beside the value oracle on a GPU, so one GPU run reports both
verdicts. Ops come from a TorchDispatchMode on CUDA tensors (the stream is
``torch.cuda.current_stream()`` when the op is launched); ``record_stream`` is
seen there and then executed; event record/wait (``wait_stream`` is one of
each) and host synchronization come from ``torch.cuda._gpu_trace`` callbacks;
frees from polling weak references, as on CPU. A c10d op's callbacks are held
back while it launches: they say which stream NCCL ran it on (the stream of
the events it records last), and its accesses are placed there, between
NCCL's wait for the current stream and its end event, as on CPU. Pinned host memory is followed
too, with the host as its own party (see ``streamfuzz.fuzz.oracles.lifetime``). Imported
only when the lifetime oracle runs on CUDA, so a mistake here cannot break CPU
runs.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from streamfuzz.fuzz.dispatch_mode import (
    RECORD_STREAM,
    DispatchMode,
    current_stream_handle,
    run_op,
    unobserved,
)
from streamfuzz.fuzz.frames import user_code
from streamfuzz.fuzz.oracles.lifetime import TensorTracker
from streamfuzz.fuzz.oracles.lifetime_model import LifetimeModel
from streamfuzz.fuzz.oracles.ops import is_collective
from streamfuzz.fuzz.tensors import HOST

_active: CudaLifetimeChecker | None = None
_installed = False


def _forward(method: str) -> Any:
    def callback(*args: Any) -> None:
        checker = _active
        if checker is not None:
            held = getattr(checker._launching, "calls", None)
            if held is not None:  # a c10d op launching on this thread
                held.append((method, args))
                return
            checker._guarded(getattr(checker, method), *args, torch_ops=False)
    return callback


def _install() -> None:
    """Register the trace callbacks once per process; they forward to the active checker."""
    global _installed
    if _installed:
        return
    from torch.cuda import _gpu_trace as trace

    trace.register_callback_for_event_record(_forward("_on_event_record"))
    trace.register_callback_for_event_wait(_forward("_on_event_wait"))
    trace.register_callback_for_event_synchronization(_forward("_on_event_sync"))
    trace.register_callback_for_stream_synchronization(_forward("_on_stream_sync"))
    trace.register_callback_for_device_synchronization(_forward("_on_device_sync"))
    torch._C._activate_gpu_trace()
    _installed = True


class _CudaDispatch(DispatchMode):
    """The checker's mode; while a handler call runs, also the reuse oracle's
    (``reuse``): one trip into Python per op for both."""

    def __init__(self, checker: CudaLifetimeChecker) -> None:
        super().__init__()
        self.checker = checker
        self.reuse: Any = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        checker = self.checker
        if is_collective(func):
            launching = checker._launching
            launching.calls = calls = []
            try:
                out = run_op(func, args, kwargs)
            except BaseException:
                launching.calls = None
                for method, a in calls:
                    checker._guarded(getattr(checker, method), *a, torch_ops=False)
                raise
            launching.calls = None
            checker._guarded(checker._on_collective, func, args, kwargs, out, calls)
        else:
            out = run_op(func, args, kwargs)
            if func is RECORD_STREAM:
                checker._guarded(checker._on_record_stream, args[0], args[1])
                return out
            checker._guarded(checker._on_op, func, args, kwargs, out)
        if self.reuse is not None:
            self.reuse.observe(func, args, kwargs, out)
        return out


_HOST_READS = ("tolist", "numpy")
"""Tensor methods by which the host reads pinned memory with no aten op saying so."""


def _host_read_method(name: str, method: Any) -> Any:
    label = f"Tensor.{name}"

    def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        checker = _active
        if checker is not None and self.is_cpu:
            checker._guarded(checker.host_read, self, label)
        return method(self, *args, **kwargs)
    read.__name__ = read.__qualname__ = name
    return read


def _query_method(method: Any, sync: str, handle: str) -> Any:
    """``query`` of an event or stream: True tells the program that the work
    is done, as a synchronize would, though no trace callback says so. A poll
    from the harness's own code (the reuse oracle's) is not the program's."""

    def query(self: Any) -> bool:
        done = method(self)
        checker = _active
        if done and checker is not None and user_code(sys._getframe(1).f_code.co_filename):
            checker._guarded(getattr(checker, sync), getattr(self, handle), torch_ops=False)
        return done
    query.__name__ = query.__qualname__ = "query"
    return query


def _resize_method(method: Any) -> Any:
    """``UntypedStorage.resize_``: a free of the storage's block and a new
    allocation, which no op or trace callback reports."""

    def resize_(self: torch.UntypedStorage, size: int) -> Any:
        before = self.nbytes()
        out = method(self, size)
        checker = _active
        if checker is not None:
            checker._guarded(checker._on_resize, self, before)
        return out
    return resize_


def _patches() -> list[tuple[type, str, Any]]:
    """(class, method name, wrapper maker) for every method ``_HostReads`` wraps."""
    return ([(torch.Tensor, name, lambda m, n=name: _host_read_method(n, m))
             for name in _HOST_READS]
            + [(torch.cuda.Event, "query", lambda m: _query_method(m, "_on_event_sync",
                                                                   "cuda_event")),
               (torch.cuda.Stream, "query", lambda m: _query_method(m, "_on_stream_sync",
                                                                    "cuda_stream")),
               (torch.UntypedStorage, "resize_", _resize_method)])


class _HostReads:
    """While a checker is attached, the methods by which the host learns what
    the device did with no aten op or trace callback saying so: ``tolist`` and
    ``numpy`` on ``torch.Tensor`` (the host reads pinned memory), ``query`` on
    ``torch.cuda.Event`` and ``torch.cuda.Stream`` (True: the work is done);
    and ``UntypedStorage.resize_``, which frees and allocates unreported.

    Not a ``TorchFunctionMode``: a mode runs Python for every torch call and
    every tensor attribute of the whole example, to catch five methods.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> None:
        for owner, name, wrap in _patches():
            self._saved.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, wrap(getattr(owner, name)))

    def __exit__(self, *exc: Any) -> None:
        for owner, name, own in reversed(self._saved):
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
        self._saved.clear()


class CudaLifetimeChecker(TensorTracker):
    """The lifetime oracle on real CUDA streams (see the module docstring)."""

    def __init__(self, streams: Any, rank: int | None = None, group_rank: int = 0) -> None:
        super().__init__(LifetimeModel(rank, {}), group_rank)
        self.streams = streams
        self.device = streams.device
        self.main = streams.current_stream().cuda_stream
        self.model.stream_names[self.main] = "main"
        self.model.new_stream(self.main)
        self._mode = _CudaDispatch(self)
        self._reads = _HostReads()
        self._lock = threading.RLock()
        self._handles: dict[tuple[int, int, int], int] = {}
        self._launching = threading.local()
        """``calls``: the trace callbacks of the c10d op this thread is launching."""
        self._works: dict[int, int] = {}
        """Events NCCL recorded after a collective's end event (its future's):
        waiting on one is waiting for that collective's work (its end event)."""

    @property
    def mode(self) -> _CudaDispatch:
        """The dispatch mode the reuse oracle can watch from (``ReuseWatch.share``)."""
        return self._mode

    def attach(self) -> CudaLifetimeChecker:
        global _active
        _install()
        _active = self
        self._mode.__enter__()
        self._reads.__enter__()
        return self

    def detach(self) -> None:
        global _active
        if _active is self:
            _active = None
            self._reads.__exit__(None, None, None)
            self._mode.__exit__(None, None, None)

    def _invoke(self, fn: Any, args: tuple, torch_ops: bool) -> None:
        """One event at a time from whichever thread. With ``torch_ops``, the
        torch calls ``fn`` makes (reading a tensor's memory kind) are hidden
        from every dispatch mode: they are not the user's. A trace callback
        makes none, and goes without."""
        with self._lock:
            if torch_ops:
                with unobserved():
                    fn(*args)
            else:
                fn(*args)

    def _sid(self, handle: int) -> int:
        if handle not in self.model.stream_names:
            # Its creation site's name, or the user's (``CudaStreams.name_of``).
            self.model.stream_names[handle] = self.streams.name_of(handle)
        return handle

    def name_stream(self, s: Any, name: str) -> None:
        """Call stream ``s`` ``name`` in findings (``streamfuzz.Check.name``)."""
        self.streams.name_stream(s, name)
        self.model.stream_names[s.cuda_stream] = name

    def _current(self) -> int:
        # A raw handle at every op: no Stream object made.
        return self._sid(current_stream_handle(self.device))

    def name(self, t: torch.Tensor, name: str, s: Any = None,  # type: ignore[override]
             made_by: str = "a host copy") -> None:
        handle = s.cuda_stream if s is not None else current_stream_handle(self.device)
        super().name(t, name, self._sid(handle), made_by)

    def describe(self, reads: list[torch.Tensor], writes: list[torch.Tensor], label: str,
                 stream: Any) -> None:
        """Opaque work (``streamfuzz.fuzz.annotations``) on ``stream`` (None: the current
        one; ``HOST``: the host)."""
        if isinstance(stream, str):
            s: Any = HOST
        else:
            s = self._sid(stream.cuda_stream if stream is not None
                          else current_stream_handle(self.device))
        self._guarded(self.opaque, reads, writes, label, s)

    # -- dispatch ---------------------------------------------------------------
    def _on_record_stream(self, t: torch.Tensor, stream: Any) -> None:
        # The op's stream argument is a torch.Stream (ids, no handle): a
        # torch.cuda.Stream made from it once per stream gives the handle.
        ids = (stream.stream_id, stream.device_index, stream.device_type)
        handle = self._handles.get(ids)
        if handle is None:
            handle = self._handles[ids] = torch.cuda.Stream(
                stream_id=ids[0], device_index=ids[1], device_type=ids[2]).cuda_stream
        self.record_stream(t, self._sid(handle))

    def _on_resize(self, storage: torch.UntypedStorage, before: int) -> None:
        self.resize(storage, before, self._current())

    def _on_op(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        # Blocking copies and .item() make the host wait: TensorTracker.op says so.
        self.op(func, args, kwargs, out, self._current())

    def _on_collective(self, func: Any, args: tuple, kwargs: dict, out: Any,
                       calls: list[tuple[str, tuple]]) -> None:
        """A c10d op and the trace callbacks its launch made. NCCL records its
        end event (then its future's) on the stream it ran the op on, last;
        before that it made that stream wait for the current one. Where that
        stream is the current one (a blocking collective, which NCCL runs
        there), or the op recorded nothing, the op is an op on the current stream."""
        s = self._current()
        tail = len(calls)
        backend = None
        while tail and calls[tail - 1][0] == "_on_event_record":
            stream = calls[tail - 1][1][1]
            if backend is not None and stream != backend:
                break
            backend = stream
            tail -= 1
        names = self.model.stream_names
        if backend is not None and backend not in names:
            known = sum(n.startswith("nccl(") for n in names.values())
            names[backend] = f"nccl(stream {known + 1})"
        for method, a in calls[:tail]:
            getattr(self, method)(*a)
        if backend is None or backend == s:
            self.op(func, args, kwargs, out, s)
            for method, a in calls[tail:]:
                getattr(self, method)(*a)
            return
        work = calls[tail][1][0]
        self._works.pop(work, None)
        self.op(func, args, kwargs, out, s, on=(backend, work))
        for _, (event, _stream) in calls[tail + 1:]:
            self._works[event] = work
            self.model.record_event(event, backend)

    # -- trace callbacks --------------------------------------------------------
    def _on_event_record(self, event: int, stream: int) -> None:
        # No poll: a record moves no other party's clock, so a free seen at the
        # next op or stream call is judged the same. Records are most of the
        # callbacks (every collective, pinned copy and reuse-watch note).
        if self._works:
            self._works.pop(event, None)
        self.model.record_event(event, self._sid(stream))

    def _on_event_wait(self, event: int, stream: int) -> None:
        self._poll()
        waiter = self._sid(stream)
        work = self._works.get(event, event)
        if work in self.model.held:  # waiting for an async collective's handle
            self.model.wait_work(waiter, work)
            if work == event:
                return
        self.model.wait_event(waiter, event)

    def _on_event_sync(self, event: int) -> None:
        self._poll()
        self.model.sync_event(event)

    def _on_stream_sync(self, stream: int) -> None:
        self._poll()
        self.model.sync_stream(self._sid(stream))

    def _on_device_sync(self) -> None:
        self._poll()
        self.model.sync_device()
