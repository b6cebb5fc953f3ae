"""Moved to ``streamfuzz.fuzz.scan.standins`` (public: ``streamfuzz.standins``).

Kept for one release so that harnesses written before the move still import;
it warns once on import.
"""

from __future__ import annotations

import warnings

from streamfuzz.fuzz.scan.standins import Loaded, find_text, load

warnings.warn("streamfuzz.fuzz.targets.standins moved: import streamfuzz.standins "
              "(load, Loaded) instead; this name goes in the next release",
              DeprecationWarning, stacklevel=2)

__all__ = ["Loaded", "find_text", "load"]
