"""Deliberately wrong targets: the suite proves the fuzzer catches them."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from streamfuzz.draft import Batch, TargetContext
from streamfuzz.fuzz.draft.targets.pp_draft import MainGather, MainGatherSynced, PreFix


class ShiftedRows(MainGather):
    """Sends each row one slot off once a batch has 3 or more requests."""

    def _rows(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if batch.num_reqs >= 3:
            return draft_table[batch.idx_mapping.roll(1)]
        return super()._rows(draft_table, batch)


class KillsRank(MainGather):
    """Kills its own process on a batch of 2 or more requests."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if batch.num_reqs >= 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super()._send(draft_table, batch)


class Hangs(MainGather):
    """Never returns on a batch of 4 or more requests."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if batch.num_reqs >= 4:
            time.sleep(3600)
        return super()._send(draft_table, batch)


class FailsOnce(MainGather):
    """Sends shifted rows the first time a rank process sees 2 or more requests,
    then never again: a failure that does not reproduce."""

    fired = False

    def _rows(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if batch.num_reqs >= 2 and not FailsOnce.fired:
            FailsOnce.fired = True
            return draft_table[batch.idx_mapping.roll(1)]
        return super()._rows(draft_table, batch)


class Leaks(MainGather):
    """Keeps 128 KiB of host memory per example for as long as its process lives,
    like a library that leaks a little per call."""

    kept: list[bytearray] = []

    def _rows(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        Leaks.kept.append(bytearray(b"\x01") * (128 * 1024))  # written, so resident
        return super()._rows(draft_table, batch)


def leaks(ctx: TargetContext) -> Leaks:
    return Leaks(ctx)


def fails_once(ctx: TargetContext) -> FailsOnce:
    return FailsOnce(ctx)


def shifted_rows(ctx: TargetContext) -> ShiftedRows:
    return ShiftedRows(ctx)


def kills_rank(ctx: TargetContext) -> KillsRank:
    return KillsRank(ctx)


def hangs(ctx: TargetContext) -> Hangs:
    return Hangs(ctx)


not_callable = 42


class FirstLaunch(PreFix):
    """pre-fix, plus a kernel nothing else launches, queued on main after the
    side stream's gather: its first launch loads its module (lazy loading)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = super()._send(draft_table, batch)
        torch.special.bessel_j0(torch.ones(4, dtype=torch.float64, device=self.ctx.device))
        return send


def first_launch(ctx: TargetContext) -> FirstLaunch:
    return FirstLaunch(ctx)


class StreamsReceiverNoWait:
    """Written against ``ctx.streams`` (the older target API): the receiver
    applies the drafts on main without waiting for the broadcast stream."""

    def __init__(self, ctx: TargetContext) -> None:
        self.ctx = ctx
        self.main = ctx.streams.current_stream()
        self.side = ctx.streams.Stream()
        self.parked: list = []

    def _bcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group)

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        send = draft_table[batch.idx_mapping]
        with self.ctx.streams.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected, send):
                t.record_stream(self.side)
                self._bcast(t)
        return send

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k, dev = batch.num_reqs, self.ctx.num_spec_steps, self.ctx.device
        with self.ctx.streams.stream(self.side):
            got = [torch.empty((n, k + 1), dtype=torch.int64, device=dev),
                   torch.empty((n,), dtype=torch.int32, device=dev),
                   torch.empty((n,), dtype=torch.int32, device=dev),
                   torch.empty((n, k), dtype=torch.int64, device=dev)]
            for t in got:
                self._bcast(t)
                t.record_stream(self.main)
        self.parked.append((batch.idx_mapping, got))

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        idx_mapping, (tokens, num_sampled, num_rejected, drafts) = self.parked.pop(0)
        draft_table[idx_mapping] = drafts
        return tokens, num_sampled, num_rejected


def streams_receiver_no_wait(ctx: TargetContext) -> StreamsReceiverNoWait:
    return StreamsReceiverNoWait(ctx)


class HangsOnceThenPreFix(PreFix):
    """pre-fix, except that its first broadcast ever hangs: the first process
    to broadcast creates the file named by ``$STREAMFUZZ_TEST_HANG_ONCE`` and
    never returns; once the file exists it is plain pre-fix (a lifetime bug
    only the lifetime oracle sees on CPU). Lets a test kill a driver with that
    first example in flight and check what the next start makes of it."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        marker = os.environ.get("STREAMFUZZ_TEST_HANG_ONCE")
        if marker:
            try:
                with open(marker, "x"):
                    pass
            except FileExistsError:
                pass
            else:
                time.sleep(3600)
        return super()._send(draft_table, batch)


def hangs_once_then_pre_fix(ctx: TargetContext) -> HangsOnceThenPreFix:
    return HangsOnceThenPreFix(ctx)


class SyncedWithoutTheSync(MainGatherSynced):
    """``main-gather-synced`` without its ``side.synchronize()``: nothing keeps
    the tensors the side stream reads alive any more (lifetime)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = self._rows(draft_table, batch)
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected, send):
                self._bcast(t)
        return send


def synced_without_the_sync(ctx: TargetContext) -> SyncedWithoutTheSync:
    return SyncedWithoutTheSync(ctx)


def _waited_for(mark: str, seconds: float = 60) -> bool:
    """Whether the file ``mark`` appeared within ``seconds``: ranks of a test
    meeting outside the collectives."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(mark)


class RootRunsAhead(MainGather):
    """main-gather whose ranks meet at a file instead of in the collectives: the
    last rank creates ``$STREAMFUZZ_TEST_ROOT_MARK`` once its broadcasts of a
    step have returned; every other rank waits (at most a minute) for that
    file before it posts its receives. Only a root that goes on before its
    receivers get there lets the receivers see the file in time."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = super()._send(draft_table, batch)
        with open(os.environ["STREAMFUZZ_TEST_ROOT_MARK"], "a"):
            pass
        return send

    def receive_drafts(self, batch: Batch) -> None:
        if batch.samples and not _waited_for(os.environ["STREAMFUZZ_TEST_ROOT_MARK"]):
            raise RuntimeError("the root's broadcasts waited for this rank")
        super().receive_drafts(batch)


def root_runs_ahead(ctx: TargetContext) -> RootRunsAhead:
    return RootRunsAhead(ctx)


class ReceiverRaises(MainGather):
    """main-gather whose receivers raise before their first receive: the last
    rank's broadcasts then have no receiver."""

    def receive_drafts(self, batch: Batch) -> None:
        if batch.samples:
            raise RuntimeError("receiver gave up")
        super().receive_drafts(batch)


def receiver_raises(ctx: TargetContext) -> ReceiverRaises:
    return ReceiverRaises(ctx)


class ReceiverRaisesOnThree(MainGather):
    """main-gather whose receivers raise on a batch of 3 or more requests while
    the last rank waits in its broadcast: a crash whose first sight is rarely
    minimal, so that shrinking it runs many crashing examples."""

    def receive_drafts(self, batch: Batch) -> None:
        if batch.num_reqs >= 3:
            raise RuntimeError("receiver gave up on a batch of 3")
        super().receive_drafts(batch)


def receiver_raises_on_three(ctx: TargetContext) -> ReceiverRaisesOnThree:
    return ReceiverRaisesOnThree(ctx)


class RootRaisesOnFive(MainGather):
    """main-gather whose broadcasting rank raises on a batch of 5 or more
    requests while the receivers wait in their receive: the peers of the
    raising rank are blocked in a collective, not done."""

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if batch.num_reqs >= 5:
            raise ValueError("root gave up on a batch of 5")
        return super().broadcast_drafts(draft_table, batch)


def root_raises_on_five(ctx: TargetContext) -> RootRaisesOnFive:
    return RootRaisesOnFive(ctx)


class RaisesWhileRootWorks(MainGather):
    """main-gather whose receivers raise once they have received, while the
    last rank works on for a second after its broadcast: a peer that is not
    blocked, only late."""

    def receive_drafts(self, batch: Batch) -> None:
        super().receive_drafts(batch)
        raise RuntimeError("receiver gave up after its receive")

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        out = super().broadcast_drafts(draft_table, batch)
        time.sleep(1.0)
        return out


def raises_while_root_works(ctx: TargetContext) -> RaisesWhileRootWorks:
    return RaisesWhileRootWorks(ctx)


class ReceiverRunsAhead(MainGather):
    """main-gather whose ranks meet at a file: a receiving rank creates
    ``$STREAMFUZZ_TEST_RECEIVE_MARK`` once its receive calls of a step have
    returned, before anything reads what they receive; the last rank waits (at
    most a minute) for that file before it broadcasts. Only receive calls that
    return before their data arrives let the last rank see the file in time."""

    def receive_drafts(self, batch: Batch) -> None:
        super().receive_drafts(batch)
        with open(os.environ["STREAMFUZZ_TEST_RECEIVE_MARK"], "a"):
            pass

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not _waited_for(os.environ["STREAMFUZZ_TEST_RECEIVE_MARK"]):
            raise RuntimeError("the receivers waited at their receive calls for this rank")
        return super()._send(draft_table, batch)


def receiver_runs_ahead(ctx: TargetContext) -> ReceiverRunsAhead:
    return ReceiverRunsAhead(ctx)


class ReceivesThroughAView(MainGather):
    """main-gather whose receivers receive the drafts through a view of a
    larger buffer, a view they drop as the call returns; they keep the buffer
    and read the drafts from a new view of it."""

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k = batch.num_reqs, self.ctx.num_spec_steps
        with torch.cuda.stream(self.side):
            tokens = torch.empty((n, k + 1), dtype=torch.int64, device="cuda")
            num_sampled = torch.empty((n,), dtype=torch.int32, device="cuda")
            num_rejected = torch.empty((n,), dtype=torch.int32, device="cuda")
            buffer = torch.empty((n + 2, k), dtype=torch.int64, device="cuda")
            for t in (tokens, num_sampled, num_rejected):
                self._bcast(t)
            self._bcast(buffer[1:n + 1])  # the view dies here; the buffer lives on
            done = torch.cuda.Event()
            done.record(self.side)
            for t in (tokens, num_sampled, num_rejected, buffer):
                t.record_stream(self.main)
        drafts = buffer[1:n + 1]
        self.pending.append((batch.idx_mapping, tokens, num_sampled, num_rejected, drafts, done))


def receives_through_a_view(ctx: TargetContext) -> ReceivesThroughAView:
    return ReceivesThroughAView(ctx)


class PointToPoint(MainGather):
    """main-gather whose broadcasts are point-to-point calls: the last rank
    sends each tensor to every other rank, which receives it. ``how``:
    ``blocking`` (``send``/``recv``), ``async`` (``isend``/``irecv``, then
    ``wait``) or ``any_source`` (``recv`` with no source, which says the source)."""

    how = "blocking"

    def _bcast(self, t: torch.Tensor) -> None:
        ctx = self.ctx
        if ctx.rank == ctx.last_rank:
            for dst in range(ctx.world_size):
                if dst == ctx.rank:
                    continue
                if self.how == "async":
                    dist.isend(t, dst, group=ctx.group).wait()
                else:
                    dist.send(t, dst, group=ctx.group)
        elif self.how == "async":
            dist.irecv(t, ctx.last_rank, group=ctx.group).wait()
        elif self.how == "any_source":
            src = dist.recv(t, group=ctx.group)
            if src != ctx.last_rank:
                raise RuntimeError(f"recv says rank {src} sent, not {ctx.last_rank}")
        else:
            dist.recv(t, ctx.last_rank, group=ctx.group)


def point_to_point(ctx: TargetContext) -> PointToPoint:
    return PointToPoint(ctx)


class PointToPointAsync(PointToPoint):
    how = "async"


def point_to_point_async(ctx: TargetContext) -> PointToPointAsync:
    return PointToPointAsync(ctx)


class PointToPointAnySource(PointToPoint):
    how = "any_source"


def point_to_point_any_source(ctx: TargetContext) -> PointToPointAnySource:
    return PointToPointAnySource(ctx)


class PointToPointUnrecorded(PointToPointAsync):
    """``PointToPointAsync`` whose last rank sends the batch's tensors without
    ``record_stream(side)``: NCCL lets them go when the side stream waits for
    each send, and nothing orders main, where they were made and are freed
    with the batch, after the sends."""

    def _send_sampled(self, batch: Batch) -> None:
        for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected):
            self._bcast(t)


def point_to_point_unrecorded(ctx: TargetContext) -> PointToPointUnrecorded:
    return PointToPointUnrecorded(ctx)


class AsyncBroadcast(MainGather):
    """main-gather with ``async_op=True`` broadcasts, each waited for at once on
    the side stream, as ``dist.broadcast`` without it would (the built-in
    mutant ``receiver-async-unwaited`` is its receivers never waiting)."""

    def _bcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group, async_op=True).wait()


def async_broadcast(ctx: TargetContext) -> AsyncBroadcast:
    return AsyncBroadcast(ctx)


class PointToPointNoWait(PointToPoint):
    """``isend``/``irecv`` whose receivers never wait for their receives."""

    def _bcast(self, t: torch.Tensor) -> None:
        ctx = self.ctx
        if ctx.rank != ctx.last_rank:
            dist.irecv(t, ctx.last_rank, group=ctx.group)
            return
        for dst in range(ctx.world_size):
            if dst != ctx.rank:
                dist.isend(t, dst, group=ctx.group).wait()


def point_to_point_no_wait(ctx: TargetContext) -> PointToPointNoWait:
    return PointToPointNoWait(ctx)


class SyncedByPolling(SyncedWithoutTheSync):
    """``main-gather-synced`` polling until its work is done instead of
    synchronizing: the side stream's ``query()`` on the last rank, an event's
    before the receivers read the counts. Correct on a GPU."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = super()._send(draft_table, batch)
        while not self.side.query():
            pass
        return send

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens, num_sampled, num_rejected = MainGather.apply_received(self, draft_table)
        host = torch.empty(num_sampled.shape, dtype=num_sampled.dtype, pin_memory=True)
        host.copy_(num_sampled, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        while not done.query():
            pass
        self.counts = host.tolist()
        return tokens, num_sampled, num_rejected


def synced_by_polling(ctx: TargetContext) -> SyncedByPolling:
    return SyncedByPolling(ctx)


class AsyncBroadcastViaFuture(AsyncBroadcast):
    """``AsyncBroadcast`` waiting through each handle's future."""

    def _bcast(self, t: torch.Tensor) -> None:
        work = dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group, async_op=True)
        work.get_future().wait()


def async_broadcast_via_future(ctx: TargetContext) -> AsyncBroadcastViaFuture:
    return AsyncBroadcastViaFuture(ctx)


class WeightSyncShaped:
    """A handler class with the weight-sync protocol's methods and no
    ``protocol`` attribute: as a factory it would be fuzzed as a draft broadcast."""

    def __init__(self, ctx: TargetContext) -> None:
        self.ctx = ctx

    def send(self, named: object) -> None:
        pass

    def receive(self, meta: object, load: object) -> None:
        pass


def weight_sync_shaped(ctx: TargetContext) -> WeightSyncShaped:
    return WeightSyncShaped(ctx)


class PolledCounts(MainGather):
    """Receivers copy each step's counts into a pinned buffer kept across
    steps, on a copy stream, and read them only once the copy's event says
    done; a step whose poll says "not done" skips the read. ``clears``: that
    step also zeroes the buffer for the next copy, a host write the copy into
    it may still follow (the bug). Found only where a poll answers "not done"
    (``pending_polls``): on a GPU when the copy is slow, on simulated streams
    when the scenario says so."""

    clears = True

    def __init__(self, ctx: TargetContext) -> None:
        super().__init__(ctx)
        self.copier = torch.cuda.Stream()
        self.host = torch.zeros(ctx.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.copied: tuple[torch.cuda.Event, int] | None = None
        self.counts: list[int] = []

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens, num_sampled, num_rejected = super().apply_received(draft_table)
        if self.copied is not None:
            done, n = self.copied
            if done.query():
                self.counts = self.host[:n].tolist()
            elif self.clears:
                self.host.zero_()
        n = num_sampled.numel()
        self.copier.wait_stream(self.main)
        with torch.cuda.stream(self.copier):
            self.host[:n].copy_(num_sampled, non_blocking=True)
            num_sampled.record_stream(self.copier)
            done = torch.cuda.Event()
            done.record()
        self.copied = (done, n)
        return tokens, num_sampled, num_rejected


def polled_counts(ctx: TargetContext) -> PolledCounts:
    return PolledCounts(ctx)


class PolledCountsFixed(PolledCounts):
    clears = False


def polled_counts_fixed(ctx: TargetContext) -> PolledCountsFixed:
    return PolledCountsFixed(ctx)


def factory_raises(ctx: TargetContext) -> MainGather:
    """A factory set up wrong: it raises whatever the scenario."""
    raise KeyError("model_config")


def factory_raises_on_big_batches(ctx: TargetContext) -> MainGather:
    """A factory with a bug of its own: it raises only for some scenarios."""
    if ctx.max_num_reqs > 2:
        raise ValueError(f"no room for {ctx.max_num_reqs} requests")
    return MainGather(ctx)


class ReceiverSkipsDrafts(MainGather):
    """A receiver that never joins the drafts' broadcast on batches of two or more."""

    def _bcast(self, t: torch.Tensor) -> None:
        if (self.ctx.rank != self.ctx.last_rank and t.dim() == 2 and t.shape[0] >= 2
                and t.shape[1] == self.ctx.num_spec_steps):
            return
        super()._bcast(t)


def receiver_skips_drafts(ctx: TargetContext) -> ReceiverSkipsDrafts:
    return ReceiverSkipsDrafts(ctx)
