"""Hypothesis strategies for streamfuzz scenarios, composed from small parts.

``scenarios()`` (the draft broadcast) is the one most users want; the parts
are public so that a target's own test can build narrower scenarios (one
step, no churn, ...). ``weight_sync_scenarios()`` is the weight sync's. Each
protocol keeps its strategies in its own package (``fuzz/draft/strategies``,
``fuzz/weight_sync/strategies.py``); this package re-exports them. Imported
as ``streamfuzz.strategies`` only, as ``streamfuzz.fuzz`` is.
"""

if __name__ != "streamfuzz.strategies":
    raise ImportError(f"streamfuzz's strategies are imported as streamfuzz.strategies, "
                      f"not {__name__}", name=__name__)

from streamfuzz.fuzz.draft.strategies.batches import batches, idx_mappings
from streamfuzz.fuzz.draft.strategies.churn import churn_ops
from streamfuzz.fuzz.draft.strategies.interleavings import delays
from streamfuzz.fuzz.draft.strategies.scenarios import scenarios, steps
from streamfuzz.fuzz.weight_sync.strategies import weight_sync_scenarios

__all__ = ["batches", "churn_ops", "delays", "idx_mappings", "scenarios", "steps",
           "weight_sync_scenarios"]
