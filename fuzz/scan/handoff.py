"""An event handed to the caller with a side stream's work: the caller's contract.

A function that queues work on a side stream, records an event after it and
returns the event (or stores it where the caller reaches it: an attribute of
``self`` or of an argument) leaves the ordering of what it wrote to whoever
waits on that event. Its unordered or lifetime findings on tensors the caller
can reach are still reported, scored lower, with the wait they rely on named
(``hazards.FACTORS['event-handoff']``); not an unordered write to what the
function itself made or wrote on the other stream, whose start no later wait
can order. An event recorded before the work covers none of it: that is
``event-before-work``, unchanged.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from streamfuzz.fuzz.scan.ops import K, Op, Trace

TIMING = re.compile(r"start|begin|tic|timer|timing|elapsed", re.I)
"""Names of events that time work rather than order it."""


def handoff_safe(event: str, stream: str, names: str, more: str) -> str:
    """What makes a handed-off finding safe: the caller's wait on ``event``."""
    return (f"safe if the caller waits on {event} (handed back here, recorded on {stream} "
            f"after this work) before it reads, writes or drops {names}, {more}; the "
            "handoff is the caller's contract, so check each caller")


class Handoffs:
    """The handoff rules of the judge (``hazards._Judge``)."""

    t: Trace
    ops: list[Op]
    records: dict[str, list[tuple[int, str]]]

    def param_owned(self, k: str) -> bool:
        return k.split(".")[0].split("[")[0] in self.t.params

    def handoff(self, k: str, b: str) -> str:
        """An event handed to the caller (returned, or stored where the caller can reach
        it) and recorded on ``b`` after every access of ``b`` to ``k``, which the caller
        can reach too; '' if none."""
        if not (k.startswith(("self.", "cls.")) or self.param_owned(k) or self.escapes(k)):
            return ""
        last = max((p for p, o in enumerate(self.ops) if o.key == k and o.stream == b
                    and o.kind is K.USE), default=-1)
        for e, recs in sorted(self.records.items()):
            if e in self.t.timing_events or TIMING.search(e.rsplit(".", 1)[-1]):
                continue
            if not any(r > last and s == b for r, s in recs):
                continue
            if any(o.key == e and o.kind in (K.WAIT_EVENT, K.HOST_SYNC) for o in self.ops):
                continue  # waited on here: not the caller's to wait on
            if e.startswith(("self.", "cls.")) or self.param_owned(e) or self.escapes(e):
                return self.t.name(e)
        return ""

    @functools.cached_property
    def _kept_outright(self) -> set[str]:
        return {o.key for o in self.ops if o.kind is K.KEEP and not o.other}

    def escapes(self, k: str) -> bool:
        """Is ``k`` returned or stored (itself, or in a container that is)? A reference
        put in a local container outlives the call only with the container."""
        outer = self._kept_outright
        return any(o.kind is K.KEEP and o.key == k and (not o.other or o.other in outer)
                   for o in self.ops)

    def split_handoffs(self, groups: dict[tuple[str, str, str], dict[str, Any]]) -> None:
        """The tensors of each group that the side stream writes and hands back with an
        event recorded after: a group of their own (kind + '+handoff')."""
        for (b, a, kind), g in list(groups.items()):
            if kind == "early":
                continue
            # What this function itself wrote or made on the other stream, the side
            # stream then writes unordered: no wait of the caller's after the event
            # orders that write's start (a fresh block's last owner may still use it).
            handed = {k: e for k in g["written"] - g["here"] if (e := self.handoff(k, b))}
            if not handed:
                continue
            rest = g["tensors"] - set(handed)
            if rest:  # what the event does not cover stays a finding apart
                g["tensors"], g["written"] = rest, g["written"] - set(handed)
                g["write"], g["line"] = bool(g["written"]), min(g["lines"][k] for k in rest)
            else:
                del groups[(b, a, kind)]
            groups[(b, a, kind + "+handoff")] = {
                "line": min(g["lines"][k] for k in handed), "tensors": set(handed),
                "write": True, "event": ", ".join(sorted(set(handed.values())))}
