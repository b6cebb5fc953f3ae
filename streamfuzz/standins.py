"""Load one file of any package for a test, its unimportable imports stood in.

What a harness written by ``python -m streamfuzz scan --harness`` imports::

    from streamfuzz.standins import load
    TARGET = load("vllm-0.34.0-....whl", "vllm/v1/worker/gpu/structured_outputs.py")
    TARGET.module.apply_grammar_bitmask(...)

The file and the package's other files it imports run unchanged; imports that
fail are answered by stand-ins, listed in ``TARGET.stood_in``.
"""

from __future__ import annotations

from streamfuzz.fuzz.scan.standins import DEPTH, Loaded, load

__all__ = ["DEPTH", "Loaded", "load"]
