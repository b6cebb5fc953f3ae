"""Our implementation of the pipeline-parallel draft broadcast, three versions.

Written from the protocol, as plain torch.cuda code (``self.cuda`` is
``torch.cuda`` itself; on ``--device cpu`` it runs on simulated streams): the
last pipeline rank sends the step's sampled tokens, per-request counts and
draft rows on a side stream over its own group;
every other rank receives on that stream, parks the step, and applies the
drafts on its main stream pipeline-depth steps later. The versions differ only
in how the last rank gathers the rows it sends (see each class).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from streamfuzz.fuzz.draft.context import Batch, TargetContext


class DraftBroadcast:
    """Both sides of the handler; subclasses choose the sender's gather."""

    def __init__(self, ctx: TargetContext) -> None:
        self.ctx = ctx
        self.cuda, self.dev = self._streams(ctx)
        self.main = self.cuda.current_stream()
        self.side = self.cuda.Stream()
        self.pending: deque[tuple[Any, ...]] = deque()

    def _streams(self, ctx: TargetContext) -> tuple[Any, Any]:
        """The stream API and device the handler runs on: ``torch.cuda`` itself
        (``pp_draft_streams`` hands ``ctx.streams`` instead)."""
        return torch.cuda, "cuda"

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
        dev = self.dev
        with self.cuda.stream(self.side):
            tokens = torch.empty((n, k + 1), dtype=torch.int64, device=dev)
            num_sampled = torch.empty((n,), dtype=torch.int32, device=dev)
            num_rejected = torch.empty((n,), dtype=torch.int32, device=dev)
            drafts = torch.empty((n, k), dtype=torch.int64, device=dev)
            for t in (tokens, num_sampled, num_rejected, drafts):
                self._bcast(t)
            done = self.cuda.Event()
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
        with self.cuda.stream(self.side):
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
        with self.cuda.stream(self.side):
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
        with self.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


class MainGatherSynced(MainGather):
    """``MainGather`` with the host syncs engine code makes, each one correct:
    the sender reads the step's rejected count (``.item()``: the host waits
    for main) and waits for its broadcast (``side.synchronize()``) instead of
    ``record_stream``; a receiver reads the received counts (``.tolist()``, a
    blocking copy on main) after main waited for the receive. Gates must not
    make these waits run out their bound."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        self.rejected = int(sampled(batch).num_rejected.sum().item())
        send = self._rows(draft_table, batch)
        with self.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (*sampled(batch), send):
                self._bcast(t)
        self.side.synchronize()
        return send

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens, num_sampled, num_rejected = super().apply_received(draft_table)
        self.counts = num_sampled.tolist()
        return tokens, num_sampled, num_rejected


def pre_fix(ctx: TargetContext) -> PreFix:
    return PreFix(ctx)


def pr_fix(ctx: TargetContext) -> PrFix:
    return PrFix(ctx)


def main_gather(ctx: TargetContext) -> MainGather:
    return MainGather(ctx)


def main_gather_synced(ctx: TargetContext) -> MainGatherSynced:
    return MainGatherSynced(ctx)


class Sampled(NamedTuple):
    """A step's sampling tensors, as the last rank broadcasts them."""

    tokens: torch.Tensor
    num_sampled: torch.Tensor
    num_rejected: torch.Tensor


def sampled(batch: Batch) -> Sampled:
    """The step's sampling tensors, which the harness hands the last rank alone."""
    tokens, num_sampled, num_rejected = batch.sampled_tokens, batch.num_sampled, batch.num_rejected
    if tokens is None or num_sampled is None or num_rejected is None:
        raise ValueError(f"step {batch.step} has no sampling tensors: only the last rank sends")
    return Sampled(tokens, num_sampled, num_rejected)
