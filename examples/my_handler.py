"""A complete user target: gather on main, broadcast on a side stream."""

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

import streamfuzz
from streamfuzz.draft import Batch, DraftContext


class MyHandler:
    def __init__(self, ctx: DraftContext) -> None:
        self.ctx = ctx
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()
        self.parked: deque[Any] = deque()

    def _bcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group)

    # last rank
    def broadcast_drafts(self, draft_table: torch.Tensor,
                         batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        send = draft_table[batch.idx_mapping]          # on main: no cross-stream read
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected, send):
                assert t is not None                   # the last rank's batch has them
                t.record_stream(self.side)             # made on main, used on side
                self._bcast(t)
        return send

    # every other rank
    def receive_drafts(self, batch: Batch) -> None:
        if not batch.samples:
            return
        n, k = batch.num_reqs, self.ctx.num_spec_steps
        with torch.cuda.stream(self.side):
            got = [torch.empty((n, k + 1), dtype=torch.int64, device="cuda"),
                   torch.empty((n,), dtype=torch.int32, device="cuda"),
                   torch.empty((n,), dtype=torch.int32, device="cuda"),
                   torch.empty((n, k), dtype=torch.int64, device="cuda")]
            for t in got:
                self._bcast(t)
                t.record_stream(self.main)             # made on side, read on main
            done = torch.cuda.Event()
            done.record(self.side)
        self.parked.append((batch.idx_mapping, got, done))

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
        idx_mapping, (tokens, num_sampled, num_rejected, drafts), done = self.parked.popleft()
        done.wait(self.main)
        draft_table[idx_mapping] = drafts
        return tokens, num_sampled, num_rejected


@streamfuzz.target
def make_handler(ctx: DraftContext) -> MyHandler:
    return MyHandler(ctx)
