"""The weight-sync target API: what a handler is built from (the methods it
must provide are ``streamfuzz.fuzz.weight_sync.handler``'s).

A target is ``factory(ctx) -> handler``, called on every rank at the start of
every example. Per sync, group rank 0 calls ``handler.send(named)`` with an
iterator of ``(name, parameter)``; every other rank calls
``handler.receive(meta, load)`` with an iterator of ``(name, (shape, dtype))``
and the post-unpack callback ``load(list of (name, tensor))``, which copies
the tensors into the rank's own parameters on the current stream. Both sides
broadcast through ``ctx.group.broadcast(tensor, src=0)``, as vLLM's
``PyNcclCommunicator``: on the current stream, the host not blocked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


class Group:
    """The broadcast group a target sees: ``broadcast(tensor, src=0, stream=None)``.

    On the producer it clones each buffer on the stream the broadcast is
    issued on, where NCCL reads it: those clones are what the value oracle
    checks, so stale bytes show even in a world of one GPU. ``on_first``
    runs (once) when the target first hands a buffer to the group.
    """

    def __init__(self, pg: Any, rank: int) -> None:
        self.pg = pg
        self.rank = rank
        self.sent: list[torch.Tensor] = []
        self.on_first: Callable[[], None] | None = None

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: Any = None) -> None:
        with torch.cuda.stream(stream) if stream is not None else _nothing():
            if self.rank == src:
                self.sent.append(tensor.clone())
            dist.broadcast(tensor, src=src, group=self.pg)
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first()


class _nothing:  # noqa: N801 - a context manager read as a phrase
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass
class WeightSyncContext:
    """What one rank's handler is built from."""

    rank: int
    world_size: int
    device: torch.device
    group: Group
    buffer_bytes: int
    num_buffers: int
    streams: Any
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_producer(self) -> bool:
        return self.rank == 0
