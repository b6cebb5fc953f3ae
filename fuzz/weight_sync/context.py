"""Deprecated: the weight sync's context moved to ``streamfuzz.weight_sync``.

Kept for one release; each name read here warns and names its new import.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {"WeightSyncContext": "streamfuzz.fuzz.weight_sync.group",
          "Group": "streamfuzz.fuzz.weight_sync.group"}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} is deprecated: use `from streamfuzz.weight_sync import "
                  f"{name}`", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)
