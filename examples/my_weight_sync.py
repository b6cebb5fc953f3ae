"""A complete weight-sync target: pack on buffer streams, unpack on them, in order."""

import math

import torch

import streamfuzz
from streamfuzz.weight_sync import Load, Meta, Named, WeightSyncContext


def chunks(sizes: list[int], buffer_bytes: int) -> list[range]:
    """Which items go in each buffer: whole items, until a buffer holds
    buffer_bytes or more. Both sides call this, so they agree."""
    out, start, size = [], 0, 0
    for i, n in enumerate(sizes):
        size += n
        if size >= buffer_bytes:
            out.append(range(start, i + 1))
            start, size = i + 1, 0
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


class MyWeightSync:
    def __init__(self, ctx: WeightSyncContext) -> None:
        self.ctx = ctx
        self.streams = [torch.cuda.Stream() for _ in range(ctx.num_buffers)]

    # group rank 0, the trainer
    def send(self, named: Named) -> None:
        caller = torch.cuda.current_stream()
        params = [t for _, t in named]
        sizes = [t.numel() * t.element_size() for t in params]
        for i, part in enumerate(chunks(sizes, self.ctx.buffer_bytes)):
            s = self.streams[i % len(self.streams)]
            with torch.cuda.stream(s):
                s.wait_stream(caller)                  # the optimizer wrote them on caller
                packed = torch.cat([params[j].reshape(-1).view(torch.uint8) for j in part])
            self.ctx.group.broadcast(packed, src=0, stream=s)
            del packed                                 # made and used on s only
        for s in self.streams:
            s.synchronize()                            # the caller writes them again next

    # every other rank, an inference worker
    def receive(self, meta: Meta, load: Load) -> None:
        caller = torch.cuda.current_stream()
        items = list(meta)
        sizes = [math.prod(shape) * dtype.itemsize for _, (shape, dtype) in items]
        for i, part in enumerate(chunks(sizes, self.ctx.buffer_bytes)):
            s = self.streams[i % len(self.streams)]
            with torch.cuda.stream(s):
                s.wait_stream(caller)                  # load writes what caller may still read
                packed = torch.empty(sum(sizes[j] for j in part), dtype=torch.uint8,
                                     device=self.ctx.device)
                self.ctx.group.broadcast(packed, src=0, stream=s)
                views = packed.split([sizes[j] for j in part])
                load([(items[j][0], v.view(items[j][1][1]).view(items[j][1][0]))
                      for j, v in zip(part, views)])   # copies on s, the current stream
                del views, packed
        for s in self.streams:
            caller.wait_stream(s)                      # the caller reads its parameters next


@streamfuzz.target
def make_handler(ctx: WeightSyncContext) -> MyWeightSync:
    return MyWeightSync(ctx)
