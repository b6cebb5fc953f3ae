"""The lifetime oracle: cross-stream lifetime and ordering races, from one run.

Timing-based detection needs the bad interleaving to happen; this oracle does
not. It keeps a vector clock per stream and per recorded event, built only
from the synchronization the program asked for (event record/wait,
``wait_stream``, host synchronization), so one run judges every interleaving
that synchronization allows. Two rules:

* ``lifetime``: when a storage is freed, the caching allocator may hand its
  block to the next allocation on the allocating stream. Every use from
  another stream must be ordered before that stream's current point, or the
  using stream must have been recorded with ``record_stream``.
* ``race``: a read and a write (or two writes) of a live storage from
  different streams must be ordered.

The host is a party of its own, with its own clock: it touches pinned host
memory directly (device memory only through the streams), and its accesses
are ordered with the streams' only by host syncs (``Stream/Event.synchronize``,
``torch.cuda.synchronize``, a blocking copy, ``.item()``, ``.tolist()``);
``wait_stream`` and events order streams, never the host. Pageable host
memory is not followed: copies to or from it are synchronous for the host.
Pinned memory has no free rule: the host allocator keeps a block until the
streams that used it are done.

Collectives are modelled as NCCL runs them: enqueued on the current stream,
not blocking the host (gloo blocks the host, which would hide the bug).

The checker holds no tensor: only ``StorageWeakRef``s and plain metadata, so
it cannot keep a storage alive and hide the very bug it looks for. Frees are
seen by polling the weak references at every op and every stream call.
"""

from __future__ import annotations

from itertools import compress
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.frames import Frames, frames_here, user_code
from streamfuzz.fuzz.oracles.access import StorageInfo
from streamfuzz.fuzz.oracles.lifetime_messages import internal_error
from streamfuzz.fuzz.oracles.lifetime_model import LifetimeModel
from streamfuzz.fuzz.oracles.ops import (
    ALLOC_OPS,
    COPY_OPS,
    HOST_SYNC_OPS,
    ONE,
    RECEIVES,
    REDUCTIONS,
    is_collective,
    op_info,
    result_tensors,
)
from streamfuzz.fuzz.oracles.spans import Span, indexed, indexed_span, union, view_span
from streamfuzz.fuzz.tensors import DEVICE, HOST, PAGEABLE, PINNED, tensors_in
from streamfuzz.fuzz.verdict import Failure

__all__ = ["DEVICE", "HOST", "LifetimeChecker", "LifetimeModel", "TensorTracker",
           "frames_here", "internal_error", "is_collective", "tensors_in", "user_code"]

_op_info = op_info  # the name tests read an op's schema facts by
_Leaf = tuple[torch.Tensor, int, str | None]
"""A followed tensor of an op: the tensor, its storage key, its memory kind."""
_expired = torch.UntypedStorage._expired
"""Whether a storage weak reference's storage is gone (what ``StorageWeakRef.expired`` asks)."""
_RESIZE = "UntypedStorage.resize_"


def _itemsize(dtype: str) -> int:
    """The bytes of one element of a dtype as reports name it (``float32``)."""
    return getattr(torch, dtype).itemsize


class TensorTracker:
    """Turns ops on tensors into model accesses; shared by the CPU and CUDA adapters.

    It follows device memory and pinned host memory (``kind``). An op that
    touches device memory runs on stream ``s``; any other op runs on the host.
    """

    def __init__(self, model: LifetimeModel, my_group_rank: int = 0) -> None:
        self.model = model
        self.group_rank = my_group_rank
        self._error: str | None = None
        """A bug of the checker's own, once one was met: it checks no more."""
        self.names: dict[int, str] = {}
        self._live: dict[int, int] = {}
        """Each followed storage's weak reference as the raw handle ``poll`` tests,
        in the model's order (polled at every op: one dict, no attribute lookups)."""
        self._emptied: dict[int, StorageInfo] = {}
        """Storages ``resize_(0)`` left with no memory, as they were before it:
        their next allocation is reported with their dtype and name."""

    @property
    def step(self) -> int | None:
        return self.model.step

    @step.setter
    def step(self, value: int | None) -> None:
        self.model.step = value

    def kind(self, t: torch.Tensor) -> str:
        """``DEVICE`` (CUDA), ``PINNED`` or ``PAGEABLE``: what memory ``t`` lives in.
        Asked of every tensor of every op: ``is_cuda`` makes no device object."""
        if t.is_cuda:
            return DEVICE
        return PINNED if t.is_cpu and t.is_pinned() else PAGEABLE

    def _classify(self, t: Any) -> tuple[int | None, str | None]:
        """(storage key or None where not followed, memory kind or None for a non-tensor)."""
        if not isinstance(t, torch.Tensor):
            return None, None
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):
            key = None
        if key is not None and not t.is_cuda and key in self.model.storages:
            # Host memory followed already is pinned: no ``is_pinned`` (on a CUDA
            # build, a driver query) again. Callers poll first, so a key here
            # is a live storage's, never a freed one's reused address.
            return key, PINNED
        kind = self.kind(t)
        return (None if kind == PAGEABLE else key), kind

    def _key(self, t: Any) -> int | None:
        return self._classify(t)[0]

    def _follow(self, t: torch.Tensor, key: int, s: Any, op: str, frames: Frames,
                kind: str | None = DEVICE, filled: bool = True) -> None:
        """Start following a storage the model does not know yet (``filled``:
        see ``LifetimeModel.allocate``)."""
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)
        owner = HOST if kind == PINNED else s
        info = self.model.allocate(key, ref, owner, tuple(t.shape), str(t.dtype).replace(
            "torch.", ""), op, frames, filled, storage.nbytes())
        info.name = self.names.pop(key, None)
        self._live[key] = ref.cdata

    def poll(self, frames: Frames | None = None) -> None:
        """For the runner: report what was freed since the last event, at
        ``frames`` (default: here), so a report's free frame is the runner's
        line, not a later op's."""
        self._guarded(self._poll, frames)

    def name(self, t: torch.Tensor, name: str, s: Any, made_by: str = "a host copy") -> None:
        """For the runner: give ``t``'s storage a name for reports; keeps no
        reference. A storage not followed yet is followed from here, made
        on ``s`` by ``made_by`` (a tensor the runner made unseen)."""
        self._guarded(self._name, t, name, s, made_by)

    def _guarded(self, fn: Any, *args: Any, torch_ops: bool = True) -> None:
        """``fn(*args)`` unless a bug of the checker's own was met; a bug now
        becomes one finding (``_failed``), never the code under test's crash.
        ``torch_ops``: whether ``fn`` may call torch (see ``_invoke``)."""
        if self._error is not None:
            return
        stages.enter(stages.LIFETIME)
        try:
            self._invoke(fn, args, torch_ops)
        except Exception as exc:
            self._failed(exc)
        finally:
            stages.leave()

    def _invoke(self, fn: Any, args: tuple, torch_ops: bool) -> None:
        fn(*args)

    def _poll(self, frames: Frames | None = None) -> Frames | None:
        """Report the storages freed since the last call; returns the frames
        they were reported with (``frames``, walked here when None and needed),
        so that an op walks the stack once."""
        # Called at every op: the weak references are tested directly, without
        # StorageWeakRef.expired's two Python calls per storage, in one C loop.
        live = self._live
        dead = list(compress(live, map(_expired, live.values())))
        if dead:
            frames = frames if frames is not None else frames_here()
            for k in dead:
                del live[k]
                self.model.free(k, frames)
        return frames

    def _name(self, t: torch.Tensor, name: str, s: Any, made_by: str) -> None:
        self._poll()
        key, kind = self._classify(t)
        if key is None:
            return
        if key not in self.model.storages:  # the frames only for a storage first seen here
            self._follow(t, key, s, made_by, frames_here(), kind)
        self.model.storages[key].name = name

    def storage_kind(self, storage: torch.UntypedStorage) -> str:
        """What memory a storage is: ``kind``, asked of a storage with no tensor."""
        if storage.is_cuda:
            return DEVICE
        return PINNED if storage.is_pinned() else PAGEABLE

    def resize(self, storage: torch.UntypedStorage, before: int, s: Any) -> None:
        """``storage.resize_(n)`` from ``before`` bytes, issued on ``s``: the
        block it had is freed (the lifetime rule judges it there) and, unless
        ``n`` is 0, a new one is allocated on ``s``, its contents copied from
        the old one by ``s`` where both have any. Memory-saving code frees
        memory this way and keeps the tensor (FSDP's reshard, a stash)."""
        frames = self._poll() or frames_here()
        key = storage._cdata
        kind = self.storage_kind(storage)
        if kind == PAGEABLE:
            return
        party = HOST if kind == PINNED else s
        model = self.model
        old = model.storages.get(key)
        after = storage.nbytes()
        if old is not None:
            if before and after:
                model.access(key, party, False, _RESIZE, frames)
            del self._live[key]
            model.free(key, frames)
        else:  # emptied by an earlier resize_(0): what it held, for the report
            old = self._emptied.pop(key, None)
            if old is not None and _expired(old.ref.cdata):
                old = None
        if not after:
            if old is not None:
                self._emptied[key] = old
            return
        dtype = old.dtype if old is not None else "uint8"
        ref = StorageWeakRef(storage)
        info = model.allocate(key, ref, party, (after // _itemsize(dtype),), dtype, _RESIZE,
                              frames, filled=bool(before), nbytes=after)
        info.name = old.name if old is not None else self.names.pop(key, None)
        self._live[key] = ref.cdata

    def record_stream(self, t: torch.Tensor, s: Any) -> None:
        self._poll()
        key = self._key(t)
        if key is not None:
            self.model.record_stream(key, s)

    def host_read(self, t: torch.Tensor, op: str) -> None:
        """The host reads ``t``'s data directly (``tolist``, ``numpy``): no aten op says so."""
        frames = self._poll()
        key, kind = self._classify(t)
        if key is None:
            return  # pageable memory: not followed, so no frames walked for it
        if kind == DEVICE:
            return  # a blocking copy first, which the op that makes it reports
        if frames is None:
            frames = frames_here()
        if key not in self.model.storages:
            self._follow(t, key, HOST, op, frames, kind, filled=False)
        self.model.access(key, HOST, False, op, frames,
                          view_span(t, self.model.storages[key].nbytes))

    def op(self, func: Any, args: tuple, kwargs: dict, out: Any, s: Any,
           on: tuple[Any, Any] | None = None) -> None:
        """One aten or c10d op issued while ``s`` was the current stream.

        ``on``: for an async collective, (the backend stream it runs on, its
        work handle's key): it runs after ``s``'s work so far, and what orders
        it with later work is a wait for the handle (``LifetimeModel.wait_work``).
        """
        frames = self._poll()
        name, label, arg_names, arg_writes, view_op, collective, slots = op_info(func)
        storages = self.model.storages
        # A kind is None where a slot held no tensor (see _classify).
        reads: list[_Leaf] = []
        writes: list[_Leaf] = []
        kinds: set[str | None] = set()
        host_writes: set[str | None] = set()
        in_keys: set[int] = set()
        view = False
        if collective:
            self._collective(name, arg_names, arg_writes, args, kwargs, reads, writes, kinds)
        else:
            self._arguments(slots, args, kwargs, reads, writes, kinds, host_writes, in_keys)
            view = view_op
        fresh: list[_Leaf] = []
        if not view and not collective:  # a collective returns its arguments (and a work)
            fresh = self._results(out, args, arg_writes, in_keys, kinds, host_writes)
        used = reads + writes
        if frames is None:  # walked only where something is recorded (not for
            # host-only ops, nor for views of storages already followed)
            frames = frames_here() if (fresh or (used and not view) or any(
                k not in storages for _, k, _ in used)) else ()
        # Device memory is only ever touched by a stream; everything else is the host's.
        party = s if DEVICE in kinds else HOST
        for leaf, key, kind in used:
            if key not in storages:  # made before the checker saw it: no write of its own
                self._follow(leaf, key, party, label, frames, kind, filled=False)
        if view:
            return  # metadata only, no data touched
        backend = on if on is not None and party != HOST else None
        if backend is not None:
            self.model.wait_stream(backend[0], party)
            party = backend[0]
        self._access(name, label, party, reads, writes, frames, args, kwargs)
        access = self.model.access
        for leaf, key, kind in fresh:
            if key not in storages:
                self._follow(leaf, key, party, label, frames, kind,
                             filled=name not in ALLOC_OPS)
                if kind == PINNED and party != HOST:
                    access(key, party, True, label, frames)  # a copy into it
        if backend is not None:
            self.model.hold(backend[1], party, [k for _, k, _ in used])
        elif party != HOST and (name in HOST_SYNC_OPS
                                or self._blocking_copy(name, args, kwargs, kinds, host_writes)):
            self.model.sync_stream(s)

    def _arguments(self, slots: tuple[tuple[int, str, bool, int], ...], args: tuple,
                   kwargs: dict, reads: list[_Leaf], writes: list[_Leaf],
                   kinds: set[str | None], host_writes: set[str | None],
                   in_keys: set[int]) -> None:
        """Sort an op's tensor arguments into ``reads`` and ``writes`` (those
        followed), noting every memory kind met and which the host writes."""
        classify = self._classify
        n_args = len(args)
        for i, arg_name, write, holds in slots:
            arg = args[i] if i < n_args else kwargs.get(arg_name) if kwargs else None
            if arg is None:
                continue
            if holds == ONE:
                leaves: Any = (arg,)
            elif isinstance(arg, torch.Tensor):
                leaves = (arg,)
            elif isinstance(arg, (list, tuple)):
                leaves = tensors_in(arg)
            else:
                continue
            for leaf in leaves:
                key, kind = classify(leaf)
                kinds.add(kind)
                if write and kind != DEVICE:
                    host_writes.add(kind)
                if key is not None:
                    in_keys.add(key)
                    (writes if write else reads).append((leaf, key, kind))

    def _results(self, out: Any, args: tuple, arg_writes: tuple[bool, ...], in_keys: set[int],
                 kinds: set[str | None], host_writes: set[str | None]) -> list[_Leaf]:
        """An op's results that are storages new to the model (to follow)."""
        storages = self.model.storages
        fresh: list[_Leaf] = []
        # An in-place op's result is its first argument, classified already.
        written = args[0] if args and arg_writes and arg_writes[0] else None
        for leaf in result_tensors(out):
            if leaf is written:
                continue
            key, kind = self._classify(leaf)
            if key is None or (key not in in_keys and key not in storages):
                kinds.add(kind)
                if kind != DEVICE:
                    host_writes.add(kind)
                if key is not None:
                    fresh.append((leaf, key, kind))
        return fresh

    def _access(self, name: str, label: str, party: Any, reads: list[_Leaf],
                writes: list[_Leaf], frames: Frames, args: tuple, kwargs: dict) -> None:
        """The model's accesses of an op's reads and writes, one per storage and kind."""
        access = self.model.access
        first = args[0] if args and indexed(name) else None
        for table, write in ((reads, False), (writes, True)):
            if len(table) == 1:  # the usual op: no dict built to join one key's spans
                leaf, key, _ = table[0]
                access(key, party, write, label, frames, self._span(name, leaf, key, first,
                                                                     args, kwargs))
            elif table:
                spans: dict[int, Span] = {}
                for leaf, key, _ in table:
                    span = self._span(name, leaf, key, first, args, kwargs)
                    spans[key] = union(spans[key], span) if key in spans else span
                for key, span in spans.items():
                    access(key, party, write, label, frames, span)

    def _span(self, name: str, leaf: torch.Tensor, key: int, first: Any, args: tuple,
              kwargs: dict) -> Span:
        """The bytes of its storage ``leaf`` is touched at: an indexed op's
        first argument where its indices say, any other tensor its view."""
        nbytes = self.model.storages[key].nbytes
        if leaf is first:
            return indexed_span(name, args, kwargs, nbytes)
        return view_span(leaf, nbytes)

    def opaque(self, reads: list[torch.Tensor], writes: list[torch.Tensor], label: str,
               s: Any) -> None:
        """Work no op reports (a raw kernel, a copy through a driver call or
        RDMA), as its caller describes it: it reads ``reads`` and writes
        ``writes`` on ``s`` (``HOST``: the host itself), enqueued now."""
        frames = self._poll() or frames_here()
        model = self.model
        touched: list[tuple[int, Span, bool]] = []
        for write, tensors in ((False, reads), (True, writes)):
            for t in tensors:
                key, kind = self._classify(t)
                if key is None:
                    continue  # pageable memory: the host's own, not followed
                if kind == DEVICE and s == HOST:
                    raise ValueError(f"{label}: the host cannot touch device memory directly; "
                                     f"name the stream the work runs on")
                if key not in model.storages:
                    self._follow(t, key, s, label, frames, kind, filled=False)
                touched.append((key, view_span(t, model.storages[key].nbytes), write))
        for key, span, write in touched:
            model.access(key, s, write, label, frames, span)

    @staticmethod
    def _blocking_copy(name: str, args: tuple, kwargs: dict, kinds: set[str | None],
                       host_writes: set[str | None]) -> bool:
        """A copy between device and host memory that the host waits for: every
        blocking one, and a non-blocking one into pageable memory (CUDA copies
        it synchronously)."""
        if name not in COPY_OPS or kinds <= {DEVICE}:
            return False
        non_blocking = kwargs.get("non_blocking") or (name == "aten::copy_" and len(args) > 2
                                                      and bool(args[2]))
        return not non_blocking or PAGEABLE in host_writes

    def _collective(self, name: str, arg_names: tuple[str, ...], arg_writes: tuple[bool, ...],
                    args: tuple, kwargs: dict, reads: list, writes: list,
                    kinds: set[str | None]) -> None:
        """c10d ops as NCCL runs them: async on the current stream. Their
        tensors are in lists (or lists of lists), never in other containers."""
        if name == "c10d::broadcast_" and len(args) > 2:  # the usual call: two arguments read
            bound = {"tensors": args[0], "root_rank": args[2]}
        else:
            bound = {**dict(zip(arg_names, args)), **kwargs}
        if name == "c10d::broadcast_":
            target = reads if bound.get("root_rank", 0) == self.group_rank else writes
            for leaf in tensors_in(bound.get("tensors")):
                key, kind = self._classify(leaf)
                kinds.add(kind)
                if key is not None:
                    target.append((leaf, key, kind))
            return
        receive = name in RECEIVES
        for arg_name, write in zip(arg_names, arg_writes):
            for leaf in tensors_in(bound.get(arg_name)):
                key, kind = self._classify(leaf)
                kinds.add(kind)
                if key is not None:
                    # Reduction buffers are read and written; a receive only writes.
                    if not receive:
                        reads.append((leaf, key, kind))
                    if write or receive or "output" in arg_name or name in REDUCTIONS \
                            or name.startswith("c10d::allreduce"):
                        writes.append((leaf, key, kind))

    def _failed(self, exc: Exception) -> None:
        """A bug in the checker, not in the code under test: one finding that
        says so and where, and no more checking this example (the model missed
        an event, so what it said next could be wrong). The example runs on."""
        found = internal_error("lifetime", exc, self.model.rank, self.model.step)
        self._error = found.message
        self.model.findings.append(found)

    def finish(self) -> list[Failure]:
        self._guarded(self._poll)
        return self.model.report()


class LifetimeChecker(TensorTracker):
    """A ``SimStreams`` listener: the model fed by simulated CPU streams."""

    def __init__(self, streams: Any, rank: int | None = None, group_rank: int = 0) -> None:
        self.streams = streams
        names: dict[Any, str] = {0: "main"}
        super().__init__(LifetimeModel(rank, names), group_rank)
        self.model.new_stream(0)

    def attach(self) -> LifetimeChecker:
        self.streams.listeners.append(self)
        self.streams.unfinished = self.unfinished
        return self

    def detach(self) -> None:
        if self in self.streams.listeners:
            self.streams.listeners.remove(self)
        if self.streams.unfinished == self.unfinished:
            self.streams.unfinished = None

    def unfinished(self, polled: Any) -> bool:
        """Whether the host does not know a polled stream's, event's or work
        handle's work done (``SimStreams.hold_polls``)."""
        key = getattr(polled, "event_id", None)
        if key is None:
            key = getattr(polled, "key", None)
        if key is not None:
            return self.model.unfinished_event(key)
        return self.model.unfinished_stream(self._sid(polled))

    def _sid(self, s: Any) -> int:
        sid = s.stream_id
        if sid not in self.model.stream_names:
            self.model.stream_names[sid] = self.streams.name_of(s)
        return sid

    def kind(self, t: torch.Tensor) -> str:
        """CPU tensors stand for every kind of memory: the simulation says which."""
        return self.streams.memory.kind(t)

    def storage_kind(self, storage: torch.UntypedStorage) -> str:
        return self.streams.memory.key_kind_of(storage._cdata)

    def _classify(self, t: Any) -> tuple[int | None, str | None]:
        if not isinstance(t, torch.Tensor):
            return None, None
        key, kind = self.streams.memory.key_kind(t)
        return (None if kind == PAGEABLE else key), kind

    def name(self, t: torch.Tensor, name: str, s: Any = None,  # type: ignore[override]
             made_by: str = "a host copy") -> None:
        super().name(t, name, self._sid(s or self.streams.current_stream()), made_by)

    def name_stream(self, s: Any, name: str) -> None:
        """Call stream ``s`` ``name`` in findings (``streamfuzz.Check.name``)."""
        self.streams.name_stream(s, name)
        self.model.stream_names[self._sid(s)] = name

    def __call__(self, what: str, *args: Any) -> None:
        self._guarded(self._handle, what, args)

    def _handle(self, what: str, args: tuple) -> None:
        if what == "op":
            func, a, kw, out, s = args
            self.op(func, a, kw, out, self._sid(s))
            return
        if what == "async_op":
            func, a, kw, out, s, handle = args
            self.model.stream_names.setdefault(handle.stream, handle.stream_name)
            self.op(func, a, kw, out, self._sid(s), on=(handle.stream, handle.key))
            return
        if what == "host_read":
            self.host_read(*args)
            return
        if what == "resize":
            storage, before, s = args
            self.resize(storage, before, self._sid(s))
            return
        if what == "opaque":
            reads, writes, label, s = args
            self.opaque(reads, writes, label, HOST if s == HOST else self._sid(s))
            return
        self._poll()
        m = self.model
        if what == "record_stream":
            self.record_stream(args[0], self._sid(args[1]))
        elif what == "new_stream":
            m.new_stream(self._sid(args[0]))
        elif what == "wait_stream":
            m.wait_stream(self._sid(args[0]), self._sid(args[1]))
        elif what == "record_event":
            m.record_event(args[0].event_id, self._sid(args[1]))
        elif what == "wait_event":
            m.wait_event(self._sid(args[0]), args[1].event_id)
        elif what == "sync_stream":
            m.sync_stream(self._sid(args[0]))
        elif what == "sync_event":
            m.sync_event(args[0].event_id)
        elif what == "sync_device":
            m.sync_device()
        elif what == "wait_work":
            m.wait_work(self._sid(args[1]), args[0].key)
