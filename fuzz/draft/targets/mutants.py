"""Mutants: small variations of the handlers, each planting one stream bug.

They exist to prove the lifetime oracle finds what it claims to: each one
must be found on CPU (simulated streams), and a mutant that goes unfound
fails CI. Every docstring states the planted bug.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from streamfuzz.fuzz.draft.context import Batch, TargetContext
from streamfuzz.fuzz.draft.targets.pp_draft import MainGather, sampled


class MissingWait(MainGather):
    """The broadcast stream does not wait for the main stream: it sends the
    gathered rows (and the sampled tokens) before main has written them
    (read-after-write race)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = draft_table[batch.idx_mapping]
        with torch.cuda.stream(self.side):
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


class WrongRecordStream(MainGather):
    """The sampled tokens and counts are recorded on the main stream (where
    they were allocated, so a no-op) instead of the broadcast stream that
    reads them: they are freed while the broadcast is queued (lifetime)."""

    def _send_sampled(self, batch: Batch) -> None:
        for t in sampled(batch):
            t.record_stream(self.main)
            self._bcast(t)


class ReceiverNoWait(MainGather):
    """The receiving rank's main stream scatters the received drafts without
    waiting on the broadcast's event (read-after-write race)."""

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        idx_mapping, tokens, num_sampled, num_rejected, drafts, _done = self.pending.popleft()
        draft_table[idx_mapping] = drafts
        return tokens, num_sampled, num_rejected


class ReceiverAsyncUnwaited(MainGather):
    """The receiving ranks broadcast with ``async_op=True`` and never wait for
    the work handles: NCCL writes the received tensors on a stream of its own,
    which nothing the receiver does is ordered after, and main reads them when
    it applies the step (read-after-write race)."""

    def _bcast(self, t: torch.Tensor) -> None:
        work = dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group, async_op=True)
        if self.ctx.rank == self.ctx.last_rank:
            work.wait()


class ReceiverNoRecord(MainGather):
    """The received tensors, allocated on the broadcast stream, are not
    recorded on the main stream that reads them: freed after the apply, their
    blocks go back to the broadcast stream while main's reads are queued
    (lifetime)."""

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k, dev = batch.num_reqs, self.ctx.num_spec_steps, "cuda"
        with torch.cuda.stream(self.side):
            tensors = (torch.empty((n, k + 1), dtype=torch.int64, device=dev),
                       torch.empty((n,), dtype=torch.int32, device=dev),
                       torch.empty((n,), dtype=torch.int32, device=dev),
                       torch.empty((n, k), dtype=torch.int64, device=dev))
            for t in tensors:
                self._bcast(t)
            done = torch.cuda.Event()
            done.record(self.side)
        self.pending.append((batch.idx_mapping, *tensors, done))


class ReceiverDropsIdx(MainGather):
    """The receiving rank converts ``idx_mapping`` to int64 on the broadcast
    stream and parks only that copy: the original is dropped when the call
    returns, while the side stream's read of it is still queued (lifetime)."""

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            slots = batch.idx_mapping.to(torch.int64, copy=True)
        super().receive_drafts(batch)
        self.pending[-1] = (slots,) + self.pending[-1][1:]


class SampledBeforeWait(MainGather):
    """The sampled tokens and counts are broadcast before the broadcast
    stream waits for main, which copied them to the device (read-after-write
    race on the sampled-token broadcast)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = draft_table[batch.idx_mapping]
        with torch.cuda.stream(self.side):
            self._send_sampled(batch)
            self.side.wait_stream(self.main)
            self._bcast(send)
            send.record_stream(self.side)
        return send


class EarlyEvent(MainGather):
    """The receiving rank records its event after the sampled-token broadcasts
    but before the draft broadcast: main's wait does not cover the drafts
    (read-after-write race)."""

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k, dev = batch.num_reqs, self.ctx.num_spec_steps, "cuda"
        with torch.cuda.stream(self.side):
            tensors = (torch.empty((n, k + 1), dtype=torch.int64, device=dev),
                       torch.empty((n,), dtype=torch.int32, device=dev),
                       torch.empty((n,), dtype=torch.int32, device=dev),
                       torch.empty((n, k), dtype=torch.int64, device=dev))
            for t in tensors[:3]:
                self._bcast(t)
            done = torch.cuda.Event()
            done.record(self.side)
            self._bcast(tensors[3])
            for t in tensors:
                t.record_stream(self.main)
        self.pending.append((batch.idx_mapping, *tensors, done))


class StagingBuffer(MainGather):
    """The last rank gathers into one persistent staging buffer on main and
    broadcasts it on the side stream; the next step's gather overwrites the
    buffer unordered with the previous broadcast (write-after-read race)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not hasattr(self, "_staging"):
            self._staging = torch.empty_like(draft_table)
        send = self._staging[: batch.num_reqs]
        torch.index_select(draft_table, 0, batch.idx_mapping, out=send)
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            self._bcast(send)
        return send.clone()


class HostReadUnsynced(MainGather):
    """The last rank copies each step's rejected counts into pinned host memory
    on the broadcast stream (non-blocking), makes main wait for that stream,
    and reads the counts on the host without a host sync: ``wait_stream``
    orders streams, never the host, so the host may read before the copy lands
    (read-after-write race between the broadcast stream and the host)."""

    rejected = 0

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = super()._send(draft_table, batch)
        with torch.cuda.stream(self.side):
            counts = torch.empty(batch.num_reqs, dtype=torch.int32, pin_memory=True)
            counts.copy_(sampled(batch).num_rejected, non_blocking=True)
        self.main.wait_stream(self.side)
        self.rejected += sum(counts.tolist())
        return send


class HostRewritesStaging(MainGather):
    """The last rank stages each step's header (step, request count) in one
    persistent pinned buffer and uploads it non-blocking on the broadcast
    stream, as a runner building step metadata on the host does; the next step
    rewrites the buffer on the host while the previous upload may still be
    pending (write-after-read race between the host and the broadcast stream)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        if not hasattr(self, "_staging"):
            self._staging = torch.zeros(2, dtype=torch.int64, pin_memory=True)
            self.requests_sent = torch.zeros(1, dtype=torch.int64, device="cuda")
        self._staging[0] = batch.step
        self._staging[1] = batch.num_reqs
        send = draft_table[batch.idx_mapping]
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            header = self._staging.to("cuda", non_blocking=True)
            self.requests_sent += header[1]
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


def missing_wait(ctx: TargetContext) -> MissingWait:
    return MissingWait(ctx)


def wrong_record_stream(ctx: TargetContext) -> WrongRecordStream:
    return WrongRecordStream(ctx)


def receiver_no_wait(ctx: TargetContext) -> ReceiverNoWait:
    return ReceiverNoWait(ctx)


def receiver_async_unwaited(ctx: TargetContext) -> ReceiverAsyncUnwaited:
    return ReceiverAsyncUnwaited(ctx)


def receiver_no_record(ctx: TargetContext) -> ReceiverNoRecord:
    return ReceiverNoRecord(ctx)


def receiver_drops_idx(ctx: TargetContext) -> ReceiverDropsIdx:
    return ReceiverDropsIdx(ctx)


def sampled_before_wait(ctx: TargetContext) -> SampledBeforeWait:
    return SampledBeforeWait(ctx)


def early_event(ctx: TargetContext) -> EarlyEvent:
    return EarlyEvent(ctx)


def staging_buffer(ctx: TargetContext) -> StagingBuffer:
    return StagingBuffer(ctx)


def host_read_unsynced(ctx: TargetContext) -> HostReadUnsynced:
    return HostReadUnsynced(ctx)


def host_rewrites_staging(ctx: TargetContext) -> HostRewritesStaging:
    return HostRewritesStaging(ctx)
