"""The three versions of ``streamfuzz.fuzz.draft.targets.pp_draft``, against ``ctx.streams``.

This is how targets were written before CUDA on CPU, and how a target may
still be written; the benchmark runs these beside the plain torch.cuda
versions to show what the simulation of torch.cuda costs. Written from the
protocol: the last pipeline rank sends the step's sampled
tokens, per-request counts and draft rows on a side stream over its own group;
every other rank receives on that stream, parks the step, and applies the
drafts on its main stream pipeline-depth steps later. The versions differ only
in how the last rank gathers the rows it sends (see each class).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from streamfuzz.fuzz.draft.context import Batch, TargetContext
from streamfuzz.fuzz.draft.targets.pp_draft import sampled


class DraftBroadcast:
    """Both sides of the handler; subclasses choose the sender's gather."""

    def __init__(self, ctx: TargetContext) -> None:
        self.ctx = ctx
        self.streams = ctx.streams
        self.main = ctx.streams.current_stream()
        self.side = ctx.streams.Stream()
        self.pending: deque[tuple[Any, ...]] = deque()

    # -- last rank ---------------------------------------------------------
    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        return self._send(draft_table, batch)

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def _send_sampled(self, batch: Batch) -> None:
        """Broadcast tokens and counts on the side stream (the current stream)."""
        for t in sampled(batch):
            t.record_stream(self.side)
            self._bcast(t)

    def _bcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group)

    # -- other ranks -------------------------------------------------------
    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k = batch.num_reqs, self.ctx.num_spec_steps
        dev = self.ctx.device
        with self.streams.stream(self.side):
            tokens = torch.empty((n, k + 1), dtype=torch.int64, device=dev)
            num_sampled = torch.empty((n,), dtype=torch.int32, device=dev)
            num_rejected = torch.empty((n,), dtype=torch.int32, device=dev)
            drafts = torch.empty((n, k), dtype=torch.int64, device=dev)
            for t in (tokens, num_sampled, num_rejected, drafts):
                self._bcast(t)
            done = self.streams.Event()
            done.record(self.side)
            # Allocated here, read on main: main must hold the blocks too.
            for t in (tokens, num_sampled, num_rejected, drafts):
                t.record_stream(self.main)
        self.pending.append((batch.idx_mapping, tokens, num_sampled, num_rejected, drafts, done))

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        idx_mapping, tokens, num_sampled, num_rejected, drafts, done = self.pending.popleft()
        done.wait(self.main)
        draft_table[idx_mapping] = drafts
        return tokens, num_sampled, num_rejected


class PreFix(DraftBroadcast):
    """Before vLLM PR 55745: the side stream gathers with ``idx_mapping``
    without recording it, so its block can be reused while the gather waits."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        with self.streams.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            send = draft_table[batch.idx_mapping].contiguous()
            self._bcast(send)
            send.record_stream(self.side)
        return send


class PrFix(DraftBroadcast):
    """PR 55745: ``idx_mapping`` recorded on the side stream. The gather still
    reads the persistent table on the side stream, unordered with the next
    step's main-stream writes to it (write-after-read)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        with self.streams.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            send = draft_table[batch.idx_mapping].contiguous()
            batch.idx_mapping.record_stream(self.side)
            self._bcast(send)
        return send


class MainGather(DraftBroadcast):
    """Later design: gather on the main stream, broadcast the result on the
    side stream; no cross-stream read of ``idx_mapping`` or the table."""

    def _rows(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The rows to send, gathered on the main stream."""
        return draft_table[batch.idx_mapping]

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = self._rows(draft_table, batch)
        with self.streams.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


def pre_fix(ctx: TargetContext) -> PreFix:
    return PreFix(ctx)


def pr_fix(ctx: TargetContext) -> PrFix:
    return PrFix(ctx)


def main_gather(ctx: TargetContext) -> MainGather:
    return MainGather(ctx)
