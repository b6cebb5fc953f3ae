"""Ops and c10d calls under simulated streams: the dispatch mode of CUDA on CPU.

Every aten op runs at once, in program order, and goes to the listeners with
the stream it was issued on; ``record_stream``, which CPU tensors have no
kernel for, becomes an event for them. A c10d call runs on private copies of
its tensors, as NCCL runs it: the caller goes on once it is enqueued
(``_collective``), and an async call's work handle is a ``Handle``.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any, cast

import torch
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
    ProcessGroup,
    Work,
    _create_work_from_future,
)
from torch.multiprocessing.reductions import StorageWeakRef

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.dispatch_mode import BROADCAST, RECORD_STREAM, DispatchMode, run_op, unobserved
from streamfuzz.fuzz.sim.stream_types import running

Streams = Any
"""A ``streamfuzz.fuzz.streams.SimStreams``: the simulation an op or a call runs on."""


_handle_keys = itertools.count(1)

class SimDispatch(DispatchMode):
    """Routes every aten op through the listeners; executes ``record_stream``.

    CPU tensors have no ``record_stream`` kernel; here it becomes an event for
    the listeners, which is exactly the information a lifetime checker needs.
    Collectives run on private copies (``_collective``).
    """

    def __init__(self, api: Streams) -> None:
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
                api: Streams) -> tuple[Any, Handle | None]:
    """Run a c10d op on copies of its tensors and copy the results back; the
    op's result, and the handle of an async call (``Handle``), else None.

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
                api.receive(Receiving(work, pairs), programs)
            if not asynchronous:
                return _back((tensors, _finished(programs)), originals), None
            handle = Handle(api, func, args, kwargs, programs, None)
            return _back((tensors, handle.boxed()), originals), handle
        handles: list[Handle] = []

        def finished(work: Any) -> Any:
            if not asynchronous:
                return _finished(programs)
            source = Work.unbox(work)._source_rank() if func is _RECV_ANY_SOURCE else None
            handles.append(Handle(api, func, args, kwargs, programs, source))
            return handles[-1].boxed()

        out = _waited(out, finished)
        for orig, copy in pairs:
            orig.copy_(copy)
    return _back(out, originals), (handles[0] if handles else None)


class Receiving:
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
    done: torch.futures.Future[Any] = torch.futures.Future()
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


class Handle(Work):
    """The work handle of an async call on simulated streams (an ``isend``, a
    ``broadcast(..., async_op=True)``), as the program gets it.

    NCCL runs such a call on a stream of its own (one per process group, one
    per pair of ranks for point-to-point calls), after the current stream's
    work so far; waiting for the handle makes the waiting thread's current
    stream wait for it, and NCCL holds the call's tensors until then. Here the
    data is there before anything reads it (the call waited for it, or it
    lands first: ``Receiving``); the listeners get the call as ``async_op``
    and each wait as ``wait_work``. A receive from any source keeps the rank
    it came from."""

    def __init__(self, api: Streams, func: Any, args: tuple, kwargs: dict,
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

    def _now(self) -> Streams:
        """The simulated streams running now (a handle kept from an earlier run
        is theirs), else its own: with none running its data has landed."""
        self._api = running() or self._api
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
    def __init__(self, handle: Handle) -> None:
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
    low, high = sorted((group.rank(), cast(int, peer)))
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
