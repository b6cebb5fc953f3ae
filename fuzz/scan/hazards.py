"""Hazard classes, the rules that find them in a function's ops, and the score.

A finding is a place where the ops of one function leave two parties (two
streams, or a stream and the host) unordered in a way the published bugs were
made of. The score says how likely it is a real hazard: the base of its class
plus the factors seen (``FACTORS``), clamped to 1..99. docs/scan.md lists both
tables with the reasoning behind them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from streamfuzz.fuzz.scan.handoff import TIMING, Handoffs, handoff_safe
from streamfuzz.fuzz.scan.loops import synced_after
from streamfuzz.fuzz.scan.names import HOSTISH, covers
from streamfuzz.fuzz.scan.ops import (
    ANY,
    ARGUMENT,
    BLOCKING_READS,
    COPY_SOURCE,
    CURRENT,
    DEFAULT,
    REBOUND,
    SUBMITTER,
    THREAD,
    K,
    Op,
    Trace,
    disjoint_parts,
)


class Hazard(str, Enum):
    LIFETIME = "cross-stream-lifetime"
    UNORDERED = "unordered-streams"
    PINNED_REWRITE = "pinned-rewrite"
    UNSYNCED_D2H = "unsynced-d2h"
    EARLY_EVENT = "event-before-work"
    CACHED_STREAM = "module-level-stream"
    ASYNC_COLLECTIVE = "unwaited-collective"


BASE: dict[Hazard, int] = {
    Hazard.LIFETIME: 50,
    Hazard.UNORDERED: 45,
    Hazard.PINNED_REWRITE: 50,
    Hazard.UNSYNCED_D2H: 55,
    Hazard.EARLY_EVENT: 40,
    Hazard.CACHED_STREAM: 20,
    Hazard.ASYNC_COLLECTIVE: 40,
}
"""Each class's starting score: how often the pattern was a real bug in the
published record (docs/scan.md)."""

FACTORS: dict[str, tuple[int, str]] = {
    "dies-here": (15, "made in this function and dropped at its end: nothing else holds it"),
    "freed": (15, "freed explicitly (del, resize_(0), rebinding) after the other stream's use"),
    "write": (10, "the unordered access writes (WAR/WAW hit harder than RAW)"),
    "thread": (10, "run by a thread: the submitter's stream is never ordered implicitly"),
    "sibling-passes": (25, "another call of the same function passes the ordering argument "
                           "this call leaves out"),
    "no-wait-at-all": (10, "the side stream waits for nothing anywhere in the function"),
    "entry-barrier": (-20, "every block of work on the allocating stream here starts by "
                           "waiting for the stream that uses the tensor: where its other "
                           "users do the same, the reuse of the block waits too"),
    "caller-owned": (-10, "made by the caller, whose reference may outlive the work"),
    "kept": (-15, "stored or returned (or put in a container that is): its lifetime goes "
                  "beyond the function"),
    "conditional-order": (-5, "an ordering exists, on some paths only"),
    "object-state": (-5, "long-lived state of an object or module"),
    "previous-call": (-10, "the pending copy is one a previous call started"),
    "consumed-elsewhere": (-10, "the event is waited on outside this function"),
    "event-handoff": (-20, "an event recorded after this work is handed to the caller "
                           "(returned or stored where it can reach it): the caller's "
                           "contract is to wait on it"),
    "other-method": (-5, "the other stream's use is left pending by another method of "
                         "the class (or by a previous call of this one)"),
    "owner-unseen": (-25, "a stream a loop or thread of the package keeps current may touch "
                          "the same memory, and the function never names it: the source "
                          "cannot tell; the dynamic check can"),
    "opaque-work": (-15, "the side stream's work is issued by calls whose tensors are not seen"),
    "test-code": (-30, "in tests, benchmarks or examples"),
}
"""Factor -> (points, why)."""

TEST_PATH = re.compile(r"(^|/)(tests?|testing|benchmarks?|examples?)(/|$)|(^|/)test_[^/]*$"
                        r"|_test\.py$|(^|/)conftest\.py$")

_SAFE_IF: dict[Hazard, str] = {
    Hazard.LIFETIME: "safe if the tensor is held until the other stream's work is done (a "
                     "reference kept until a later wait or sync); made safe by "
                     "t.record_stream(other stream), or by the allocating stream waiting for "
                     "the other before the tensor is dropped",
    Hazard.UNORDERED: "safe if the caller orders the streams before this point, or nothing else "
                      "touches these tensors meanwhile; made safe by "
                      "side.wait_stream(producer) (or wait_event on an event recorded after "
                      "the producing work) before the access",
    Hazard.PINNED_REWRITE: "safe if the copy has finished before the host writes (an "
                           "event.synchronize() on the copy's event, or a sync each step); "
                           "made safe by that sync, or by staging each copy through a fresh "
                           "or double-buffered host tensor",
    Hazard.UNSYNCED_D2H: "safe if a sync the scan cannot see runs between the copy and the "
                         "read; made safe by event.synchronize() (event recorded after the "
                         "copy), stream.synchronize(), or a blocking copy",
    Hazard.EARLY_EVENT: "safe if the work after the record is not what the waiter needs; made "
                        "safe by recording the event after that work",
    Hazard.CACHED_STREAM: "safe if one process uses one device and every user orders it "
                          "against its own stream; made safe by owning the stream per object "
                          "and waiting on the caller's stream at each use",
    Hazard.ASYNC_COLLECTIVE: "safe if the work is waited for before the tensor is touched; "
                             "made safe by work.wait() (which orders the current stream) "
                             "before the access",
}


@dataclass
class Finding:
    hazard: Hazard
    file: str
    line: int
    function: str
    tensors: tuple[str, ...]
    streams: tuple[str, ...]
    what: str
    factors: tuple[str, ...] = ()
    score: int = 0
    suppressed: str | None = None
    rank: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    safe: str = ""  # what makes this one finding safe, where the class's words say less

    @property
    def safe_if(self) -> str:
        return self.safe or _SAFE_IF[self.hazard]

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}"

    def scored(self) -> Finding:
        raw = BASE[self.hazard] + sum(FACTORS[f][0] for f in self.factors)
        self.score = max(1, min(99, raw))
        return self

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "score": self.score, "class": self.hazard.value,
                "file": self.file, "line": self.line, "function": self.function,
                "tensors": list(self.tensors), "streams": list(self.streams),
                "what": self.what, "factors": list(self.factors), "safe_if": self.safe_if,
                "suppressed": self.suppressed}


def _show(stream: str) -> str:
    return {CURRENT: "current stream", THREAD: "thread's current stream", DEFAULT: "default stream",
            SUBMITTER: "submitter's stream"}.get(stream, stream)


_IDENT = re.compile(r"^[\w.]+$")


def _crossed(t: Trace) -> set[str]:
    """What a call returned on one stream and work on another stream then took: a
    value computed on a side stream to be handed to other work is a tensor (the
    outputs of a model's layers, of custom ops), even where nothing else says so."""
    made = {o.key: o.stream for o in t.ops if o.kind is K.ALLOC and o.key in t.maybe}
    handed = {(o.key, o.line) for o in t.ops if o.kind is K.KEEP}  # returned, stored: no work
    return {o.key for o in t.ops if o.kind is K.USE and o.key in made
            and o.stream != made[o.key] and (o.key, o.line) not in handed}


class _Judge(Handoffs):
    """The rules, applied to one trace."""

    def __init__(self, t: Trace, owned: dict[str, str] | None = None) -> None:
        self.t = t
        self.owned = owned or {}  # buffer attribute -> its object's only stream's
        self.ops = t.ops
        self.records: dict[str, list[tuple[int, str]]] = {}
        for i, o in enumerate(self.ops):
            if o.kind is K.EVENT_RECORD:
                self.records.setdefault(o.key, []).append((i, o.stream))
        self.launches: dict[str, list[int]] = {}  # stream -> where it launched collectives
        for i, o in enumerate(self.ops):
            if o.kind is K.COLLECTIVE:
                self.launches.setdefault(o.stream, []).append(i)
        self.crossed = _crossed(t)
        self.copied = {(k, o.line) for o in t.ops if o.kind is K.NB_COPY
                       for k in (o.key, o.other)}  # a stream's copy to or from host memory
        # a thread's inputs read here only as the source of a copy to the device (by
        # itself, or by the package's helper it hands them to)
        reads: dict[str, set[str]] = {}
        for o in t.ops if t.thread else ():
            if o.kind is K.USE and o.flag != ARGUMENT:
                reads.setdefault(o.key, set()).add(o.flag if not o.write else "write")
        self.copied_in = {k for k, flags in reads.items() if flags == {COPY_SOURCE}}
        self.common: list[str] = []
        if TEST_PATH.search(t.file):
            self.common.append("test-code")
        if t.thread:
            self.common.append("thread")

    def tensorish(self, k: str) -> bool:
        if not k or k.startswith(("<scalar", "<work@", "<event@")) or k in (ANY, "self", "cls"):
            return False
        if k in self.t.streams or k in self.t.events:
            return False
        if k.split(".")[0] in self.t.maybe:
            return k in self.t.tensors or k in self.crossed
        return k in self.t.tensors or k.startswith("<tmp@")

    def hosted(self, k: str) -> bool:
        """Host memory by what made it (``pin_memory()``, a helper named for the host,
        host work on host memory) or by its name (``lens_cpu``, ``self.ids_pinned``)."""
        name = self.t.name(k)
        return k in self.t.pinned or k in self.t.hosted or (_IDENT.match(name) is not None and
                                    HOSTISH.search(name.rsplit(".", 1)[-1]) is not None)

    def local(self, k: str) -> bool:
        return k.startswith("<tmp@") and k not in self.t.persistent

    # -- ordering ------------------------------------------------------------

    def ordered(self, a: str, i: int, b: str, p: int) -> str:
        """Is stream ``b`` at op ``p`` ordered after stream ``a``'s work up to op ``i``?
        'yes', 'cond' (on some paths only), 'early:EVENT' or 'no'."""
        if a == b:
            return "yes"
        use_guards = self.ops[p].guards if p < len(self.ops) else ()
        # an order on the access's own path after it holds wherever the access ran
        access_guards = self.ops[i].guards if 0 <= i < p else None
        best = "no"
        partial: list[tuple[int, ...]] = []
        span = range(max(i + 1, 0), min(p, len(self.ops))) if i < p else [
            *range(i + 1, len(self.ops)), *range(p)]  # i: in the previous call
        for j in span:
            o = self.ops[j]
            how = self._orders(o, j, a, i, b)
            if how is None:
                continue
            if how.startswith("early"):
                if best == "no":
                    best = how
                continue
            if self.t.on_path(o, use_guards) or (
                    access_guards is not None and o.guards == access_guards[:len(o.guards)]):
                return "yes"
            partial.append(o.guards)
            if _all_paths(partial):
                return "yes"
            best = "cond"
        return best

    def _orders(self, o: Op, j: int, a: str, i: int, b: str) -> str | None:
        if o.kind is K.WAIT and (o.stream == ANY or covers(o.stream, b)) and (
                o.other == ANY or covers(o.other, a)):
            return "yes"
        if o.kind is K.WAIT and o.stream == b and a in (CURRENT, SUBMITTER) and \
                o.other not in self.t.entered and o.other != DEFAULT:
            return "yes"  # a stream this function never enters: taken as its caller's
        if o.kind is K.WAIT and o.stream == ANY:
            return "yes"
        if o.kind is K.WAIT_EVENT and o.stream in (b, ANY):
            recs = self.records.get(o.key)
            if not recs or o.key == ANY:
                return "yes"  # recorded elsewhere: the scan cannot tell what it covers
            on_a = [r for r, s in recs if s in (a, ANY)]
            if any(i < r < j for r in on_a):
                return "yes"
            if any(r <= i for r in on_a):
                return f"early:{o.key}"
            return None
        if o.kind is K.WORK_WAIT and o.stream in (b, ANY) and any(
                i < c < j for c in self.launches.get(a, ())):
            return "yes"  # the collective waited for was queued after a's access
        if o.kind is K.HOST_SYNC:
            if o.key in ("", a):
                return "yes"
            if o.key in self.t.streams:
                return None  # another stream's sync
            recs = self.records.get(o.key)  # an event's: what it was recorded after
            if not recs or any(i < r < j and s in (a, ANY) for r, s in recs):
                return "yes"
        return None

    # -- rules ---------------------------------------------------------------

    def findings(self) -> Iterator[Finding]:
        yield from self.unordered()
        yield from self.lifetime()
        yield from self.pinned_rewrite()
        yield from self.unsynced_d2h()
        yield from self.stored_early_events()
        yield from self.collectives()

    def _finding(self, hazard: Hazard, line: int, tensors: Iterable[str],
                 streams: Iterable[str], what: str, factors: Iterable[str]) -> Finding:
        fs = tuple(dict.fromkeys([*factors, *self.common]))
        return Finding(hazard, self.t.file, line, self.t.qualname,
                       tuple(sorted({self.t.name(k) for k in tensors})),
                       tuple(dict.fromkeys(_show(s) for s in streams)), what, fs).scored()

    def _last_write(self, k: str, p: int) -> tuple[str, int]:
        here = self.ops[p].guards
        for j in range(p - 1, -1, -1):
            o = self.ops[j]
            if _exclusive(o.guards, here) or disjoint_parts(o.part, self.ops[p].part):
                continue  # the other branch of an if this access is under, or another part
            if o.key == k and (o.kind is K.ALLOC or (o.kind is K.USE and o.write)):
                return o.stream, j
            if o.key == k and o.kind is K.FREE:
                return "", j
        if self.local(k):
            return "", -1
        owner, _, attr = k.rpartition(".")
        if attr in self.owned and self.ops[p].stream == f"{owner}.{self.owned[attr]}":
            return "", -1  # touched only on its object's stream: nothing else wrote it
        if k.startswith("self."):  # object state: as if called twice, the previous call's
            for j in range(len(self.ops) - 1, p, -1):
                o = self.ops[j]
                if o.key == k and o.kind is K.USE and o.write and not o.guards:
                    if o.stream != self.ops[p].stream:
                        return o.stream, j
                    break
        return self.t.producer, -1

    def unordered(self) -> Iterator[Finding]:
        groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        sides_with_uses: set[str] = set()
        for p, o in enumerate(self.ops):
            if o.kind is not K.USE or o.stream == ANY or not self.tensorish(o.key):
                continue
            if self.hosted(o.key) and (o.key, o.line) not in self.copied:
                continue  # host memory: what touches it here is the host, not a stream
            if o.stream != self.t.base:
                sides_with_uses.add(o.stream)
            a, i = self._last_write(o.key, p)
            if o.key in self.t.host and (i < 0 or self.ops[i].kind is K.ALLOC):
                a = ""  # host memory the host filled before queuing this: pinned-rewrite's
            if a == SUBMITTER and o.key in self.copied_in:
                a = ""  # a thread's input only copied to the device: host memory (a
                # loader's batch), or already there, where the copy queues nothing
            checks = [(a, i, True)] if a and a != ANY else []
            if o.write:  # WAR: an earlier read on another stream
                for j in range(p - 1, max(i, -1), -1):
                    r = self.ops[j]
                    if r.kind is K.USE and r.key == o.key and r.stream not in (o.stream, ANY) \
                            and not _exclusive(r.guards, o.guards) and not disjoint_parts(
                                r.part, o.part):
                        checks.append((r.stream, j, False))
                        break
            for a, i, _raw in checks:
                how = self.ordered(a, i, o.stream, p)
                if how == "yes":
                    continue
                kind = "early" if how.startswith("early") else how
                g = groups.setdefault((o.stream, a, kind), {
                    "line": o.line, "tensors": set(), "write": False, "written": set(),
                    "lines": {}, "event": how[6:] if kind == "early" else "", "here": set()})
                g["tensors"].add(o.key)
                if i >= 0:  # written (or made) on ``a`` in this very function
                    g["here"].add(o.key)
                g["lines"].setdefault(o.key, o.line)
                g["write"] = bool(g["write"]) or o.write
                if o.write:
                    g["written"].add(o.key)
        self.split_handoffs(groups)
        for (b, a, kind), g in sorted(groups.items(), key=lambda kv: kv[1]["line"]):
            handoff = kind.endswith("+handoff")
            kind = kind.removesuffix("+handoff")
            tensors = sorted(g["tensors"])
            names = ", ".join(self.t.name(k) for k in tensors)
            factors = ["write"] if g["write"] else []
            if kind == "cond":
                factors.append("conditional-order")
            if all(k.startswith(("self.", "cls.")) for k in tensors):
                factors.append("object-state")
            if not any(o.kind in (K.WAIT, K.WAIT_EVENT) and o.stream in (b, ANY)
                       for o in self.ops) and b not in (CURRENT, THREAD):
                factors.append("no-wait-at-all")
            if kind == "early":
                yield self._finding(
                    Hazard.EARLY_EVENT, int(g["line"]), tensors, (a, b),  # type: ignore
                    f"{_show(b)} waits on {self.t.name(str(g['event']))}, recorded on "
                    f"{_show(a)} before the work on {names} it is meant to cover", factors)
                continue
            acc = "writes" if g["write"] else "reads"
            f = self._finding(
                Hazard.UNORDERED, int(g["line"]), tensors, (a, b),  # type: ignore
                f"{_show(b)} {acc} {names}, last written on {_show(a)}, with no "
                f"{'unconditional ' if kind == 'cond' else ''}wait between them",
                [*factors, "event-handoff"] if handoff else factors)
            if handoff:
                f.safe = handoff_safe(str(g["event"]), _show(b), names, (
                    f"and passes them in with no work of {_show(a)} still pending on them "
                    f"(the writes here do not wait for {_show(a)})"))
            yield f
        yield from self._opaque_side_work(sides_with_uses)

    def _opaque_side_work(self, seen: set[str]) -> Iterator[Finding]:
        """A side stream that work is put on (an event recorded on it marks the work's
        end) but that never waits for anything, where no tensor use shows it."""
        base = self.t.base
        for o in self.ops:
            if o.kind is not K.EVENT_RECORD or o.stream in (base, ANY, "") or o.stream in seen:
                continue
            if o.stream not in self.t.streams:
                continue
            if o.stream in self.t.params and o.stream not in self.t.entered and \
                    all(w.kind is K.EVENT_RECORD for w in self.ops):
                continue  # it only marks the stream it is given: the work is its callers'
            waits = [w for w in self.ops if w.kind in (K.WAIT, K.WAIT_EVENT)
                     and w.stream in (o.stream, ANY)]
            if _all_paths([w.guards for w in waits]) or TIMING.search(o.key.rsplit(".", 1)[-1]):
                continue
            factors = ["opaque-work"]
            factors.append("conditional-order" if waits else "no-wait-at-all")
            seen.add(o.stream)
            yield self._finding(
                Hazard.UNORDERED, o.line, (), (self.t.producer, o.stream),
                f"work is put on {o.stream} (event {self.t.name(o.key)} marks its end) with "
                f"{'a wait on some paths only' if waits else 'no wait'} for "
                f"{_show(self.t.producer)}", factors)

    def lifetime(self) -> Iterator[Finding]:
        keys = sorted({o.key for o in self.ops if o.kind is K.USE and self.tensorish(o.key)})
        merged: dict[str, Finding] = {}
        for k in keys:
            if not (self.local(k) or self.param_owned(k)) or k in self.t.host or self.hosted(k):
                continue  # host memory: its lifetime is the pinned allocator's (events)
            recorded = {o.stream for o in self.ops if o.kind is K.RECORD and o.key == k}
            kept = self.escapes(k)
            for start, a, end, freed in self._generations(k):
                # read as a copy's source to a device: held by the host allocator
                uses = [(p, self.ops[p]) for p in range(start + 1, end)
                        if self.ops[p].kind is K.USE and self.ops[p].key == k
                        and self.ops[p].flag != COPY_SOURCE]
                other = sorted({o.stream for _, o in uses} - {a, ANY})
                bad, line, cond = [], 0, False
                for b in other:
                    if b in recorded or ANY in recorded:
                        continue
                    last = max(p for p, o in uses if o.stream == b)
                    how = self.ordered(b, last, a, end)
                    if how == "yes" or self._synced_in_a_later_pass(
                            [p for p, o in uses if o.stream == b], b, end):
                        continue
                    cond = cond or how == "cond"
                    bad.append(b)
                    first = min(o.line for _, o in uses if o.stream == b)
                    line = first if not line else min(line, first)
                if not bad:
                    continue
                factors = []
                if freed:
                    factors.append("freed")
                elif kept:
                    factors.append("kept")
                elif self.local(k):
                    factors.append("dies-here")
                else:
                    factors.append("caller-owned")
                if cond:
                    factors.append("conditional-order")
                if a != self.t.base and all(self._barriered(a, b) for b in bad) or \
                        "caller-owned" in factors and all(self._waited_first(a, b) for b in bad):
                    factors.append("entry-barrier")
                events = [self.handoff(k, b) for b in bad] if not freed and (
                    kept or not self.local(k)) else []
                if events and all(events):
                    factors.append("event-handoff")
                where = "freed" if freed else "kept beyond the call" if kept else (
                    "dropped at return" if self.local(k) else "owned by the caller")
                root = k.split(".")[0]
                if root.startswith("<tmp@") and root != k:  # one finding per object made
                    if root in merged:
                        merged[root].tensors = tuple(sorted({*merged[root].tensors,
                                                             self.t.name(k)}))
                        break
                f = self._finding(
                    Hazard.LIFETIME, line, (k,), (a, *bad), factors=factors,
                    what=f"{self.t.name(k)} is made on {_show(a)} and used on "
                         f"{', '.join(map(_show, bad))} with no record_stream; it is "
                         f"{where} with that work possibly queued")
                if "event-handoff" in factors:
                    f.safe = handoff_safe(", ".join(sorted(set(events))), _show(bad[0]),
                                          self.t.name(k), "keeping a reference until then")
                if root.startswith("<tmp@") and root != k:
                    merged[root] = f
                    f.what = f.what.replace(self.t.name(k), self.t.name(root) + "'s tensors", 1)
                yield f
                break

    def _synced_in_a_later_pass(self, uses: list[int], b: str, end: int) -> bool:
        """Is each use followed, before ``end``, by a host sync that covers ``b`` in a
        pass of the same ``for i in range(...)`` loop that every run reaching the
        use reaches after it (``fuzz.scan.loops``)? The sync must be on the use's
        path outside the loop, and not inside a loop nested in it."""
        for p in uses:
            loop = min((lp for lp in self.t.loops if lp.var is not None and any(
                s <= p < e for s, e in lp.passes)), key=lambda lp: lp.passes[-1][1]
                - lp.passes[0][0], default=None)
            if loop is None or end < loop.passes[-1][1]:
                return False
            start, stop = loop.passes[0][0], loop.passes[-1][1]
            inner = [(s, e) for lp in self.t.loops if lp is not loop
                     and start <= lp.passes[0][0] and lp.passes[-1][1] <= stop
                     for s, e in lp.passes]
            use = self.ops[p]
            syncs = [o for q, o in enumerate(self.ops[start:stop], start)
                     if o.kind is K.HOST_SYNC and o.key in ("", b)
                     and o.guards[:loop.depth] == use.guards[:loop.depth]
                     and not any(s <= q < e for s, e in inner)]
            if not synced_after(loop, use, syncs, self.t.tests):
                return False
        return bool(uses)

    def _barriered(self, a: str, b: str) -> bool:
        """Does every entry into stream ``a`` here wait for ``b`` before its first work?"""
        ops = self.ops
        on_a = [p for p, o in enumerate(ops) if o.stream == a and o.kind in (K.USE, K.ALLOC)]
        entries = [e for s, e in self.t.entries if s == a]
        for e in entries:
            first = next((p for p in on_a if p >= e), None)
            if first is None:
                continue
            prev = max((p for p in on_a if p < e), default=-1)
            if not any(self._waits_for(ops[j], a, b) for j in range(prev + 1, first)):
                return False
        return bool(entries)

    def _waited_first(self, a: str, b: str) -> bool:
        """Does the caller's stream ``a`` wait for ``b`` before ``b``'s first work here?
        Then a previous call's work on ``b`` is ordered before what the caller queued
        since (the shape of a double buffer handed back and forth)."""
        first = next((p for p, o in enumerate(self.ops)
                      if o.stream == b and o.kind in (K.USE, K.ALLOC)), None)
        return first is not None and any(  # named here: a callee's lent wait names none
            o.kind is K.WAIT and o.stream == a and o.other == b for o in self.ops[:first])

    def _waits_for(self, o: Op, a: str, b: str) -> bool:
        if o.kind is K.WAIT:
            return o.stream in (a, ANY) and o.other in (b, ANY)
        if o.kind is K.WAIT_EVENT and o.stream in (a, ANY):
            recs = self.records.get(o.key)
            return not recs or any(s in (b, ANY) for _, s in recs)
        return False

    def _generations(self, k: str) -> Iterator[tuple[int, str, int, bool]]:
        """(start, stream made on, end, freed at end) for each life of ``k``."""
        start, stream = -1, (self.t.producer if not self.local(k) else "")
        root = k.split(".")[0]
        for j, o in enumerate(self.ops):
            if o.key != k and not (o.key == root and o.kind in (K.ALLOC, K.FREE)):
                continue
            if o.kind is K.ALLOC:
                if stream:
                    yield start, stream, j, True
                start, stream = j, o.stream
            elif o.kind is K.FREE and stream:
                yield start, stream, j, True
                start, stream = j, ""
        if stream:
            yield start, stream, len(self.ops), False

    def pinned_rewrite(self) -> Iterator[Finding]:
        copies = [(j, o) for j, o in enumerate(self.ops) if o.kind is K.NB_COPY]
        done: set[str] = set()
        for w, o in enumerate(self.ops):
            if o.kind is not K.HOST_WRITE or o.key in done:
                continue
            k = o.key
            if k not in self.t.pinned and not (k in self.t.host and k in self.t.persistent):
                continue
            from_k = [(j, c) for j, c in copies if c.other == k]
            if not from_k:
                continue
            pending = [(j, c) for j, c in from_k if j < w and not self._synced(j, c.stream, w)
                       and not self._made_again(k, j, w)]
            later = [(j, c) for j, c in from_k if j > w]
            factors: list[str] = []
            if pending:
                line_copy = pending[-1][1].line
            elif later and k in self.t.persistent and not any(
                    x.kind is K.HOST_SYNC for x in self.ops[:w]):
                line_copy = later[0][1].line
                factors.append("previous-call")
            else:
                continue
            if k in self.t.persistent:
                factors.append("object-state")
            done.add(k)
            yield self._finding(
                Hazard.PINNED_REWRITE, o.line, (k,), ("host", CURRENT), factors=factors,
                what=f"the host writes pinned {self.t.name(k)} while the non_blocking copy "
                     f"from it (line {line_copy}) may still be reading it")

    def _made_again(self, k: str, j: int, w: int) -> bool:
        """Is ``k`` a fresh tensor again between ops ``j`` and ``w`` (a loop that makes
        a new pinned buffer each time round: the write is to the new one)?"""
        return any(o.kind is K.ALLOC and o.key == k for o in self.ops[j + 1:w])

    def _synced(self, j: int, stream: str, w: int) -> bool:
        path, copied = self.ops[w].guards, self.ops[j].guards
        for x in self.ops[j + 1:w]:
            if not self.t.on_path(x, path) and not self.t.on_path(x, copied):
                continue  # in a branch that neither the read nor the copy is in
            if x.kind is K.HOST_SYNC:
                recs = self.records.get(x.key)
                if x.key in ("", stream) or (x.key in self.t.events and (
                        not recs or any(r > j for r, _ in recs))):
                    return True
            if x.kind is K.HOST_READ and x.flag in BLOCKING_READS and \
                    x.key not in self.t.host:
                return True  # a device read blocks the host on the current stream
        return False

    def unsynced_d2h(self) -> Iterator[Finding]:
        for j, c in enumerate(self.ops):
            if c.kind is not K.NB_COPY or c.flag == "h2d":
                continue
            for r in range(j + 1, len(self.ops)):
                o = self.ops[r]
                if o.kind is K.HOST_READ and o.key == c.key and (
                        c.flag == "d2h" or o.flag not in ("item", "tolist")):
                    if self._synced(j, c.stream, r):
                        break
                    yield self._finding(
                        Hazard.UNSYNCED_D2H, o.line, (c.key,), (c.stream, "host"),
                        factors=["dies-here"] if self.local(c.key) else [],
                        what=f"the host reads {self.t.name(c.key)} ({o.flag}) while the "
                             f"non_blocking copy into it (line {c.line}) may be in flight")
                    break
                if o.kind in (K.ALLOC, K.FREE) and o.key == c.key:
                    break

    def stored_early_events(self) -> Iterator[Finding]:
        """An event kept for others to wait on, recorded before later work on its
        stream in the same function (and not recorded again after it)."""
        for e, recs in sorted(self.records.items()):
            if e in self.t.timing_events or TIMING.search(e.rsplit(".", 1)[-1]):
                continue
            consumed_here = any(o.kind is K.WAIT_EVENT and o.key == e for o in self.ops)
            kept = e.startswith(("self.", "cls.")) or any(
                o.kind is K.KEEP and o.key == e for o in self.ops)
            if consumed_here or not kept:
                continue
            last, stream = recs[-1]
            later = [o for o in self.ops[last + 1:] if o.kind is K.USE and o.write and
                     o.stream == stream and self.tensorish(o.key) and
                     (o.key in self.t.persistent or o.key.startswith("self.") or
                      any(x.kind is K.KEEP and x.key == o.key for x in self.ops))]
            if not later:
                continue
            yield self._finding(
                Hazard.EARLY_EVENT, self.ops[last].line, [o.key for o in later],
                (stream,), factors=["consumed-elsewhere"],
                what=f"{self.t.name(e)} is recorded on {_show(stream)} before later writes "
                     f"to {', '.join(sorted({self.t.name(o.key) for o in later}))} that "
                     "outlive the call")

    def _launch_args(self) -> set[int]:
        """The uses that are a collective's own arguments, read as it is launched."""
        out: set[int] = set()
        for j, o in enumerate(self.ops):
            if o.kind is not K.COLLECTIVE:
                continue
            i = j - 1
            while i >= 0 and self.ops[i].kind is K.USE:
                if self.ops[i].key == o.key:
                    out.add(i)
                i -= 1
        return out

    def collectives(self) -> Iterator[Finding]:
        by_work: dict[str, list[tuple[int, Op]]] = {}
        for j, o in enumerate(self.ops):
            if o.kind is K.COLLECTIVE:
                by_work.setdefault(o.other, []).append((j, o))
        for work, launched in by_work.items():
            start = launched[0][0]
            held = {work} | {o.other for o in self.ops if o.kind is K.KEEP and o.key == work
                             and o.other}  # the containers it was put in
            launch_tests = self.t.tests_of(launched[0][1])
            waits = [j for j, o in enumerate(self.ops) if o.kind is K.WORK_WAIT and
                     o.key in held and j > start and not self.t.excluded(o, launch_tests)]
            boxes = held - {work}  # a local list of handles hands them on only if it is used
            boxed = {o.line for o in self.ops if o.kind is K.KEEP and o.key == work and
                     o.other in self.t.containers}
            handed = any(o.key == work and (
                (o.kind is K.USE and o.line not in boxed) or (o.kind is K.KEEP and (
                    not o.other or o.other not in self.t.containers))) for o in self.ops) or \
                any(o.key in boxes and o.kind in (K.USE, K.KEEP) for o in self.ops)
            end = waits[0] if waits else len(self.ops)
            keys = {o.key for _, o in launched}
            relaunch = self._launch_args()  # a loop's next launch, another branch's: new work
            kept = [j for j, o in enumerate(self.ops) if o.kind is K.KEEP and o.key in keys]
            # handed on with the work (`return Handle(works, tensors)`): the taker waits
            with_work = {o.line for o in self.ops if o.key in held and o.kind in (K.USE, K.KEEP)
                         and o.line not in boxed}
            touched = [o for j, o in enumerate(self.ops[start + 1:end], start + 1)
                       if o.key in keys and not self.t.excluded(o, launch_tests) and (
                           (o.kind is K.FREE and not any(k < j for k in kept)) or (
                               o.kind is K.USE and o.stream != ANY and j not in relaunch
                               and o.line not in with_work))]
            if waits or handed:
                if not touched:
                    continue
                what = (f"{', '.join(sorted({self.t.name(o.key) for o in touched}))} is "
                        "touched before the async collective's work is waited for")
                line = touched[0].line
            else:
                what = "the async collective's work is neither waited for nor handed on"
                line = launched[0][1].line
            yield self._finding(Hazard.ASYNC_COLLECTIVE, line, keys, ("collective",
                                CURRENT), what, ["write"] if any(
                                    o.write for o in touched) else [])


def judge(t: Trace, owned: dict[str, str] | None = None) -> list[Finding]:
    """The findings of one function, one per distinct (class, line, tensors);
    ``owned``: the buffers only their object's stream touches (``fuzz.scan.owned``)."""
    seen: dict[tuple[object, ...], Finding] = {}
    for f in _Judge(t, owned).findings():
        seen.setdefault((f.hazard, f.line, f.tensors, f.streams), f)
    return list(seen.values())


def pending_attributes(t: Trace) -> dict[str, tuple[str, int, str]]:
    """The object's attributes (``self.x``) a method leaves in use on another stream at
    its end: used there with no ``record_stream`` for it, and the method's own stream
    not ordered after that use. Attribute -> (that stream, the use's line, an event of
    the object recorded on that stream after the use, or '')."""
    judge = _Judge(t)
    last: dict[str, dict[str, int]] = {}
    for p, o in enumerate(t.ops):
        if o.kind is K.USE and o.stream not in (t.base, ANY) and judge.tensorish(o.key) \
                and o.flag != COPY_SOURCE and _attribute(t, o.key):
            last.setdefault(o.key, {})[o.stream] = p
    out: dict[str, tuple[str, int, str]] = {}
    for k, streams in sorted(last.items()):
        recorded = {o.stream for o in t.ops if o.kind is K.RECORD and o.key == k}
        for s, p in sorted(streams.items()):
            if s not in recorded and ANY not in recorded and \
                    judge.ordered(s, p, t.base, len(t.ops)) != "yes":
                event = next((e for e, recs in sorted(judge.records.items())
                              if e.startswith("self.") and any(r > p and on == s
                                                               for r, on in recs)), "")
                out[_attribute(t, k)] = (s, t.ops[p].line, event)
                break
    return out


def waits_on(t: Trace, handle: str) -> bool:
    """Does ``t`` wait on ``handle`` (an event, by a stream or the host; work, by
    its ``wait()``)?"""
    return any(o.kind in (K.WAIT_EVENT, K.HOST_SYNC, K.WORK_WAIT) and o.key == handle
               for o in t.ops)


def _attribute(t: Trace, k: str) -> str:
    """The attribute of ``self`` that ``k`` is (made here and stored there), or ''."""
    if k.startswith("self."):
        return k
    name = t.names.get(k, "") if k in t.persistent else ""
    return name if name.startswith("self.") else ""


def unordered_frees(t: Trace, k: str, stream: str, rebound: bool) -> list[int]:
    """The lines where ``t`` drops ``k`` with its own stream not yet ordered after
    ``stream`` (no wait for it, no host sync, since the function began); a drop by
    binding a new value counts only where ``rebound``."""
    judge = _Judge(t)
    return [o.line for p, o in enumerate(t.ops) if o.kind is K.FREE and o.key == k
            and (rebound or o.flag != REBOUND) and judge.ordered(stream, -1, t.base, p) != "yes"]


def _all_paths(guards: list[tuple[int, ...]]) -> bool:
    """Do ops under these branches cover every path: one unguarded, or the two
    branches of one ``if`` (its body is +id, its else -id)."""
    seen = set(guards)
    return any(not g for g in seen) or any(
        g[:-1] + (-g[-1],) in seen for g in seen if g and g[-1] > 0)


def _exclusive(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Are ops under guards ``a`` and ``b`` on different branches of one ``if``?"""
    return any(-g in b for g in a)
