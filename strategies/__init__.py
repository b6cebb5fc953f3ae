"""Hypothesis strategies for streamfuzz scenarios, composed from small parts.

``scenarios()`` is the one most users want; the parts are public so that a
target's own test can build narrower scenarios (one step, no churn, ...).
"""

from strategies.batches import batches, idx_mappings
from strategies.churn import churn_ops
from strategies.interleavings import delays
from strategies.scenarios import scenarios, steps

__all__ = ["batches", "churn_ops", "delays", "idx_mappings", "scenarios", "steps"]
