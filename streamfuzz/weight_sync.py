"""The weight sync's target API: what a handler is built from and must provide.

A target is ``factory(ctx) -> handler``, called on every rank at the start of
every example; per sync group rank 0 calls ``send(named)`` and every other rank
``receive(meta, load)``, both broadcasting through ``ctx.group``
(``docs/target-weight-sync.md``)::

    import streamfuzz
    from streamfuzz.weight_sync import WeightSyncContext

    @streamfuzz.target
    def make_handler(ctx: WeightSyncContext) -> MyWeightSync: ...
"""

from streamfuzz.fuzz.weight_sync.group import Group, WeightSyncContext
from streamfuzz.fuzz.weight_sync.handler import (
    Load,
    Meta,
    Named,
    WeightSyncConsumer,
    WeightSyncHandler,
    WeightSyncProducer,
)

PROTOCOL = "weight-sync"
"""The protocol's name, as ``--target`` reports and ``streamfuzz.target`` take it."""

__all__ = ["PROTOCOL", "Group", "Load", "Meta", "Named", "WeightSyncConsumer",
           "WeightSyncContext", "WeightSyncHandler", "WeightSyncProducer"]
