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

import contextlib
import importlib.util
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field, replace
from itertools import compress
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fuzz import stages
from fuzz.oracles.spans import WHOLE, Span, covers, indexed, indexed_span, overlap, union, view_span
from fuzz.sites import display_path, source_line
from fuzz.tensors import DEVICE, HOST, PAGEABLE, PINNED, tensors_in
from fuzz.verdict import Failure

Clock = dict[Any, int]
Frames = tuple[tuple[str, int, str], ...]


def _package_dirs(*names: str) -> tuple[str, ...]:
    """Where these packages live, found without importing them."""
    dirs: list[str] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(str(Path(d)) + os.sep for d in spec.submodule_search_locations)
    return tuple(dirs)


# Never the user's frames: torch, this checker and a checked block's own code.
_SKIP_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parent),
              str(Path(__file__).resolve().parent.parent / "sim") + os.sep,
              *_package_dirs("streamfuzz"))
# Test runners around a checked block: everything outward of them is theirs too,
# and a user's test file, which they call, is user code.
_RUNNER_DIRS = _package_dirs("hypothesis", "_pytest", "pytest", "pluggy", "xdist", "execnet")
# torch's by name (wherever that torch lives); the standard library's and this
# package's by path, so that a user's own streams.py or threads.py stays theirs.
_SKIP_FILES = ("_python_dispatch.py", "distributed_c10d.py", "c10d_logger.py",
               "_gpu_trace.py")
_FUZZ = Path(__file__).parent.parent
_SKIP_PATHS = frozenset(
    p for f in (contextlib.__file__, threading.__file__, _FUZZ / "streams.py",
                _FUZZ / "protocol" / "runner.py")
    for p in (str(f), str(Path(f).resolve())))
# A mode's hook is the harness watching an op, never the code that issued it.
_MODE_HOOKS = frozenset({"__torch_dispatch__", "__torch_function__"})
# Ops that make the host wait for the current stream (a blocking copy to the host).
_HOST_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::equal",
                            "aten::is_nonzero", "aten::masked_select", "aten::unique_dim",
                            "aten::_unique2"})
# Ops that read a tensor's metadata, never its data: no access, like a view.
_METADATA_OPS = frozenset({"aten::is_pinned", "aten::sym_size", "aten::sym_stride",
                           "aten::sym_numel", "aten::sym_storage_offset", "aten::size",
                           "aten::stride", "aten::dim", "aten::numel", "aten::is_contiguous",
                           "aten::is_same_size", "aten::storage_offset"})
_COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::_copy_from",
                       "aten::_copy_from_and_resize"})
_RECEIVES = frozenset({"c10d::recv_", "c10d::recv_any_source_"})
_REDUCTIONS = frozenset({"c10d::reduce_"})
"""c10d ops whose schemas mark no argument written, though they write the
program's tensors: a receive's, and a reduction's on its root."""
_MAX_FINDINGS = 8
_MAX_KEPT = 16
"""The most accesses a storage keeps per stream and kind (older ones merge: more
overlap, never less)."""
_ALLOC_OPS = frozenset({"aten::empty", "aten::empty_strided", "aten::new_empty",
                        "aten::new_empty_strided", "aten::empty_like", "aten::empty_permuted"})
"""Ops that hand out a block and launch nothing: their result holds whatever
the block held, written by no kernel (see ``LifetimeModel.allocate``)."""
_expired = torch.UntypedStorage._expired
"""Whether a storage weak reference's storage is gone (what ``StorageWeakRef.expired`` asks)."""



def _join(into: Clock, other: Clock) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


@dataclass(slots=True)
class Access:
    """One use of a storage: on which stream, at which point, by which op, from
    where, and which of its bytes (``span``). ``alloc``: not a use but the
    allocation itself, standing for the work queued on its stream before it
    that may still use the block (``LifetimeModel.allocate``)."""

    stream: Any
    time: int
    op: str
    write: bool
    frames: Frames
    step: int | None
    span: Span = WHOLE
    alloc: bool = False


def _ordered(a: Access, point: Clock) -> bool:
    """Whether access ``a`` happens before ``point`` on every interleaving."""
    return point.get(a.stream, 0) >= a.time


Accesses = dict[Any, list[Access]]
"""Per stream, its accesses of one kind to one storage that no later one of its own covers."""


def _keep(table: Accesses, now: Access) -> None:
    """Add ``now`` to its stream's accesses, dropping those it covers: a later
    access of the same stream over the same bytes is ordered after them, so
    whatever races with them races with it."""
    kept = table.get(now.stream)
    if kept is None or now.span is WHOLE:
        table[now.stream] = [now]
        return
    kept = [a for a in kept if not covers(now.span, a.span)]
    if len(kept) >= _MAX_KEPT:
        first, second = kept[0], kept[1]
        kept[:2] = [replace(second, span=union(first.span, second.span))]
    kept.append(now)
    table[now.stream] = kept


def _drop_covered(table: Accesses, now: Access) -> None:
    kept = table.get(now.stream)
    if kept:
        kept = [a for a in kept if not covers(now.span, a.span)]
        if kept:
            table[now.stream] = kept
        else:
            del table[now.stream]


@dataclass(slots=True)
class StorageInfo:
    """What the model knows of one live storage (never the storage itself)."""

    key: int
    ref: Any
    stream: Any
    shape: tuple[int, ...]
    dtype: str
    alloc_op: str
    alloc_frames: Frames
    nbytes: int = 0
    name: str | None = None
    recorded: set[Any] = field(default_factory=set)
    writes: Accesses = field(default_factory=dict)
    reads: Accesses = field(default_factory=dict)
    reported: set[tuple[Any, ...]] = field(default_factory=set)
    """The pairs of sites already reported as racing on this storage."""


class LifetimeModel:
    """Vector clocks, storages and the two rules; knows nothing about torch objects.

    Streams and events are plain hashable keys; ``stream_names`` maps them to
    what a report shows. Findings are ``Failure`` objects, sent to the driver as they are.
    """

    def __init__(self, rank: int | None = None,
                 stream_names: dict[Any, str] | None = None) -> None:
        self.rank = rank
        self.step: int | None = None
        self.stream_names = stream_names if stream_names is not None else {}
        self.stream_names.setdefault(HOST, "the host")
        self.host: Clock = {HOST: 0}
        self.clocks: dict[Any, Clock] = {HOST: self.host}
        self.events: dict[Any, Clock] = {}
        self.held: dict[Any, tuple[Any, list[int]]] = {}
        """Async collectives not waited for yet: their stream and storages (``hold``)."""
        self.backends: set[Any] = set()
        """The streams async collectives ran on (``hold``)."""
        self.storages: dict[int, StorageInfo] = {}
        self.freed_at: dict[Any, int] = {}
        """Per stream, its point when it last freed a block of its own (``allocate``)."""
        self.last_freed: dict[Any, tuple[StorageInfo, Frames]] = {}
        """Per stream, the storage it last freed and where: what an allocation may reuse."""
        self.findings: list[Failure] = []
        self.dropped = 0

    # -- clocks --------------------------------------------------------------
    def _clock(self, s: Any) -> Clock:
        c = self.clocks.get(s)
        if c is None:
            c = self.clocks[s] = dict(self.host)
            c.setdefault(s, 0)
        return c

    def _enqueue(self, s: Any) -> Clock:
        """Work enqueued now on ``s`` starts after everything the host has done
        or waited for (for ``s`` the host itself: the host's next access)."""
        c = self._clock(s)
        _join(c, self.host)
        c[s] = c.get(s, 0) + 1
        return c

    def new_stream(self, s: Any) -> None:
        self._clock(s)

    def wait_stream(self, waiter: Any, waited: Any) -> None:
        _join(self._enqueue(waiter), self._clock(waited))

    def record_event(self, event: Any, s: Any) -> None:
        self.events[event] = dict(self._enqueue(s))

    def wait_event(self, s: Any, event: Any) -> None:
        # Waiting on a never-recorded event is a no-op, as in CUDA.
        _join(self._enqueue(s), self.events.get(event, {}))

    def hold(self, work: Any, s: Any, keys: list[int]) -> None:
        """An async collective enqueued on ``s`` (a backend's own stream): its
        work handle is an event, and the backend holds its storages until the
        handle is waited for (what NCCL does instead of ``record_stream``)."""
        self.record_event(work, s)
        self.held[work] = (s, keys)
        self.backends.add(s)
        for key in keys:
            info = self.storages.get(key)
            if info is not None and s != info.stream:
                info.recorded.add(s)

    def wait_work(self, waiter: Any, work: Any) -> None:
        """``waiter`` waits for an async collective's handle, and the backend
        lets its storages go: from now on, their free must be ordered after
        the collective, like any other use."""
        self.wait_event(waiter, work)
        s, keys = self.held.pop(work, (None, ()))
        still = {k for t, ks in self.held.values() if t == s for k in ks}
        for key in keys:
            info = self.storages.get(key)
            if info is not None and key not in still:
                info.recorded.discard(s)

    def unfinished_stream(self, s: Any) -> bool:
        """Whether ``s`` has work the host has not synchronized with."""
        c = self.clocks.get(s)
        return c is not None and c.get(s, 0) > self.host.get(s, 0)

    def unfinished_event(self, event: Any) -> bool:
        """Whether ``event`` was recorded after work the host has not
        synchronized with (a never-recorded event is done, as in CUDA)."""
        host = self.host
        return any(host.get(k, 0) < v for k, v in self.events.get(event, {}).items())

    def sync_stream(self, s: Any) -> None:
        _join(self.host, self._clock(s))

    def sync_event(self, event: Any) -> None:
        _join(self.host, self.events.get(event, {}))

    def sync_device(self) -> None:
        for s, c in self.clocks.items():
            if s != HOST:
                _join(self.host, c)

    # -- storages ------------------------------------------------------------
    def allocate(self, key: int, ref: Any, s: Any, shape: tuple[int, ...], dtype: str,
                 op: str, frames: Frames, filled: bool = True, nbytes: int = 0) -> StorageInfo:
        """A storage first seen on ``s``: its block belongs to ``s`` (pinned
        memory: to the host).

        ``filled``: the op that made it wrote it on ``s`` (a copy, a fill, a
        kernel's result): a write at ``s``'s next point. Otherwise (``empty``,
        or a storage made before the checker started) no kernel touched it:
        what stands in its place is the allocation, at the point ``s`` had
        when it last freed a block, since the work queued on ``s`` until then
        is all that may still use a block it hands out. After a host sync or
        a wait for ``s`` that covers that point, another stream may write the
        new storage at once.
        """
        info = StorageInfo(key=key, ref=ref, stream=s, shape=shape, dtype=dtype,
                           alloc_op=op, alloc_frames=frames, nbytes=nbytes)
        self.storages[key] = info
        if filled:
            c = self._enqueue(s)
            info.writes[s] = [Access(s, c[s], op, True, frames, self.step)]
        else:
            self._clock(s)
            info.writes[s] = [Access(s, self.freed_at.get(s, 0), op, True, frames, self.step,
                                     alloc=True)]
        return info

    def access(self, key: int, s: Any, write: bool, op: str, frames: Frames,
               span: Span = WHOLE) -> None:
        info = self.storages.get(key)
        if info is None:
            return
        c = self._enqueue(s)
        now = Access(s, c[s], op, write, frames, self.step, span)
        self._races(info, info.writes, now, c)
        if write:
            self._races(info, info.reads, now, c)
            _drop_covered(info.reads, now)
            _keep(info.writes, now)
        else:
            _keep(info.reads, now)

    def _races(self, info: StorageInfo, table: Accesses, now: Access, point: Clock) -> None:
        """Report each other stream's access in ``table`` that overlaps ``now``
        and is not ordered before it: once per pair of sites and storage."""
        s = now.stream
        for t, kept in table.items():
            if t == s:
                continue
            seen = point.get(t, 0)
            for prev in kept:
                if seen < prev.time and overlap(prev.span, now.span):
                    sites = (_site(prev), _site(now))
                    if sites not in info.reported:
                        info.reported.add(sites)
                        self._race(info, prev, now)

    def record_stream(self, key: int, s: Any) -> None:
        info = self.storages.get(key)
        if info is not None and s != info.stream:
            info.recorded.add(s)

    def free(self, key: int, frames: Frames) -> None:
        """The rule fires here: a freed block is what the next allocation gets."""
        info = self.storages.pop(key, None)
        if info is None or info.stream == HOST:
            return
        own = self._clock(info.stream)
        self.freed_at[info.stream] = own.get(info.stream, 0)
        self.last_freed[info.stream] = (info, frames)
        uses: dict[Any, Access] = {}
        for table in (info.writes, info.reads):
            for t, kept in table.items():
                for a in kept:
                    if t != info.stream and (t not in uses or a.time > uses[t].time):
                        uses[t] = a
        if not uses:  # only its own stream used it: nothing to order
            return
        # The allocator hands the block out once the work now queued on its own
        # stream and on every recorded stream is done: whatever that work waited for
        # is done too.
        point = dict(self._clock(info.stream))
        _join(point, self.host)
        for r in info.recorded:
            _join(point, self._clock(r))
        for a in uses.values():
            if not _ordered(a, point):
                self._lifetime(info, a, frames)
                break

    # -- reports -------------------------------------------------------------
    def name_of(self, s: Any) -> str:
        return self.stream_names.get(s, str(s))

    def _what(self, info: StorageInfo) -> str:
        shape = "[" + ", ".join(map(str, info.shape)) + "]"
        what = f"{info.dtype}{shape}"
        if info.name:
            return f"{info.name} ({what})"
        return f"a tensor {what} made by {info.alloc_op}"

    def report(self) -> list[Failure]:
        """The findings, the last one saying how many more were left out."""
        found = list(self.findings)
        if self.dropped:
            found[-1] = replace(found[-1], message=found[-1].message + (
                f"\n    ... and {self.dropped} more finding(s) in this "
                f"example, not shown (the first {_MAX_FINDINGS} are)"))
        return found

    def _add(self, kind: str, message: str) -> None:
        if len(self.findings) >= _MAX_FINDINGS:
            self.dropped += 1
            return
        self.findings.append(Failure(kind, message, self.rank, self.step))

    def _lifetime(self, info: StorageInfo, use: Access, free_frames: Frames) -> None:
        alloc = self.name_of(info.stream)
        user = self.name_of(use.stream)
        verb = "writes" if use.write else "reads"
        # A backend's stream is not the program's to record: the stream that
        # waited for the collective's handle is.
        cover = (f"record_stream of a stream that waited for {user}'s work"
                 if use.stream in self.backends else f"record_stream({user})")
        msg = (f"{self._what(info)} was freed while stream {user} may still use it: "
               f"{user} {verb} it ({_at(use)}) and that use is neither ordered "
               f"before {alloc}'s current point nor covered by {cover}; "
               f"the block can be handed to the next allocation on {alloc} "
               f"(allocated on {alloc} by {info.alloc_op})"
               f"\n    freed (seen at):  {_fmt(free_frames)}"
               f"\n    used on {user}:   {_fmt(use.frames)}"
               f"\n    allocated:        {_fmt(info.alloc_frames)}")
        self._add("lifetime", msg)

    def _race(self, info: StorageInfo, prev: Access, now: Access) -> None:
        a, b = self.name_of(prev.stream), self.name_of(now.stream)
        verb = "writes" if now.write else "reads"
        if prev.alloc:
            freed = self.last_freed.get(prev.stream)
            was = (f" (the last it freed: {self._what(freed[0])}, at {_fmt(freed[1])})"
                   if freed is not None else "")
            msg = (f"{'write' if now.write else 'read'}-after-allocation race on "
                   f"{self._what(info)}: {b} {verb} it ({_at(now)}) unordered with its "
                   f"allocation on {a} ({_at(prev)}): the allocator may have handed it a "
                   f"block {a} freed{was} while work queued on {a} before the allocation may "
                   f"still use it; make {b} wait for {a} (wait_stream or an event) first"
                   f"\n    {a}: {_fmt(prev.frames)}"
                   f"\n    {b}: {_fmt(now.frames)}")
            self._add("race", msg)
            return
        kind = ("write-after-write" if prev.write and now.write else
                "read-after-write" if prev.write else "write-after-read")
        msg = (f"{kind} race on {self._what(info)}{_where(info, prev, now)}: {b} {verb} "
               f"it ({_at(now)}) unordered with {a}'s "
               f"{'write' if prev.write else 'read'} ({_at(prev)})"
               f"\n    {a}: {_fmt(prev.frames)}"
               f"\n    {b}: {_fmt(now.frames)}")
        self._add("race", msg)


def _where(info: StorageInfo, prev: Access, now: Access) -> str:
    """Which bytes the two accesses share, where neither is the whole storage."""
    a, b = prev.span, now.span
    if a is None or b is None:  # either is WHOLE (None)
        return ""
    shared = [(max(lo, lo2), min(hi, hi2)) for lo, hi in a for lo2, hi2 in b
              if max(lo, lo2) < min(hi, hi2)]
    if not shared:
        return ""
    lo, hi = shared[0]
    more = f", and {len(shared) - 1} more range(s)" if len(shared) > 1 else ""
    return f", bytes {lo}..{hi} of its {info.nbytes}{more}" if info.nbytes else ""


def _site(a: Access) -> tuple[str, tuple[str, int, str] | None]:
    """Where an access was made: its op and innermost frame."""
    return a.op, a.frames[0] if a.frames else None


def _at(use: Access) -> str:
    """Which op, and in which step where the caller counts steps (a checked block does not)."""
    return use.op if use.step is None else f"{use.op}, step {use.step}"


_SKIP, _USER, _RUNNER = 0, 1, 2
_FILE_KINDS: dict[str, int] = {}
"""Each source file's kind, decided once: frames are walked at every op. Keyed
by file name, not by code object: a code object's hash is not cached (every
lookup hashes its constants and names again), a string's is."""


def user_code(path: str) -> bool:
    """Whether a frame in the file at ``path`` is the code under test's (not
    torch's, the standard library's nor the harness's)."""
    kind = _FILE_KINDS.get(path)
    return (kind if kind is not None else _file_kind(path)) != _SKIP


def _file_kind(path: str) -> int:
    kind = (_RUNNER if path.startswith(_RUNNER_DIRS) else
            _USER if (not path.startswith(_SKIP_DIRS) and not path.endswith(_SKIP_FILES)
                      and path not in _SKIP_PATHS)
            else _SKIP)
    if len(_FILE_KINDS) > 100_000:  # code made at run time, each with a name of its own
        _FILE_KINDS.clear()
    _FILE_KINDS[path] = kind
    return kind


def frames_here(limit: int = 4) -> Frames:
    """The innermost frames of the program under test, as plain strings."""
    out: list[tuple[str, int, str]] = []
    kinds = _FILE_KINDS
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        code = f.f_code
        path = code.co_filename
        kind = kinds.get(path)  # asked at every op: the dict first, the decision once
        if kind is None:
            kind = _file_kind(path)
        if kind == _USER:
            if code.co_name not in _MODE_HOOKS:
                out.append((path, f.f_lineno, code.co_name))
                if len(out) == limit:
                    break
        elif kind == _RUNNER:
            break
        f = f.f_back
    return tuple(out)


_NO_TENSORS: tuple = ()


def _leaves(x: Any) -> Any:
    """``tensors_in`` for the hot path: a tensor or a non-sequence without a list."""
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tensors_in(x)
    return _NO_TENSORS


_NO_TENSOR_TYPES = frozenset({"int", "SymInt", "bool", "number", "float", "complex", "str",
                               "Device", "Generator", "Layout", "ScalarType", "MemoryFormat",
                               "AnyEnumType", "Storage"})
"""Schema argument types that never hold a tensor (after Optional[...] and List[...])."""
_ONE, _MANY = 0, 1
"""How an argument holds tensors: one (``Tensor``, ``Tensor?``), or any number
(a list, or a type the schema does not pin down), found by ``tensors_in``."""


def _holds(type_name: str) -> int | None:
    base = type_name
    while base.startswith(("Optional[", "List[")):
        base = base[base.index("[") + 1:-1]
    if base in _NO_TENSOR_TYPES:
        return None
    return _ONE if type_name in ("Tensor", "Optional[Tensor]") else _MANY


_OpInfo = tuple[str, str, tuple[str, ...], tuple[bool, ...], bool, bool,
                tuple[tuple[int, str, bool, int], ...]]
_OPS: dict[Any, _OpInfo] = {}
"""Per op overload, read from its schema once: (schema name, label, argument
names, which arguments it writes, whether it touches no data: every result
a view, or metadata only, whether it is a collective, and the arguments that
can hold a tensor: (position, name, written, ``_ONE`` or ``_MANY``)). An op's
sizes, scalars and options are never searched for tensors."""


def _op_info(func: Any) -> _OpInfo:
    info = _OPS.get(func)
    if info is None:
        schema = func._schema
        views = [r.alias_info is not None and not r.alias_info.is_write for r in schema.returns]
        writes = tuple(a.alias_info is not None and a.alias_info.is_write
                       for a in schema.arguments)
        slots = tuple((i, a.name, writes[i], holds) for i, a in enumerate(schema.arguments)
                      if (holds := _holds(str(a.type))) is not None)
        info = _OPS[func] = (
            schema.name, str(func).replace(".default", ""),
            tuple(a.name for a in schema.arguments), writes,
            bool(views) and all(views) or schema.name in _METADATA_OPS,
            schema.name.startswith("c10d::"), slots)
    return info


def is_collective(func: Any) -> bool:
    """Whether an op overload is a c10d op (a collective or point-to-point call)."""
    return _op_info(func)[5]


def _short(path: str) -> str:
    return display_path(str(Path(path).resolve()))


def internal_error(oracle: str, exc: BaseException, rank: int | None,
                   step: int | None) -> Failure:
    """A rank-side oracle's own bug as one finding that says whose it is and
    where: read as the target's crash, it would send the user after the wrong code."""
    what = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {_short(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return Failure("crash", f"{oracle} oracle internal error (a bug in streamfuzz, not in the "
                            f"code under test): {what}{at}", rank, step)


def _fmt(frames: Frames) -> str:
    """A site: its frames, innermost first, then the innermost line's text."""
    if not frames:
        return "(no Python frame)"
    chain = " <- ".join(f"{_short(p)}:{line} {fn}" for p, line, fn in frames)
    text = source_line(*frames[0][:2])
    return f"{chain}\n        > {text}" if text else chain


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
        name, label, arg_names, arg_writes, view_op, collective, slots = _op_info(func)
        storages = self.model.storages
        classify = self._classify
        # A kind is None where a slot held no tensor (see _classify).
        reads: list[tuple[torch.Tensor, int, str | None]] = []
        writes: list[tuple[torch.Tensor, int, str | None]] = []
        kinds: set[str | None] = set()
        host_writes: set[str | None] = set()
        in_keys: set[int] = set()
        view = False
        if collective:
            self._collective(name, arg_names, arg_writes, args, kwargs, reads, writes, kinds)
        else:
            n_args = len(args)
            for i, arg_name, write, holds in slots:
                arg = args[i] if i < n_args else kwargs.get(arg_name) if kwargs else None
                if arg is None:
                    continue
                if holds == _ONE:
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
            view = view_op
        fresh: list[tuple[torch.Tensor, int, str | None]] = []
        if not view and not collective:  # a collective returns its arguments (and a work)
            # An in-place op's result is its first argument, classified above.
            written = args[0] if args and arg_writes and arg_writes[0] else None
            for leaf in _leaves(out):
                if leaf is written:
                    continue
                key, kind = classify(leaf)
                if key is None or (key not in in_keys and key not in storages):
                    kinds.add(kind)
                    if kind != DEVICE:
                        host_writes.add(kind)
                    if key is not None:
                        fresh.append((leaf, key, kind))
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
        for leaf, key, kind in fresh:
            if key not in storages:
                self._follow(leaf, key, party, label, frames, kind,
                             filled=name not in _ALLOC_OPS)
                if kind == PINNED and party != HOST:
                    access(key, party, True, label, frames)  # a copy into it
        if backend is not None:
            self.model.hold(backend[1], party, [k for _, k, _ in used])
        elif party != HOST and (name in _HOST_SYNC_OPS
                                or self._blocking_copy(name, args, kwargs, kinds, host_writes)):
            self.model.sync_stream(s)

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
        if name not in _COPY_OPS or kinds <= {DEVICE}:
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
        receive = name in _RECEIVES
        for arg_name, write in zip(arg_names, arg_writes):
            for leaf in tensors_in(bound.get(arg_name)):
                key, kind = self._classify(leaf)
                kinds.add(kind)
                if key is not None:
                    # Reduction buffers are read and written; a receive only writes.
                    if not receive:
                        reads.append((leaf, key, kind))
                    if write or receive or "output" in arg_name or name in _REDUCTIONS \
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
