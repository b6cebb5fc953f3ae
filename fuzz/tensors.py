"""What memory a tensor is, and the tensors in an op's arguments.

Below the simulation and the oracles, which both speak this vocabulary:
the simulation marks each storage's kind, the lifetime oracle judges by it.
"""

from __future__ import annotations

from typing import Any

import torch

HOST = "host"
"""The host's key among the parties (streams are keyed by their ids or handles)."""
DEVICE, PINNED, PAGEABLE = "device", "pinned", "pageable"
"""What memory a tensor's storage is (see ``streamfuzz.fuzz.oracles.lifetime``)."""


def tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors in an op's argument or result (nested in lists and tuples)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors_in(v)]
    return []
