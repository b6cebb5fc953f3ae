"""The toy protocol's built-in targets: the fill on a side stream, joined back or not."""

from __future__ import annotations

from typing import Any

import torch


class _Filler:
    join = True

    def __init__(self, ctx: dict[str, Any]) -> None:
        self.streams = ctx["streams"]
        self.side = self.streams.Stream()

    def fill(self, out: torch.Tensor, value: int) -> None:
        main = self.streams.current_stream()
        self.side.wait_stream(main)
        with self.streams.stream(self.side):
            out.fill_(value)
        if self.join:
            main.wait_stream(self.side)


def synced(ctx: dict[str, Any]) -> _Filler:
    return _Filler(ctx)


class _Unsynced(_Filler):
    join = False  # the caller reads ``out`` on its stream, unordered after the fill


def unsynced(ctx: dict[str, Any]) -> _Filler:
    return _Unsynced(ctx)
