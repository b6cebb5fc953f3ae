"""The weight sync's handler roles, as ``typing.Protocol``s.

They are the one source of the methods the runner calls per role
(``PROTOCOL.handler_methods``) and what ``streamfuzz.weight_sync`` gives a
target writer's type checker. Light on purpose: the registry reads this
module, and torch is named for the checker alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

Named = Iterator[tuple[str, "torch.Tensor"]]
"""What the producer sends: ``(name, parameter)`` in a fixed order."""
Meta = Iterator[tuple[str, tuple[list[int], "torch.dtype"]]]
"""What a consumer receives first: ``(name, (shape, dtype))``, in the producer's order."""
Load = Callable[[list[tuple[str, "torch.Tensor"]]], None]
"""The post-unpack callback: copies the tensors into the rank's parameters on
the current stream."""


class WeightSyncProducer(Protocol):
    """Group rank 0's handler (the trainer): one call per sync."""

    def send(self, named: Named) -> None: ...


class WeightSyncConsumer(Protocol):
    """Every other rank's handler (an inference worker): one call per sync."""

    def receive(self, meta: Meta, load: Load) -> None: ...


class WeightSyncHandler(WeightSyncProducer, WeightSyncConsumer, Protocol):
    """A handler of every role, as a factory returns it (one class serves all ranks)."""
