"""The three versions of ``streamfuzz.fuzz.draft.targets.pp_draft``, against ``ctx.streams``.

This is how targets were written before CUDA on CPU, and how a target may
still be written; the benchmark runs these beside the plain torch.cuda
versions to show what the simulation of torch.cuda costs. The handlers are
``pp_draft``'s own, handed ``ctx.streams`` and ``ctx.device`` where those take
``torch.cuda`` and ``"cuda"``.
"""

from __future__ import annotations

from typing import Any

from streamfuzz.fuzz.draft.context import TargetContext
from streamfuzz.fuzz.draft.targets import pp_draft


class _OnCtxStreams(pp_draft.DraftBroadcast):
    def _streams(self, ctx: TargetContext) -> tuple[Any, Any]:
        return ctx.streams, ctx.device


class PreFix(_OnCtxStreams, pp_draft.PreFix):
    """``pp_draft.PreFix`` on ``ctx.streams``."""


class PrFix(_OnCtxStreams, pp_draft.PrFix):
    """``pp_draft.PrFix`` on ``ctx.streams``."""


class MainGather(_OnCtxStreams, pp_draft.MainGather):
    """``pp_draft.MainGather`` on ``ctx.streams``."""


def pre_fix(ctx: TargetContext) -> PreFix:
    return PreFix(ctx)


def pr_fix(ctx: TargetContext) -> PrFix:
    return PrFix(ctx)


def main_gather(ctx: TargetContext) -> MainGather:
    return MainGather(ctx)
