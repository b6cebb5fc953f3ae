"""Handlers written the way engine code is: plain torch.cuda, no ``ctx.streams``.

Self-contained (nothing from ``streamfuzz.fuzz.draft.targets.pp_draft``), so the tests prove
that unmodified torch.cuda code runs on the CPU simulation.
"""

from __future__ import annotations

import functools
import threading
from collections import deque

import torch
import torch.distributed as dist


class PlainPreFix:
    """The pre-fix bug in plain torch.cuda: the side stream gathers with
    ``idx_mapping`` and never records it, so its block can be reused."""

    def __init__(self, ctx) -> None:  # noqa: ANN001 - any object with the context's fields
        self.src, self.group, self.k = ctx.last_rank, ctx.group, ctx.num_spec_steps
        torch.cuda.set_device(0)
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()
        self.parked: deque = deque()

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        if not any(batch.final):
            return None
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected):
                t.record_stream(self.side)
                dist.broadcast(t, src=self.src, group=self.group)
            send = draft_table[batch.idx_mapping].contiguous()
            dist.broadcast(send, src=self.src, group=self.group)
            send.record_stream(self.side)
        return send

    def receive_drafts(self, batch) -> None:  # noqa: ANN001
        if not any(batch.final):
            return
        n = len(batch.final)
        with torch.cuda.stream(self.side):
            got = [torch.empty((n, self.k + 1), dtype=torch.int64, device="cuda"),
                   torch.empty((n,), dtype=torch.int32, device=torch.device("cuda", 0)),
                   torch.zeros(n, dtype=torch.int32).cuda(),
                   torch.empty((n, self.k), dtype=torch.int64).to("cuda")]
            for t in got:
                dist.broadcast(t, src=self.src, group=self.group)
                t.record_stream(self.main)
            done = torch.cuda.Event()
            done.record()
        self.parked.append((batch.idx_mapping, got, done))

    def apply_received(self, draft_table):  # noqa: ANN001, ANN201
        idx_mapping, (tokens, num_sampled, num_rejected, drafts), done = self.parked.popleft()
        torch.cuda.current_stream().wait_event(done)
        draft_table[idx_mapping] = drafts
        return tokens, num_sampled, num_rejected


class PlainMainGather(PlainPreFix):
    """The correct design: gather on main, broadcast the gathered rows on the side stream."""

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        if not any(batch.final):
            return None
        send = draft_table[batch.idx_mapping]
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected, send):
                t.record_stream(self.side)
                dist.broadcast(t, src=self.src, group=self.group)
        return send


class UsesGraphs(PlainMainGather):
    """Captures a CUDA graph: not simulated on CPU."""

    def __init__(self, ctx) -> None:  # noqa: ANN001
        super().__init__(ctx)
        self.graph = torch.cuda.CUDAGraph()


class HostReadSynced(PlainMainGather):
    """The counts copied into pinned memory on the side stream are read on the
    host only after the host waited for the copy (event synchronize): clean."""

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        send = super().broadcast_drafts(draft_table, batch)
        if send is None:
            return None
        with torch.cuda.stream(self.side):
            counts = torch.empty(len(batch.final), dtype=torch.int32, pin_memory=True)
            counts.copy_(batch.num_rejected, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        copied.synchronize()
        self.rejected = sum(counts.tolist())
        return send


class StagingSynced(PlainMainGather):
    """A persistent pinned header uploaded non-blocking on the side stream; the
    host waits for the previous upload before rewriting it: clean."""

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        if not any(batch.final):
            return None
        if not hasattr(self, "staging"):
            self.staging = torch.zeros(2, dtype=torch.int64).pin_memory()
            self.uploaded = None
        if self.uploaded is not None:
            self.uploaded.synchronize()
        self.staging[0] = batch.step
        self.staging[1] = len(batch.final)
        with torch.cuda.stream(self.side):
            self.header = self.staging.to("cuda", non_blocking=True)
            self.uploaded = torch.cuda.current_stream().record_event()
        return super().broadcast_drafts(draft_table, batch)


class StagingBlockingCopy(PlainMainGather):
    """The persistent pinned header uploaded with a blocking copy on the side
    stream: the host waits for each upload before it rewrites the buffer, clean."""

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        if not any(batch.final):
            return None
        if not hasattr(self, "staging"):
            self.staging = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        self.staging[0] = batch.step
        with torch.cuda.stream(self.side):
            self.header = self.staging.to("cuda")
        return super().broadcast_drafts(draft_table, batch)


class ThreadedSend(PlainMainGather):
    """The broadcast runs in a worker thread, as an engine's sender thread would;
    ``wait`` says whether the thread's stream waits for main's gather first."""

    wait = True

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        if not any(batch.final):
            return None
        send = draft_table[batch.idx_mapping]
        ready = torch.cuda.Event()
        ready.record()
        errors: list[BaseException] = []

        def sender() -> None:
            try:
                # A new thread starts on the default stream, as in CUDA.
                assert torch.cuda.current_stream() == torch.cuda.default_stream()
                with torch.cuda.stream(self.side):
                    if self.wait:
                        self.side.wait_event(ready)
                    for t in (batch.sampled_tokens, batch.num_sampled, batch.num_rejected,
                              send):
                        t.record_stream(self.side)
                        dist.broadcast(t, src=self.src, group=self.group)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors.append(exc)

        worker = threading.Thread(target=sender)
        worker.start()
        worker.join()
        if errors:
            raise errors[0]
        return send


class ThreadedSendNoWait(ThreadedSend):
    """The sender thread's stream never waits for main, which wrote ``send``."""

    wait = False


class GenericStreamPreFix(PlainPreFix):
    """``PlainPreFix`` written device-generic: ``torch.Stream(device=...)``."""

    def __init__(self, ctx) -> None:  # noqa: ANN001
        super().__init__(ctx)
        self.side = torch.Stream(device=ctx.device)


@functools.cache
def _process_streams() -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """The streams an engine keeps for the life of its process (made in the first
    example that asks, used by every later one)."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    return main, side


class CachedStreamsPreFix(PlainPreFix):
    """``PlainPreFix`` on streams cached for the process, not made per handler."""

    def __init__(self, ctx) -> None:  # noqa: ANN001
        self.src, self.group, self.k = ctx.last_rank, ctx.group, ctx.num_spec_steps
        self.main, self.side = _process_streams()
        self.parked: deque = deque()


class CachedStreamsMainGather(CachedStreamsPreFix, PlainMainGather):
    """``PlainMainGather`` on streams cached for the process: clean."""
