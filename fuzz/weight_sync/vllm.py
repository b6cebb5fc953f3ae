"""vLLM's packed NCCL weight broadcast as weight-sync targets: the ``vllm-weights`` family.

The weight-sync protocol names this loader (``Protocol.upstream``);
``streamfuzz.fuzz.targets`` reaches it through the registry. The code itself is read and
driven by ``streamfuzz.fuzz.weight_sync.vllm_weights``. A replay is not checked against
the code it was found on, and ``mutate`` does not edit it (``code`` is None).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


class _Family:
    """The loader of the ``vllm-weights`` family (``streamfuzz.fuzz.targets.names.Family``)."""

    def code(self, family: str, version: str | None) -> None:
        return None

    def factory(self, family: str, version: str | None) -> Any:
        from streamfuzz.fuzz.weight_sync import vllm_weights

        return vllm_weights.factory(version)

    def provenance(self, family: str, version: str | None) -> dict[str, Any]:
        from streamfuzz.fuzz.weight_sync import vllm_weights

        return vllm_weights.provenance(version)

    def source(self, code: Any) -> tuple[str, ast.Module, str,
                                         Callable[[ast.Module, dict[str, Any], str], Any]]:
        raise NotImplementedError("the vllm-weights family is not mutated")


FAMILY = _Family()
