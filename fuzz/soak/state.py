"""``state.json``: a campaign's running totals, kept across its starts.

Rewritten atomically at a failure not seen before and otherwise at most once
per stats sample, so that a restarted campaign resumes its budget and
counts; bounded however long it runs (``KEPT_OCCURRENCES``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.corpus import write_json_atomic
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.verdict import Failure

STATE_SCHEMA = 1
KEPT_OCCURRENCES = 5
"""Occurrences of one failure (one corpus file) that ``state.json`` keeps in
full, message included; later ones are only counted (``repeats``). A buggy
target found again every round made about 19,000 a world in a week, each
rewritten with the state at every failure and sample."""


class State:
    """The totals (``data``, as ``state.json`` holds them) and the campaign's
    clock, which counts the seconds of earlier starts too."""

    def __init__(self, path: Path, pool: RankPool, save_every_s: float) -> None:
        self.path = path
        self._pool = pool
        self._save_every_s = save_every_s
        self.data = _load(path)
        self.data["starts"] += 1
        self.base_elapsed = float(self.data["elapsed_s"])
        self._base_restarts = int(self.data["restarts"]) - pool.restarts
        self._base_recycles = int(self.data["recycles"]) - pool.recycles
        self._t0 = time.monotonic()
        self._saved = -1e9

    def start_clock(self) -> None:
        """The budget counts from here, not from the ranks' start-up."""
        self._t0 = time.monotonic()

    def elapsed(self) -> float:
        """Campaign seconds, earlier starts included."""
        return self.base_elapsed + time.monotonic() - self._t0

    def restarts(self) -> int:
        return self._base_restarts + self._pool.restarts

    def recycles(self) -> int:
        return self._base_recycles + self._pool.recycles

    def save(self, urgent: bool = True) -> None:
        """Rewrite ``state.json`` now, or, unless ``urgent``, once ``save_every_s``
        has passed since the last write. Written whole and synced at every
        round and failure, it cost each round of a buggy target three synced
        writes of a state that grows to ~100 KB as the kept occurrences fill
        up (docs/soak.md). What waits is counts (rounds, a known failure
        found again), never a failure first seen; a killed driver loses at
        most ``save_every_s`` of them."""
        now = time.monotonic()
        if not urgent and now - self._saved < self._save_every_s:
            return
        self._saved = now
        self.data["elapsed_s"] = round(self.elapsed(), 3)
        self.data["restarts"] = self.restarts()
        self.data["recycles"] = self.recycles()
        write_json_atomic(self.path, self.data)

    def per_target(self, target: str) -> dict[str, Any]:
        return self.data["targets"].setdefault(target, {"examples": 0, "rounds": 0,
                                                        "elapsed_s": 0.0, "failures": 0})

    def record(self, target: str, failure: Failure, path: Path, *, shrunk: bool, flaky: bool,
               recovered: bool = False, pending: bool = False,
               examples_to_find: int | None = None) -> None:
        """One occurrence of the failure saved at ``path``; a pending one (not
        yet shrunk or replayed) is replaced by the next record of that file."""
        fails = self.data["failures"]
        rec = {"t": round(self.elapsed(), 3), "target": target, "kind": failure.kind,
               "message": failure.message, "path": str(path), "shrunk": shrunk,
               "flaky": flaky, "recovered": recovered, "pending": pending,
               "examples_to_find": examples_to_find}
        # A failure not settled before is written at once; the same one found
        # again (every round, for a buggy target) waits for the next due write.
        new = not any(f["path"] == str(path) and not f["pending"] for f in fails) \
            and str(path) not in self.data["repeats"]
        # One record per saved file and round: the pending copy is replaced in place.
        if fails and fails[-1]["path"] == str(path) and fails[-1]["pending"]:
            fails[-1] = rec
        else:
            fails.append(rec)
        if not pending:
            self._fold(fails)
        self.save(urgent=new)

    def _fold(self, fails: list[dict[str, Any]]) -> None:
        """Count the last record instead of keeping it, once its failure has
        ``KEPT_OCCURRENCES`` records before it. Only a settled record is folded:
        a pending one is still to be replaced or forgotten."""
        rec = fails[-1]
        if sum(f["path"] == rec["path"] for f in fails) <= KEPT_OCCURRENCES:
            return
        fails.pop()
        more = self.data["repeats"].setdefault(rec["path"], {
            "target": rec["target"], "kind": rec["kind"], "occurrences": 0,
            "flaky_occurrences": 0})
        more["occurrences"] += 1
        more["flaky_occurrences"] += int(bool(rec["flaky"]))
        more["last_t"] = rec["t"]

    def forget(self, path: Path) -> None:
        """Drop the pending record of ``path`` (its file was removed)."""
        fails = self.data["failures"]
        if fails and fails[-1]["path"] == str(path) and fails[-1]["pending"]:
            fails.pop()

    def kinds(self) -> dict[str, int]:
        """Failures by kind (``"kind (flaky)"`` apart), folded ones included."""
        kinds: dict[str, int] = {}
        for f in self.data["failures"]:
            key = f["kind"] + (" (flaky)" if f["flaky"] else "")
            kinds[key] = kinds.get(key, 0) + 1
        for r in self.data["repeats"].values():
            for key, n in ((r["kind"], r["occurrences"] - r["flaky_occurrences"]),
                           (r["kind"] + " (flaky)", r["flaky_occurrences"])):
                if n:
                    kinds[key] = kinds.get(key, 0) + n
        return kinds


def _load(path: Path) -> dict[str, Any]:
    fresh = {"schema": STATE_SCHEMA, "elapsed_s": 0.0, "examples": 0, "rounds": 0,
             "starts": 0, "restarts": 0, "recycles": 0, "failures": [], "repeats": {},
             "behaviours": {},
             "targets": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return fresh
    if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
        return fresh
    return dict(fresh, **data)
