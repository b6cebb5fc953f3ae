"""Soak campaigns: fuzz for a time budget, survive anything, lose nothing.

A campaign rotates over its targets in rounds; each round is one
``driver.fuzz`` call with a short budget, so one target's
shrinking or one crashed world never starves the others. Everything that must
outlive the driver is written to the campaign directory before it matters:

* ``journal.json``: the examples in flight once the next is dispatched (at
  most two: the driver sends an example before reading the last one's
  verdict), in one write that a killed driver made whole or not at all
  (``_Journal``). A start that finds one replays them, in order, before
  anything else (the driver died mid-example, perhaps because of one) and
  records the first that fails.
* ``state.json``: running totals, rewritten atomically at a failure not seen
  before and otherwise at most once per stats sample, so a restarted campaign
  resumes its budget and counts; bounded however long it runs
  (``KEPT_OCCURRENCES``).
* ``stats.jsonl``: one memory/throughput sample per line (a line cut by a kill
  is skipped on reading); ``soak.log``: the same as text.
* the corpus: each failure is saved on first sight, then replaced by its shrunk
  form, then replayed once; one that does not fail again is kept as flaky.

At the end (budget spent, SIGINT, SIGTERM, or external ranks lost) it writes
``report.json``, ``report.md`` and ``report.png``.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import re
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from streamfuzz.fuzz import corpus, driver, profiles, soak_report, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.corpus import write_json_atomic
from streamfuzz.fuzz.host import rss_bytes
from streamfuzz.fuzz.messages import Memory
from streamfuzz.fuzz.options import DEFAULT, RunOptions
from streamfuzz.fuzz.protocol.scenario import ScenarioError
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.stop import StopReason, handled
from streamfuzz.fuzz.verdict import Failure, Verdict

Scenario = Any
"""Any protocol's scenario type (``streamfuzz.fuzz.protocol``)."""

STATE_SCHEMA = 1
_MIB = 2**20
_RELEASE_EVERY_S = 60.0
"""Least time between two heap releases. A release's full collection walks
every object the driver holds (torch's, Hypothesis's), whatever a round
freed: after every round of a CPU soak it took a seventh of the driver."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
KEPT_OCCURRENCES = 5
"""Occurrences of one failure (one corpus file) that ``state.json`` keeps in
full, message included; later ones are only counted (``repeats``). A buggy
target found again every round made about 19,000 a world in a week, each
rewritten with the state at every failure and sample."""


def parse_budget(text: str) -> float:
    """``30s``, ``10m``, ``8h``, ``1d`` or plain seconds -> seconds (> 0)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m or 8h")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


@dataclass
class SoakConfig:
    """What a campaign runs; ``out`` holds its journal, state, log and report."""

    targets: list[str]
    budget_s: float
    out: Path
    corpus: Path
    database: Path | None = None
    round_s: float = 300.0
    """A round's length at most; ``round_len`` shortens it to the budget's share
    per target, so that a short campaign still runs every target."""
    round_examples: int = 2000
    """Examples per round at most. Hypothesis keeps every example of a run in
    memory (about 50 KB each) until the run ends, and the allocator keeps the
    high-water mark, so the driver's RSS follows the largest round: capping it
    keeps a fast GPU campaign's memory flat."""
    shrink_s: float | None = None
    """Time a round may spend shrinking past its budget (default ``round_s``): a
    hang costs a full timeout per attempt, and must not starve the other targets.
    A failure cut short is saved as shrunk so far, and replayed."""
    stats_every_s: float = 10.0
    stats_every_examples: int | None = None
    """Also sample every this many examples, so that what a short campaign
    decides from its samples (recycling) does not depend on its speed."""
    max_rounds: int | None = None
    """Stop after this many rounds in all (default: only the budget stops)."""
    recycle_mib: float = 32.0
    """Replace healthy ranks once one of them has grown this much since its world
    warmed up (0: never). torch 2.11's NCCL broadcast keeps about 1 KB a call, so
    a CUDA rank grows ~2 MiB per 1,000 examples for as long as it lives; with
    recycling, no rank outgrows its start by more than this, however long the run."""
    seed: int | None = None
    options: RunOptions = DEFAULT
    """What every example runs with, the replay of one left in flight included."""
    profile: str = "default"
    replay_failures: bool = True
    strategy: Any = None
    """Scenarios to draw (default: ``streamfuzz.fuzz.draft.strategies.scenarios`` for the
    pool's world)."""
    extra: dict[str, Any] = field(default_factory=dict)
    claims: Any = None
    """Where this campaign is one of parallel worlds: their ``streamfuzz.fuzz.worlds.Claims``."""

    def round_len(self) -> float:
        """``round_s``, or the budget's share per target where that is shorter: a
        50-second soak of two targets in 5-minute rounds never reached the second,
        and said nothing of the targets after the first but their names."""
        return min(self.round_s, self.budget_s / max(1, len(self.targets)))


class Soak:
    """One campaign over ``pool``; ``run()`` returns the report as a dict."""

    def __init__(self, pool: RankPool, cfg: SoakConfig, stream: TextIO | None = None) -> None:
        self.pool = pool
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        for d in (self.out, Path(cfg.corpus)):  # what a killed run left half-written
            corpus.sweep(d)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.stop_reason: StopReason | None = None
        self._journal = _Journal(self.out / "journal.json")
        self.state_path = self.out / "state.json"
        self.stats_path = self.out / "stats.jsonl"
        self.state = self._load_state()
        self.state["starts"] += 1
        self._base_elapsed = float(self.state["elapsed_s"])
        self._base_restarts = int(self.state["restarts"]) - pool.restarts
        self._base_recycles = int(self.state["recycles"]) - pool.recycles
        self._world_base: tuple[int, list[int | None] | None] = (-1, None)
        self._t0 = time.monotonic()
        self._last_sample = -1e9
        self._state_saved = -1e9
        self._released = time.monotonic()
        self._last_sample_examples = 0
        self._last_draw = 0.0
        self._prev = (self._base_elapsed, int(self.state["examples"]))
        self._pending: Path | None = None
        """The round's failure as first seen (``driver.fuzz`` saved it before shrinking)."""
        self._target = ""
        self._log = open(self.out / "soak.log", "a", buffering=1)

    # -- control -------------------------------------------------------------
    def request_stop(self, reason: StopReason) -> None:
        """Stop before the next example (a signal handler may call this)."""
        self.stop_reason = self.stop_reason or reason

    def elapsed(self) -> float:
        """Campaign seconds, earlier starts included."""
        return self._base_elapsed + time.monotonic() - self._t0

    def _remaining(self) -> float:
        return self.cfg.budget_s - self.elapsed()

    def _should_stop(self) -> bool:
        if self.stop_reason is None and self.pool.lost is not None:
            self.stop_reason = StopReason.RANKS_LOST
        if self.stop_reason is None and self._remaining() <= 0:
            self.stop_reason = StopReason.BUDGET
        if (self.stop_reason is None and self.cfg.max_rounds is not None
                and self.state["rounds"] >= self.cfg.max_rounds):
            self.stop_reason = StopReason.ROUNDS_DONE
        return self.stop_reason is not None

    # -- the campaign ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run until the budget is spent or a stop is asked; returns the report."""
        self._t0 = time.monotonic()  # the budget counts from here, not from rank start-up
        rounds = self.cfg.round_len()
        share = (f"; rounds of {_hms(rounds)}, the budget's share per target"
                 if rounds < self.cfg.round_s else "")
        self._say(f"soak: {', '.join(self.cfg.targets)} for {_hms(self.cfg.budget_s)} "
                  f"on {self.pool.device} x{self.pool.world_size} -> {self.out} "
                  f"(start {self.state['starts']}, {_hms(self._base_elapsed)} already spent"
                  f"{share})")
        clean = False
        try:
            if self.stop_reason is None:
                self._sample(force=True)
                self._recover()
            settings = profiles.get(self.cfg.profile, self.cfg.database)
            seed = self.cfg.seed
            # A resumed campaign with a fixed seed must not repeat its earlier rounds.
            # Without one, rounds are not seeded at all: Hypothesis turns the example
            # database off for a seeded run, and the database is what replays a
            # failure found in an earlier round first.
            rng = random.Random(hash((seed, self.state["starts"]))) if seed is not None \
                else None
            while not self._should_stop():
                n = int(self.state["rounds"])
                target = self.cfg.targets[n % len(self.cfg.targets)]
                self._round(target, settings, rng.getrandbits(32) if rng else None)
                self.state["rounds"] = n + 1
                self._save_state(urgent=False)
                if time.monotonic() - self._released >= _RELEASE_EVERY_S:
                    _release_heap()
                    self._released = time.monotonic()
            clean = True
        finally:
            self._sample(force=True)
            self._save_state()
            if clean:  # otherwise the example in flight may be what broke us: keep it
                self._journal.remove()
            report = self._report()
            self._clear_line()
            why = self.stop_reason.value if self.stop_reason else "error"
            self._say(f"soak: {soak_report.per_target_text(report)}")
            self._say(f"soak: stopped ({why}) after "
                      f"{_hms(self.elapsed())}: {report['examples']} examples, "
                      f"{sum(report['failures_by_kind'].values())} failures; "
                      f"{soak_report.ran_text(report)}; report in {self.out}")
            self._log.close()
        return report

    def _round(self, target: str, settings: Any, seed: int | None) -> None:
        self._target = target
        self._pending = None
        t0 = time.monotonic()
        rounds = self.cfg.round_len()
        budget = min(rounds, max(1.0, self._remaining()))
        cutoff = t0 + budget + (self.cfg.shrink_s if self.cfg.shrink_s is not None else rounds)

        def stop() -> bool:
            return self._should_stop() or time.monotonic() > cutoff

        claims, held = self.cfg.claims, []

        def claim() -> bool:  # another world shrinking this target's failure: wait for it
            if claims is not None:
                claims.hold(target, give_up=self._should_stop)
                held.append(target)
            return True

        try:
            res = driver.fuzz(self.pool, target, settings,
                              max_examples=self.cfg.round_examples, seed=seed, budget_s=budget,
                              options=self.cfg.options, corpus_dir=self.cfg.corpus,
                              strategy=self.cfg.strategy, on_example=self._on_example,
                              on_verdict=self._on_verdict, stop=stop, claim=claim)
            self._account(target, res, t0)
        finally:
            if claims is not None and held:
                claims.release(target)

    def _account(self, target: str, res: driver.CampaignResult, t0: float) -> None:
        per = self._per_target(target)
        per["rounds"] += 1
        per["elapsed_s"] = round(per["elapsed_s"] + time.monotonic() - t0, 3)
        if res.failure is not None and res.corpus_path is not None:
            per["failures"] += 1
            self._settle(res)

    def _on_example(self, in_flight: tuple[Scenario, ...]) -> None:
        ranks = self._sample()
        if ranks is not None:
            self._maybe_recycle(ranks)
        self._journal.write(self._target, self.state["rounds"], in_flight)

    def _per_target(self, target: str) -> dict[str, Any]:
        return self.state["targets"].setdefault(target, {"examples": 0, "rounds": 0,
                                                         "elapsed_s": 0.0, "failures": 0})

    def _on_verdict(self, scenario: Scenario, verdict: Verdict, labels: list[str]) -> None:
        self.state["examples"] += 1
        # Counted here, not at the round's end: a round a second Ctrl-C cuts short ran them.
        self._per_target(self._target)["examples"] += 1
        seen = self.state["behaviours"]
        for label in labels:
            seen[label] = seen.get(label, 0) + 1
        held = self.state.setdefault("held", {})
        for how in verdict.held:
            held[how] = held.get(how, 0) + 1
        if not verdict.ok and self._pending is None:
            # On disk already (the driver saves a first failure before anyone
            # hears of it): recorded before shrinking starts.
            self._pending = corpus.path_of(self.cfg.corpus, self._target, verdict.first.kind,
                                           scenario)
            self._record(self._target, verdict.first, self._pending, shrunk=False,
                         flaky=False, pending=True)
            self._clear_line()
            self._say(f"soak: {self._target}: {verdict.first.kind} found, shrinking "
                      f"(saved first as {self._pending})")
        self._draw()

    def _settle(self, res: driver.CampaignResult) -> None:
        """After a round's failure is saved: drop the unshrunk copy; make sure it
        was replayed once. Hypothesis replays the shrunk example itself at the end
        (and says Flaky when it passes); only a round cut short needs our replay."""
        path, failure = res.corpus_path, res.failure
        assert path is not None and failure is not None  # only a saved failure settles
        if self._pending is not None and self._pending != path:
            self._forget(self._pending)  # the driver removed the file, unless it was there before
        self._pending = None
        entry = corpus.load(path)
        flaky = res.flaky
        if not flaky and res.stopped and self.cfg.replay_failures \
                and self.stop_reason is None:  # not when the campaign itself is ending
            flaky = driver.replay(self.pool, entry).ok
        if flaky and not entry.flaky:
            entry = corpus.Entry(target=entry.target, protocol=entry.protocol, kind=entry.kind,
                                 message=entry.message,
                                 scenario=entry.scenario, found_on=entry.found_on, flaky=True)
            corpus.save(self.cfg.corpus, entry)
        self._record(res.target, failure, path, shrunk=not res.stopped, flaky=flaky,
                     examples_to_find=res.first_failure_examples)
        how = "FLAKY (passed on replay)" if flaky else "reproduces"
        self._clear_line()
        self._say(f"soak: {res.target}: {failure.kind} saved to {path}, {how}: "
                  f"{_gist(failure.message)}")

    def _maybe_recycle(self, ranks: list[Memory | None]) -> None:
        """Recycle the world once a rank outgrew its warm size by ``recycle_mib``.
        A world's first sample may precede its warm-up, so its second is the base."""
        cap = self.cfg.recycle_mib
        if not cap or self.pool.external or self.stop_reason is not None:
            return
        rss = [m.rss if m else None for m in ranks]
        gen, base = self._world_base
        if gen != self.pool.generation:
            self._world_base = (self.pool.generation, None)
            return
        if base is None:
            self._world_base = (gen, rss)
            return
        growth = [(r - b, rank) for rank, (r, b) in enumerate(zip(rss, base))
                  if r is not None and b is not None]
        if not growth or max(growth)[0] <= cap * _MIB:
            return
        grown, rank = max(growth)
        self._clear_line()
        self._say(f"soak: recycling the ranks: rank {rank} grew {grown / _MIB:.0f} MiB since "
                  f"its world warmed up (limit {cap:g} MiB, --recycle-mib)")
        self.pool.recycle()
        self._save_state()

    # -- recovery --------------------------------------------------------------
    def _recover(self) -> None:
        """Replay the examples a killed driver left in the journal, in order,
        until one fails: one sent behind a failure is dropped, as a run drops it."""
        try:
            data = json.loads(self._journal.path.read_text())
            target = str(data["target"])
            # "scenario": one example, as journals written before two could be in flight.
            raw = data["scenarios"] if "scenarios" in data else [data["scenario"]]
            part = targets.protocol_of(target).part("scenario")
            scenarios = [part.from_dict(d) for d in raw]
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, ScenarioError) as exc:
            self._say(f"soak: unreadable journal ignored ({exc})")
            self._journal.remove()
            return
        self._target = target
        if not scenarios:
            self._journal.remove()
            return
        if int(data.get("replays", 0)) >= 1:
            # The first was being replayed when the driver died again: record, do not retry.
            fail = Failure("crash", "the driver died twice while running this example")
            self._record(target, fail, self._save(target, fail, scenarios[0], shrunk=False),
                         shrunk=False, flaky=False, recovered=True)
            self._journal.remove()
            return
        for i, scenario in enumerate(scenarios):
            self._journal.write(target, data.get("round"), scenarios[i:], replays=1)
            of = f"; {i + 1} of {len(scenarios)}" if len(scenarios) > 1 else ""
            self._say(f"soak: replaying the example in flight when the last run ended "
                      f"({target}{of})")
            verdict = driver.evaluate(self.pool, target, scenario, self.cfg.options)
            if not verdict.ok:
                path = self._save(target, verdict.first, scenario, shrunk=False)
                self._record(target, verdict.first, path, shrunk=False, flaky=False,
                             recovered=True)
                self._say(f"soak: recovered {verdict.first.kind} saved to {path}")
                break
            self._say("soak: it passes now")
        self._journal.remove()

    # -- failures --------------------------------------------------------------
    def _save(self, target: str, failure: Failure, scenario: Scenario, *, shrunk: bool) -> Path:
        entry = corpus.Entry(target=target, protocol=protocols.of_scenario(scenario).name,
                             kind=failure.kind, message=failure.message, scenario=scenario,
                             found_on=driver.found_on(self.pool, self.cfg.options, target))
        path = corpus.save(self.cfg.corpus, entry)
        self._record(target, failure, path, shrunk=shrunk, flaky=False, pending=True)
        return path

    def _record(self, target: str, failure: Failure, path: Path, *, shrunk: bool, flaky: bool,
                recovered: bool = False, pending: bool = False,
                examples_to_find: int | None = None) -> None:
        fails = self.state["failures"]
        rec = {"t": round(self.elapsed(), 3), "target": target, "kind": failure.kind,
               "message": failure.message, "path": str(path), "shrunk": shrunk,
               "flaky": flaky, "recovered": recovered, "pending": pending,
               "examples_to_find": examples_to_find}
        # A failure not settled before is written at once; the same one found
        # again (every round, for a buggy target) waits for the next due write.
        new = not any(f["path"] == str(path) and not f["pending"] for f in fails) \
            and str(path) not in self.state["repeats"]
        # One record per saved file and round: the pending copy is replaced in place.
        if fails and fails[-1]["path"] == str(path) and fails[-1]["pending"]:
            fails[-1] = rec
        else:
            fails.append(rec)
        if not pending:
            self._fold(fails)
        self._save_state(urgent=new)

    def _fold(self, fails: list[dict[str, Any]]) -> None:
        """Count the last record instead of keeping it, once its failure has
        ``KEPT_OCCURRENCES`` records before it. Only a settled record is folded:
        a pending one is still to be replaced or forgotten."""
        rec = fails[-1]
        if sum(f["path"] == rec["path"] for f in fails) <= KEPT_OCCURRENCES:
            return
        fails.pop()
        more = self.state["repeats"].setdefault(rec["path"], {
            "target": rec["target"], "kind": rec["kind"], "occurrences": 0,
            "flaky_occurrences": 0})
        more["occurrences"] += 1
        more["flaky_occurrences"] += int(bool(rec["flaky"]))
        more["last_t"] = rec["t"]

    def _forget(self, path: Path) -> None:
        fails = self.state["failures"]
        if fails and fails[-1]["path"] == str(path) and fails[-1]["pending"]:
            fails.pop()

    # -- state, stats, display ---------------------------------------------------
    def _load_state(self) -> dict[str, Any]:
        fresh = {"schema": STATE_SCHEMA, "elapsed_s": 0.0, "examples": 0, "rounds": 0,
                 "starts": 0, "restarts": 0, "recycles": 0, "failures": [], "repeats": {},
                 "behaviours": {},
                 "targets": {}}
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return fresh
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            return fresh
        return dict(fresh, **data)

    def _save_state(self, urgent: bool = True) -> None:
        """Rewrite ``state.json`` now, or, unless ``urgent``, once ``stats_every_s``
        has passed since the last write. Written whole and synced at every
        round and failure, it cost each round of a buggy target three synced
        writes of a state that grows to ~100 KB as the kept occurrences fill
        up (docs/soak.md). What waits is counts (rounds, a known failure
        found again), never a failure first seen; a killed driver loses at
        most ``stats_every_s`` of them."""
        now = time.monotonic()
        if not urgent and now - self._state_saved < self.cfg.stats_every_s:
            return
        self._state_saved = now
        self.state["elapsed_s"] = round(self.elapsed(), 3)
        self.state["restarts"] = self._restarts()
        self.state["recycles"] = self._recycles()
        write_json_atomic(self.state_path, self.state)

    def _restarts(self) -> int:
        return self._base_restarts + self.pool.restarts

    def _recycles(self) -> int:
        return self._base_recycles + self.pool.recycles

    def _sample(self, force: bool = False) -> list[Memory | None] | None:
        """Sample memory and throughput when due; the ranks' stats, or None."""
        now = time.monotonic()
        every_n = self.cfg.stats_every_examples
        due = (now - self._last_sample >= self.cfg.stats_every_s
               or (every_n is not None
                   and self.state["examples"] - self._last_sample_examples >= every_n))
        if not force and not due:
            return None
        self._last_sample = now
        self._last_sample_examples = int(self.state["examples"])
        t, ex = self.elapsed(), int(self.state["examples"])
        dt = t - self._prev[0]
        rate = (ex - self._prev[1]) / dt if dt > 0 else 0.0
        self._prev = (t, ex)
        ranks = self.pool.stats() if self.pool.lost is None else []
        kinds = self._kinds()
        sample = {"t": round(t, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "target": self._target, "examples": ex, "rate": round(rate, 3),
                  "failures": kinds,
                  "restarts": self._restarts(),
                  "recycles": self._recycles(),
                  # Samples of one world (one set of processes) share this id.
                  "world": f"{self.state['starts']}.{self.pool.generation}",
                  "behaviours": len(self.state["behaviours"]), "driver_rss": rss_bytes(),
                  "ranks": [m.to_dict() if m else None for m in ranks]}
        with open(self.stats_path, "a") as fh:
            fh.write(json.dumps(sample, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        rss = " ".join(f"{m.rss / 2**20:.0f}" if m else "?" for m in ranks)
        self._log.write(f"{sample['time']} t={_hms(t)} examples={ex} rate={rate:.1f}/s "
                        f"failures={_kinds_text(kinds)} behaviours={sample['behaviours']} "
                        f"restarts={sample['restarts']} recycles={sample['recycles']} "
                        f"driver_rss={rss_bytes() / 2**20:.0f}MiB "
                        f"rank_rss_mib=[{rss}]\n")
        self.state["elapsed_s"] = round(t, 3)
        self._save_state()
        return ranks

    def _kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for f in self.state["failures"]:
            key = f["kind"] + (" (flaky)" if f["flaky"] else "")
            kinds[key] = kinds.get(key, 0) + 1
        for r in self.state["repeats"].values():
            for key, n in ((r["kind"], r["occurrences"] - r["flaky_occurrences"]),
                           (r["kind"] + " (flaky)", r["flaky_occurrences"])):
                if n:
                    kinds[key] = kinds.get(key, 0) + n
        return kinds

    def _draw(self) -> None:
        now = time.monotonic()
        if not self.tty or now - self._last_draw < 0.25:
            return
        self._last_draw = now
        t, ex = self.elapsed(), self.state["examples"]
        line = (f"[{_hms(t)}/{_hms(self.cfg.budget_s)}] {self._target} | {ex} examples, "
                f"{self._prev_rate():.1f}/s | failures: {_kinds_text(self._kinds())} | "
                f"behaviours: {len(self.state['behaviours'])} | "
                f"restarts: {self._restarts()}, "
                f"recycles: {self._recycles()}")
        self.stream.write("\r\033[K" + line[:200])
        self.stream.flush()

    def _prev_rate(self) -> float:
        dt = self.elapsed() - self._prev[0]
        recent = (self.state["examples"] - self._prev[1]) / dt if dt > 1 else None
        return recent if recent is not None else self.state["examples"] / max(self.elapsed(), 1e-9)

    def _clear_line(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        if not self._log.closed:
            self._log.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + text + "\n")

    def _report(self) -> dict[str, Any]:
        return soak_report.write(self.out, self.state, read_samples(self.stats_path),
                                 config=self._config(), stop_reason=self.stop_reason)

    def _config(self) -> dict[str, Any]:
        info = self.pool.info[0] if self.pool.info else None
        return {"targets": self.cfg.targets, "budget_s": self.cfg.budget_s,
                "round_s": self.cfg.round_len(), "corpus": str(self.cfg.corpus),
                **self.cfg.options.to_dict(),
                "database": str(self.cfg.database) if self.cfg.database else None,
                "device": self.pool.device, "world_size": self.pool.world_size,
                "external_ranks": self.pool.external, "timeout_s": self.pool.timeout,
                "torch": info.torch if info else None,
                "device_name": info.device_name if info else None,
                "gates": info.gates if info else None,
                "recycle_mib": None if self.pool.external else self.cfg.recycle_mib or None,
                "nodes": sorted({i.node for i in self.pool.info}), **self.cfg.extra}


def _release_heap() -> None:
    """Hand the heap a round freed back to the OS. A round's examples are all
    freed when it ends, with Python's own memory flat from round to round
    (traced), yet glibc keeps the pages: a 25-minute CPU soak's driver crept
    19 MiB an hour."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Every complete line of ``stats.jsonl``; a line cut short by a kill is skipped."""
    out: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@contextmanager
def stop_on_signals(soak: Soak) -> Iterator[None]:
    """SIGINT and SIGTERM ask the campaign to stop after the example in flight
    (and to write its report); a second SIGINT interrupts at once."""
    seen: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if seen and signum == signal.SIGINT:
            raise KeyboardInterrupt
        seen.append(signum)
        soak.request_stop(StopReason(signal.Signals(signum).name))

    with handled(handler):
        yield


def _hms(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _gist(message: str, width: int = 160) -> str:
    """A finding's first line, cut at a word: the frames below it are in the
    corpus entry and the report, and a cut mid-frame read as garbage."""
    first = message.split("\n", 1)[0]
    if len(first) <= width:
        return first
    return first[:width].rsplit(" ", 1)[0] + " ..."


def _kinds_text(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "0"


class _Journal:
    """``journal.json``, rewritten at every example the driver dispatches.

    One ``pwrite`` at offset 0 of a file kept open, padded with spaces to the
    file's length: a killed driver has written all of it or none, and what a
    killed process wrote is in the page cache still. Written by the rule of
    reports and corpus entries (a fresh temporary file, fsync, rename, fsync
    of the folder), or even by a plain rename, it took a quarter of a soak
    driver's time: ext4 flushes a file that replaces another. A journal cut
    by the machine's own crash reads as unreadable and is ignored. Each
    example is in flight for two writes; its dict is made once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._made: list[tuple[Any, dict[str, Any]]] = []

    def write(self, target: str, round_: Any, scenarios: Sequence[Any],
              replays: int = 0) -> None:
        made = [(s, next((d for k, d in self._made if k is s), None) or s.to_dict())
                for s in scenarios]
        self._made = made
        data = json.dumps({"target": target, "round": round_,
                           "scenarios": [d for _, d in made], "replays": replays},
                          separators=(",", ":")).encode()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            self._size = os.fstat(self._fd).st_size
        os.pwrite(self._fd, data.ljust(self._size), 0)
        self._size = max(self._size, len(data))

    def remove(self) -> None:
        """No example in flight: the next start has nothing to replay."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._made = None, []
        _unlink(self.path)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

