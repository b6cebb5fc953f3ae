"""Targets for ``mutate``'s tests: one whose sync is load-bearing, one with a
deliberately redundant second sync. Only ``_send`` is their own source; the
rest comes from ``MainGather``."""

from __future__ import annotations

import torch

from streamfuzz.fuzz.draft.targets.pp_draft import MainGather
from streamfuzz.fuzz.targets import Batch, TargetContext


class OneWait(MainGather):
    """The side stream waits for main before broadcasting what main wrote:
    without the wait, the broadcast reads the tokens unordered (a race)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = draft_table[batch.idx_mapping]
        with self.ctx.streams.stream(self.side):
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


class TwoWaits(MainGather):
    """The same wait twice in a row: either one alone orders everything. And a
    host sync in a branch no scenario takes (batches are far smaller)."""

    def _send(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        send = draft_table[batch.idx_mapping]
        if batch.num_reqs > 10_000:
            self.side.synchronize()
        with self.ctx.streams.stream(self.side):
            self.side.wait_stream(self.main)
            self.side.wait_stream(self.main)
            self._send_sampled(batch)
            self._bcast(send)
            send.record_stream(self.side)
        return send


class NoSync(MainGather):
    """Nothing of its own synchronizes (its source has no sync call)."""

    def _rows(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor:
        return draft_table[batch.idx_mapping]


def one_wait(ctx: TargetContext) -> OneWait:
    return OneWait(ctx)


def two_waits(ctx: TargetContext) -> TwoWaits:
    return TwoWaits(ctx)


def no_sync(ctx: TargetContext) -> NoSync:
    return NoSync(ctx)


class RecordsTokensApart(MainGather):
    """Receives like ``MainGather`` (written against torch.cuda), recording the
    sampled tokens on main in a statement of their own: main reads them only
    where the runner reads what it received."""

    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k = batch.num_reqs, self.ctx.num_spec_steps
        with torch.cuda.stream(self.side):
            tokens = torch.empty((n, k + 1), dtype=torch.int64, device="cuda")
            rest = (torch.empty((n,), dtype=torch.int32, device="cuda"),
                    torch.empty((n,), dtype=torch.int32, device="cuda"),
                    torch.empty((n, k), dtype=torch.int64, device="cuda"))
            for t in (tokens, *rest):
                self._bcast(t)
            done = torch.cuda.Event()
            done.record(self.side)
            tokens.record_stream(self.main)
            for t in rest:
                t.record_stream(self.main)
        self.pending.append((batch.idx_mapping, tokens, *rest, done))


def records_tokens_apart(ctx: TargetContext) -> RecordsTokensApart:
    return RecordsTokensApart(ctx)
