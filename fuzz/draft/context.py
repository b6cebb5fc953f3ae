"""The draft broadcast's target API: what a handler under test receives.

A target is a callable ``factory(ctx) -> handler``. The harness calls it on
every rank at the start of every example (a fresh runner), then per step:

* last rank: ``handler.broadcast_drafts(draft_table, batch)`` returns the
  tensor it broadcast (or ``None`` when nothing was broadcast);
* other ranks: ``handler.receive_drafts(batch)`` every step, and, pipeline
  depth steps after a step that broadcast, ``handler.apply_received(draft_table)``
  which applies the oldest parked step and returns the received
  ``(sampled_tokens, num_sampled, num_rejected)``.

vLLM's own handler is the family ``vllm-pp`` (and ``vllm-pp-pre-pr``, the
derived pre-PR code), named with the upstream version: ``vllm-pp@0.32.0``
(``streamfuzz.fuzz.draft.targets.vllm_pp`` drives it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the driver imports this module and never needs torch itself
    import torch


@dataclass
class DraftContext:
    """What one rank's handler is built from.

    ``device`` is the rank's CUDA device (``cuda:0`` on the CPU simulation).
    ``streams`` is the run's stream API with torch.cuda's meaning; plain
    torch.cuda does the same, so a target needs it only if it prefers it.
    """

    rank: int
    world_size: int
    last_rank: int
    device: torch.device
    group: Any
    max_num_reqs: int
    num_spec_steps: int
    streams: Any
    pipeline_depth: int = 1
    """Steps between a broadcast and its apply on the other ranks (vLLM's ring depth)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.last_rank


@dataclass
class Batch:
    """One step's scheduled batch as a runner hands it to the handler.

    ``idx_mapping`` is a fresh device tensor (batch row -> request slot), copied
    on the main stream. The sampling tensors exist on the last rank only. The
    harness keeps no reference once the handler call returns.
    """

    step: int
    idx_mapping: torch.Tensor
    final: list[bool]
    sampled_tokens: torch.Tensor | None = None
    num_sampled: torch.Tensor | None = None
    num_rejected: torch.Tensor | None = None
    host_idx_mapping: tuple[int, ...] = ()
    """``idx_mapping`` as the host built it (vLLM's ``idx_mapping_np``): reading
    the device tensor back would synchronize the host."""

    @property
    def num_reqs(self) -> int:
        return len(self.final)

    @property
    def samples(self) -> bool:
        """False when every request is a non-final prefill chunk: nothing is broadcast."""
        return any(self.final)


TargetContext = DraftContext
"""The context's name before there were several protocols."""


class DraftSender(Protocol):
    """The last rank's handler: what the runner calls there, per step."""

    def broadcast_drafts(self, draft_table: torch.Tensor,
                         batch: Batch) -> torch.Tensor | None: ...


class DraftReceiver(Protocol):
    """Every other rank's handler: ``receive_drafts`` every step, and
    ``apply_received`` pipeline depth steps after a step that broadcast."""

    def receive_drafts(self, batch: Batch) -> None: ...

    def apply_received(
            self, draft_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The oldest parked step applied to ``draft_table``; returns the received
        ``(sampled_tokens, num_sampled, num_rejected)``."""
        ...


class DraftHandler(DraftSender, DraftReceiver, Protocol):
    """A handler of every role, as a factory returns it (one class serves all ranks)."""


Factory = Callable[[DraftContext], Any]
