"""The draft broadcast's target API: what a handler is built from and must provide.

A target is ``factory(ctx) -> handler``, called on every rank at the start of
every example; the last rank calls ``broadcast_drafts`` per step, every other
rank ``receive_drafts`` and later ``apply_received`` (``docs/target-draft.md``)::

    import streamfuzz
    from streamfuzz.draft import Batch, DraftContext

    @streamfuzz.target
    def make_handler(ctx: DraftContext) -> MyHandler: ...

The handler's methods are checked against ``DraftHandler`` by a type checker
and, on each rank, by the engine.
"""

from streamfuzz.fuzz.draft.context import (
    Batch,
    DraftContext,
    DraftHandler,
    DraftReceiver,
    DraftSender,
    TargetContext,
)

PROTOCOL = "draft-broadcast"
"""The protocol's name, as ``--target`` reports and ``streamfuzz.target`` take it."""

__all__ = ["PROTOCOL", "Batch", "DraftContext", "DraftHandler", "DraftReceiver", "DraftSender",
           "TargetContext"]
