"""Built-in weight-sync targets, in plain torch.cuda: the two producers and the mutants.

The producer packs parameters into byte buffers of about ``buffer_bytes`` on
its own buffer streams (one per buffer, used in turn) and broadcasts each;
before reusing a buffer stream it synchronizes it, and it drains them all
before returning. ``unordered`` packs without waiting for the caller's stream,
where the optimizer wrote the parameters (as vLLM 0.34's
``packed_nccl_broadcast_producer`` does); ``ordered`` makes each buffer stream
wait on the caller's stream first (on the consumer too: the callback writes
the caller's parameters, which the caller may still be reading). The consumer
receives each buffer into a fresh tensor on its buffer stream, hands views of
it to the post-unpack callback there, chains the buffer streams so callbacks
run in order, keeps the buffer alive for every stream that used it, and
drains its streams before returning; each mutant breaks one of those steps on
the consumer side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from streamfuzz.fuzz.weight_sync.group import WeightSyncContext

Named = Iterator[tuple[str, torch.Tensor]]
Meta = Iterator[tuple[str, tuple[list[int], torch.dtype]]]
Load = Callable[[list[tuple[str, torch.Tensor]]], None]


class _Handler:
    wait_caller = False
    drain = True
    alloc_on_caller = False
    load_on_caller = False

    def __init__(self, ctx: WeightSyncContext) -> None:
        self.ctx = ctx
        self.streams = [torch.cuda.Stream() for _ in range(ctx.num_buffers)]

    # -- producer -----------------------------------------------------------
    def send(self, named: Named) -> None:
        caller = torch.cuda.current_stream()
        held: list[torch.Tensor | None] = [None] * len(self.streams)
        slot = 0
        pending = list(named)
        while pending:
            s = self.streams[slot]
            s.synchronize()
            held[slot] = None
            with torch.cuda.stream(s):
                if self.wait_caller:
                    s.wait_stream(caller)
                take, size = 0, 0
                while take < len(pending) and size <= self.ctx.buffer_bytes:
                    size += pending[take][1].numel() * pending[take][1].element_size()
                    take += 1
                chunk = [t.contiguous().view(-1).view(torch.uint8) for _, t in pending[:take]]
                packed = torch.cat(chunk)
                del chunk
                pending = pending[take:]
                self.ctx.group.broadcast(packed, src=0)
                held[slot] = packed
                del packed
            slot = (slot + 1) % len(self.streams)
        for s in self.streams:
            s.synchronize()

    # -- consumer -----------------------------------------------------------
    def receive(self, meta: Meta, load: Load) -> None:
        caller = torch.cuda.current_stream()
        items = list(meta)
        done: list[Any] = [None] * len(self.streams)
        prev: Any = None
        slot = 0
        while items:
            if done[slot] is not None:
                done[slot].synchronize()
            take, size = 0, 0
            while take < len(items) and size <= self.ctx.buffer_bytes:
                shape, dtype = items[take][1]
                size += math.prod(shape) * dtype.itemsize
                take += 1
            chunk, items = items[:take], items[take:]
            s = self.streams[slot]
            with torch.cuda.stream(caller if self.alloc_on_caller else s):
                packed = torch.empty(size, dtype=torch.uint8, device=self.ctx.device)
            with torch.cuda.stream(s):
                if self.alloc_on_caller or self.wait_caller:
                    s.wait_stream(caller)
                self.ctx.group.broadcast(packed, src=0)
                if prev is not None:
                    s.wait_event(prev)
                prev = torch.cuda.Event()
                prev.record(s)
                if not self.alloc_on_caller:
                    for other in (*self.streams, caller):
                        packed.record_stream(other)
                sizes = [math.prod(shape) * dtype.itemsize for _, (shape, dtype) in chunk]
                views = [(name, part.view(dtype).view(shape)) for (name, (shape, dtype)), part
                         in zip(chunk, packed.split(sizes))]
                if self.load_on_caller:
                    with torch.cuda.stream(caller):
                        load(views)
                else:
                    load(views)
                del views, packed
                done[slot] = torch.cuda.Event()
                done[slot].record(s)
            slot = (slot + 1) % len(self.streams)
        if self.drain:
            for s in self.streams:
                s.synchronize()


class _Unordered(_Handler):
    pass


class _Ordered(_Handler):
    wait_caller = True


class _NoDrain(_Ordered):
    """Consumer returns with unpacks still queued on its buffer streams: the
    caller reads its parameters unordered with their last copies."""

    drain = False


class _CallerAlloc(_Ordered):
    """Consumer allocates each receive buffer on the caller's stream and frees it
    after using it on a buffer stream, with no ``record_stream``."""

    alloc_on_caller = True


class _LoadOnCaller(_Ordered):
    """Consumer runs the post-unpack callback on the caller's stream, which
    never waits for the buffer stream the bytes arrive on."""

    load_on_caller = True


def unordered(ctx: WeightSyncContext) -> _Handler:
    return _Unordered(ctx)


def ordered(ctx: WeightSyncContext) -> _Handler:
    return _Ordered(ctx)


def consumer_no_drain(ctx: WeightSyncContext) -> _Handler:
    return _NoDrain(ctx)


def consumer_caller_alloc(ctx: WeightSyncContext) -> _Handler:
    return _CallerAlloc(ctx)


def consumer_load_on_caller(ctx: WeightSyncContext) -> _Handler:
    return _LoadOnCaller(ctx)
