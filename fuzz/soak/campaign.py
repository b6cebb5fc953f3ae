"""The campaign: rounds over the targets in turn, each one ``driver.fuzz``
call, with every failure saved, settled and recorded, and a killed driver's
examples in flight replayed first."""

from __future__ import annotations

import ctypes
import gc
import json
import random
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from streamfuzz.fuzz import corpus, driver, profiles, soak_report, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.messages import Memory
from streamfuzz.fuzz.protocol.scenario import ScenarioError
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.soak.config import SoakConfig
from streamfuzz.fuzz.soak.display import Display, gist, hms, kinds_text
from streamfuzz.fuzz.soak.journal import Journal
from streamfuzz.fuzz.soak.sampler import Sampler, read_samples
from streamfuzz.fuzz.soak.state import State
from streamfuzz.fuzz.stop import StopReason, handled
from streamfuzz.fuzz.verdict import Failure, Verdict

Scenario = Any
"""Any protocol's scenario type (``streamfuzz.fuzz.protocol``)."""

_MIB = 2**20
_RELEASE_EVERY_S = 60.0
"""Least time between two heap releases. A release's full collection walks
every object the driver holds (torch's, Hypothesis's), whatever a round
freed: after every round of a CPU soak it took a seventh of the driver."""


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
        self.stop_reason: StopReason | None = None
        self._journal = Journal(self.out / "journal.json")
        self._state = State(self.out / "state.json", pool, cfg.stats_every_s)
        self.state = self._state.data
        self._display = Display(self.stream, self.out / "soak.log")
        self._sampler = Sampler(self.out / "stats.jsonl", pool, self._state, self._display,
                                cfg.stats_every_s, cfg.stats_every_examples)
        self._released = time.monotonic()
        self._pending: Path | None = None
        """The round's failure as first seen (``driver.fuzz`` saved it before shrinking)."""
        self._target = ""

    # -- control -------------------------------------------------------------
    def request_stop(self, reason: StopReason) -> None:
        """Stop before the next example (a signal handler may call this)."""
        self.stop_reason = self.stop_reason or reason

    def elapsed(self) -> float:
        """Campaign seconds, earlier starts included."""
        return self._state.elapsed()

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
        self._state.start_clock()
        rounds = self.cfg.round_len()
        share = (f"; rounds of {hms(rounds)}, the budget's share per target"
                 if rounds < self.cfg.round_s else "")
        self._say(f"soak: {', '.join(self.cfg.targets)} for {hms(self.cfg.budget_s)} "
                  f"on {self.pool.device} x{self.pool.world_size} -> {self.out} "
                  f"(start {self.state['starts']}, {hms(self._state.base_elapsed)} already "
                  f"spent{share})")
        clean = False
        try:
            if self.stop_reason is None:
                self._sampler.sample(self._target, force=True)
                self._recover()
            settings = profiles.get(self.cfg.profile, self.cfg.database)
            seed = self.cfg.seed
            # A resumed campaign with a fixed seed must not repeat its earlier rounds.
            # Without one, rounds are not seeded at all: Hypothesis turns the example
            # database off for a seeded run, and the database is what replays a
            # failure found in an earlier round first.
            rng = random.Random(hash((seed, self.state["starts"]))) if seed is not None \
                else None
            gc.freeze()  # what the start made: the rounds' collections skip it until a release
            while not self._should_stop():
                n = int(self.state["rounds"])
                target = self.cfg.targets[n % len(self.cfg.targets)]
                self._round(target, settings, rng.getrandbits(32) if rng else None)
                self.state["rounds"] = n + 1
                self._state.save(urgent=False)
                if time.monotonic() - self._released >= _RELEASE_EVERY_S:
                    _release_heap()
                    self._released = time.monotonic()
                else:
                    _collect_round()
            clean = True
        finally:
            gc.unfreeze()  # whoever runs next in this process collects as usual
            self._sampler.sample(self._target, force=True)
            self._state.save()
            if clean:  # otherwise the example in flight may be what broke us: keep it
                self._journal.remove()
            report = self._report()
            self._display.status.clear()
            why = self.stop_reason.value if self.stop_reason else "error"
            self._say(f"soak: {soak_report.per_target_text(report)}")
            self._say(f"soak: stopped ({why}) after "
                      f"{hms(self.elapsed())}: {report['examples']} examples, "
                      f"{sum(report['failures_by_kind'].values())} failures; "
                      f"{soak_report.ran_text(report)}; report in {self.out}")
            self._display.close()
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
        per = self._state.per_target(target)
        per["rounds"] += 1
        per["elapsed_s"] = round(per["elapsed_s"] + time.monotonic() - t0, 3)
        if res.failure is not None and res.corpus_path is not None:
            per["failures"] += 1
            self._settle(res)

    def _on_example(self, in_flight: tuple[Scenario, ...]) -> None:
        ranks = self._sampler.sample(self._target)
        if ranks is not None:
            self._maybe_recycle(ranks)
        self._journal.write(self._target, self.state["rounds"], in_flight)

    def _on_verdict(self, scenario: Scenario, verdict: Verdict, labels: list[str]) -> None:
        self.state["examples"] += 1
        # Counted here, not at the round's end: a round a second Ctrl-C cuts short ran them.
        self._state.per_target(self._target)["examples"] += 1
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
            self._state.record(self._target, verdict.first, self._pending, shrunk=False,
                               flaky=False, pending=True)
            self._display.status.clear()
            self._say(f"soak: {self._target}: {verdict.first.kind} found, shrinking "
                      f"(saved first as {self._pending})")
        self._display.status.draw(self._status)

    def _status(self) -> str:
        return (f"[{hms(self.elapsed())}/{hms(self.cfg.budget_s)}] {self._target} | "
                f"{self.state['examples']} examples, {self._sampler.rate():.1f}/s | "
                f"failures: {kinds_text(self._state.kinds())} | "
                f"behaviours: {len(self.state['behaviours'])} | "
                f"restarts: {self._state.restarts()}, recycles: {self._state.recycles()}")

    def _settle(self, res: driver.CampaignResult) -> None:
        """After a round's failure is saved: drop the unshrunk copy; make sure it
        was replayed once. Hypothesis replays the shrunk example itself at the end
        (and says Flaky when it passes); only a round cut short needs our replay."""
        path, failure = res.corpus_path, res.failure
        assert path is not None and failure is not None  # only a saved failure settles
        if self._pending is not None and self._pending != path:
            self._state.forget(self._pending)  # the driver removed it, unless it was there before
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
        self._state.record(res.target, failure, path, shrunk=not res.stopped, flaky=flaky,
                           examples_to_find=res.first_failure_examples)
        how = "FLAKY (passed on replay)" if flaky else "reproduces"
        self._display.status.clear()
        self._say(f"soak: {res.target}: {failure.kind} saved to {path}, {how}: "
                  f"{gist(failure.message)}")

    def _maybe_recycle(self, ranks: list[Memory | None]) -> None:
        """Recycle the world once a rank outgrew its warm size by ``recycle_mib``."""
        cap = self.cfg.recycle_mib
        if not cap or self.pool.external or self.stop_reason is not None:
            return
        grown = self._sampler.grown(ranks, cap)
        if grown is None:
            return
        size, rank = grown
        self._display.status.clear()
        self._say(f"soak: recycling the ranks: rank {rank} grew {size / _MIB:.0f} MiB since "
                  f"its world warmed up (limit {cap:g} MiB, --recycle-mib)")
        self.pool.recycle()
        self._state.save()

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
            self._state.record(target, fail, self._save(target, fail, scenarios[0],
                                                        shrunk=False),
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
                self._state.record(target, verdict.first, path, shrunk=False, flaky=False,
                                   recovered=True)
                self._say(f"soak: recovered {verdict.first.kind} saved to {path}")
                break
            self._say("soak: it passes now")
        self._journal.remove()

    def _save(self, target: str, failure: Failure, scenario: Scenario, *, shrunk: bool) -> Path:
        entry = corpus.Entry(target=target, protocol=protocols.of_scenario(scenario).name,
                             kind=failure.kind, message=failure.message, scenario=scenario,
                             found_on=driver.found_on(self.pool, self.cfg.options, target))
        path = corpus.save(self.cfg.corpus, entry)
        self._state.record(target, failure, path, shrunk=shrunk, flaky=False, pending=True)
        return path

    # -- what the user sees ------------------------------------------------------
    def _say(self, text: str) -> None:
        self._display.say(text)

    def _report(self) -> dict[str, Any]:
        return soak_report.write(self.out, self.state, read_samples(self._sampler.path),
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
    19 MiB an hour. What survives the full collection is then frozen, for
    ``_collect_round``."""
    gc.unfreeze()
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    gc.freeze()


def _collect_round() -> None:
    """Free the cycles a round left (Hypothesis's engine and its examples)
    as the round ends. Left to the collector's own schedule they outlived
    several later rounds, whose objects filled the heap around them (the
    driver's slow rise in docs/soak.md). With what the last ``_release_heap``
    kept frozen, the collection walks only what was made since, not the
    driver's every object."""
    gc.collect()


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
