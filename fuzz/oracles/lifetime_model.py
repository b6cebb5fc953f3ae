"""The lifetime oracle's model: vector clocks, live storages and the two rules.

It knows nothing about torch objects: streams and events are plain hashable
keys, storages are keys with what a report says about them. The trackers of
``streamfuzz.fuzz.oracles.lifetime`` (CPU streams) and ``streamfuzz.fuzz.oracles.lifetime_cuda``
(real ones) feed it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from streamfuzz.fuzz.frames import Frames
from streamfuzz.fuzz.oracles import lifetime_messages as messages
from streamfuzz.fuzz.oracles.access import (
    Access,
    Accesses,
    Clock,
    StorageInfo,
    drop_covered,
    join,
    keep,
    ordered,
    site,
)
from streamfuzz.fuzz.oracles.spans import WHOLE, Span, overlap
from streamfuzz.fuzz.tensors import HOST
from streamfuzz.fuzz.verdict import Failure


@dataclass
class _Pending:
    """A free whose other streams' uses were not ordered before its point."""

    info: StorageInfo
    frames: Frames
    uses: list[Access]
    point: Clock
    step: int | None


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
        self.pending: dict[Any, list[_Pending]] = {}
        """Per stream, frees whose other streams' uses were not ordered yet (``free``)."""
        self.disciplined: dict[Any, bool] = {}
        """Per stream, whether each of its allocations so far came after the uses
        of the blocks it had freed (``_settle``)."""
        self.findings: list[Failure] = []
        self.dropped = 0
        self.sites: list[tuple[str, str, Frames]] = []
        """Every finding's kind, first line and frames (its sites' in turn), those
        past ``MAX_FINDINGS`` too: which functions it names (``streamfuzz._record``)."""

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
        join(c, self.host)
        c[s] = c.get(s, 0) + 1
        return c

    def new_stream(self, s: Any) -> None:
        self._clock(s)

    def wait_stream(self, waiter: Any, waited: Any) -> None:
        join(self._enqueue(waiter), self._clock(waited))

    def record_event(self, event: Any, s: Any) -> None:
        self.events[event] = dict(self._enqueue(s))

    def wait_event(self, s: Any, event: Any) -> None:
        # Waiting on a never-recorded event is a no-op, as in CUDA.
        join(self._enqueue(s), self.events.get(event, {}))

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
        join(self.host, self._clock(s))

    def sync_event(self, event: Any) -> None:
        join(self.host, self.events.get(event, {}))

    def sync_device(self) -> None:
        for s, c in self.clocks.items():
            if s != HOST:
                join(self.host, c)

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
        self._settle(s)
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
            drop_covered(info.reads, now)
            keep(info.writes, now)
        else:
            keep(info.reads, now)

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
                    sites = (site(prev), site(now))
                    if sites not in info.reported:
                        info.reported.add(sites)
                        self._race(info, prev, now)

    def record_stream(self, key: int, s: Any) -> None:
        info = self.storages.get(key)
        if info is not None and s != info.stream:
            info.recorded.add(s)

    def free(self, key: int, frames: Frames) -> None:
        """A block freed while another stream's use of it is not ordered yet is
        kept pending: the allocator hands it only to its own stream, so the
        rule is judged when that stream next allocates (``_settle``)."""
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
        join(point, self.host)
        for r in info.recorded:
            join(point, self._clock(r))
        late = [a for a in uses.values() if not ordered(a, point)]
        if late:
            self.pending.setdefault(info.stream, []).append(
                _Pending(info, frames, late, point, self.step))

    def _settle(self, s: Any, end: bool = False) -> None:
        """Judge the frees pending on ``s`` when it allocates: work ``s``
        enqueues from now on (what writes a reused block) starts after
        everything ``s`` and the host have waited for since the free.

        At the block's end (``end``) nothing reused the block. A stream seen
        to wait for such uses before every allocation so far is taken to keep
        that discipline; any other pending free is judged at its own point,
        as the next allocation in the program (a later step) may come first.
        """
        pending = self.pending.pop(s, ())
        if not pending:
            return
        trusted = end and self.disciplined.get(s, False)
        for p in pending:
            point = dict(p.point)
            if not end:
                join(point, self._clock(s))
                join(point, self.host)
            late = next((a for a in p.uses if not ordered(a, point)), None)
            if not end:
                self.disciplined[s] = late is None and self.disciplined.get(s, True)
            if late is not None and not trusted:
                self._lifetime(p.info, late, p.frames, p.step)

    # -- reports -------------------------------------------------------------
    def name_of(self, s: Any) -> str:
        return self.stream_names.get(s, str(s))

    def report(self) -> list[Failure]:
        """The findings, the last one saying how many more were left out; frees
        still pending are judged as the block's end finds them (``_settle``)."""
        for s in list(self.pending):
            self._settle(s, end=True)
        found = list(self.findings)
        if self.dropped:
            found[-1] = replace(found[-1], message=found[-1].message + (
                f"\n    ... and {self.dropped} more finding(s) in this "
                f"example, not shown (the first {messages.MAX_FINDINGS} are)"))
        return found

    def _add(self, kind: str, message: str, frames: Frames, step: int | None = None) -> None:
        self.sites.append((kind, message.split("\n", 1)[0], frames))
        if len(self.findings) >= messages.MAX_FINDINGS:
            self.dropped += 1
            return
        self.findings.append(Failure(kind, message, self.rank,
                                     self.step if step is None else step))

    def _lifetime(self, info: StorageInfo, use: Access, free_frames: Frames,
                  step: int | None) -> None:
        self._add("lifetime", messages.freed_in_use(self.name_of, info, use, free_frames,
                                                    use.stream in self.backends),
                  free_frames + use.frames + info.alloc_frames, step)

    def _race(self, info: StorageInfo, prev: Access, now: Access) -> None:
        self._add("race", messages.race(self.name_of, info, prev, now,
                                        self.last_freed.get(prev.stream)),
                  prev.frames + now.frames)
