"""The Hypothesis driver: scenarios in, verdicts out, shrunk failures saved.

It runs in a process that never touches a device. Each example goes to the
rank pool; the oracles judge the observations; a failure is raised back into
Hypothesis so that it shrinks, and the smallest failing scenario is saved to
the corpus before anything else happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import Flaky

from fuzz import corpus, profiles, protocols, stages, targets
from fuzz.options import DEFAULT, RunOptions
from fuzz.ranks import Outcome, RankPool
from fuzz.verdict import Failure, Verdict

Scenario = Any
"""Any protocol's scenario type (``fuzz.protocols``)."""

Progress = Callable[[int, float, int], None]
OnExample = Callable[[Scenario], None]
OnVerdict = Callable[[Scenario, Verdict, list[str]], None]

def evaluate(pool: RankPool, target: str, scenario: Scenario,
             options: RunOptions = DEFAULT) -> Verdict:
    """Run one scenario on every rank and judge it with ``options.oracles``.

    Rank-side oracles report ``findings`` in the observations; the value
    oracle runs here. Rank-side findings come first: they name the cause.
    """
    return run_and_judge(pool, target, scenario, options)


def run_and_judge(pool: RankPool, target: str, scenario: Scenario,
                  options: RunOptions) -> Verdict:
    """One run of ``scenario`` with ``options`` passed to the ranks unchanged,
    judged, and run once more when it was clean but a gate timed out.

    A gate that runs out its bound did not force its interleaving (a kernel's
    first launch under lazy module loading waits for the gate); the kernel is
    loaded now. A finding in the first run stands: a timed-out gate still
    gives a real interleaving.
    """
    verdict = _judge(pool.run(target, scenario, options), scenario, options.values)
    if verdict.ok and "gate-timeout" in verdict.held:
        verdict = _judge(pool.run(target, scenario, options), scenario, options.values)
        verdict.held = sorted(set(verdict.held) | {"rerun"})
    return verdict


def _judge(outcome: Outcome, scenario: Scenario, values: bool) -> Verdict:
    if outcome.failure is not None:
        return Verdict([outcome.failure])
    obs = outcome.observations
    held = sorted({h for o in obs for h in o.held})
    found = [f for o in obs for f in o.findings]
    # Earliest step first; within a step, lower rank first.
    found.sort(key=lambda f: (f.step if f.step is not None else -1, f.rank or 0))
    stages.enter(stages.VALUE)
    wrong = protocols.of_scenario(scenario).part("values")(scenario, obs) if values else []
    stages.leave()
    return Verdict(found + wrong, held=held)


class _Found(Exception):
    """Raised into Hypothesis so that it shrinks; carries nothing Hypothesis needs."""


class _Stopped(KeyboardInterrupt):
    """Ends a run at once. Hypothesis lets a KeyboardInterrupt through without
    saving the example to its database or replaying it, unlike other exceptions."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C before anything was found. It carries what ran so far, so that a
    report can say so; a caller that catches KeyboardInterrupt sees no change."""

    def __init__(self, result: CampaignResult) -> None:
        super().__init__()
        self.result = result


def behaviours(scenario: Scenario, verdict: Verdict) -> list[str]:
    """Coarse labels of what an example exercised, reported through ``event()``.

    They are cheap to compute and bounded in number, so counting distinct ones
    over a long run tells whether the strategies keep reaching new ground. The
    protocol labels its scenario; the verdict's label is common to all.
    """
    labels = protocols.of_scenario(scenario).part("behaviours")(scenario)
    return labels + ["verdict " + ("ok" if verdict.ok else verdict.first.kind)]


@dataclass
class CampaignResult:
    target: str
    examples: int = 0
    elapsed_s: float = 0.0
    failure: Failure | None = None
    scenario: Scenario | None = None
    corpus_path: Path | None = None
    flaky: bool = False
    first_failure_examples: int | None = None
    first_failure_s: float | None = None
    first_failure_at: float | None = None
    """When the first failure was seen (``time.time()``): a benchmark that
    started this process measures from the process's start to it."""
    failures: int = 0
    shrink_truncated: bool = False
    held: list[str] = field(default_factory=list)
    stopped: bool = False
    interrupted: bool = False
    """Ctrl-C ended the run; a failure found is saved as shrunk so far."""

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.elapsed_s if self.elapsed_s else 0.0


def found_on(pool: RankPool, options: RunOptions, target: str | None = None) -> dict[str, Any]:
    """Where a failure was found, and by which oracles (those that ran), for
    the corpus entry: ``fuzz replay`` judges it with the same ones. For
    upstream code, which release too (version, sha256 of the file, AST edit)."""
    info = pool.info[0] if pool.info else None
    found = {"torch": info.torch if info else None, "device": pool.device,
             "device_name": info.device_name if info else None,
             "backend": info.backend if info else None,
             "world_size": pool.world_size, "hypothesis": hypothesis.__version__,
             "oracles": options.oracle_names()}
    upstream = targets.provenance(target) if target else None
    if upstream:
        found["upstream"] = upstream
    return found


def fuzz(pool: RankPool, target: str, settings: hypothesis.settings, *, max_examples: int,
         seed: int | None = None, budget_s: float | None = None,
         corpus_dir: Path | None = None,
         strategy: st.SearchStrategy[Scenario] | None = None,
         progress: Progress | None = None, options: RunOptions = DEFAULT,
         stop_on_failure: bool = True, shrink_budget_s: float | None = 120.0,
         on_example: OnExample | None = None, on_verdict: OnVerdict | None = None,
         stop: Callable[[], bool] | None = None) -> CampaignResult:
    """Fuzz one target until ``max_examples``, ``budget_s`` or a shrunk failure.

    ``options`` go to every rank unchanged (see ``fuzz.runner``). With
    ``stop_on_failure`` False failures are counted in ``failures`` and the run
    goes on (the benchmark measures throughput that way). ``shrink_budget_s``
    bounds shrinking: past it no more examples run, the smallest failure so far
    is kept and ``shrink_truncated`` is set (on a GPU every crash costs a new
    CUDA context per shrink step; a smaller case found late is worth less than
    one saved now).

    ``on_example`` runs before each dispatch (a journal can make it durable
    first); ``on_verdict`` gets each verdict with its behaviour labels (a
    campaign can save a failure before shrinking starts). When ``stop``
    returns true the run ends before the next dispatch, even while shrinking:
    the smallest failure so far is still saved.
    """
    result = CampaignResult(target=target)
    protocol = protocols.of_target(target, _factory_or_none(target))
    if strategy is None:
        strategy = protocol.part("strategy")(world_size=pool.world_size)
    start = time.monotonic()
    held: set[str] = set()

    def body(scenario: Scenario) -> None:
        stages.enter(stages.DRIVER)
        try:
            _body(scenario)
        finally:
            stages.leave()

    def _body(scenario: Scenario) -> None:
        elapsed = time.monotonic() - start
        if stop is not None and stop():
            raise _Stopped
        if result.failure is None and budget_s is not None and elapsed > budget_s:
            raise _Stopped
        if (shrink_budget_s is not None and result.first_failure_s is not None
                and elapsed - result.first_failure_s > shrink_budget_s):
            result.shrink_truncated = True
            return
        if on_example is not None:
            on_example(scenario)
        verdict = evaluate(pool, target, scenario, options)
        result.examples += 1
        held.update(verdict.held)
        labels = behaviours(scenario, verdict)
        for label in labels:
            hypothesis.event(label)
        if on_verdict is not None:
            on_verdict(scenario, verdict, labels)
        if progress is not None:
            progress(result.examples, time.monotonic() - start, 0 if verdict.ok else 1)
        if not verdict.ok:
            if result.first_failure_examples is None:
                result.first_failure_examples = result.examples
                result.first_failure_s = time.monotonic() - start
                result.first_failure_at = time.time()
            result.failures += 1
            if not stop_on_failure:
                return
            result.failure, result.scenario = verdict.first, scenario
            raise _Found(verdict.summary())

    # A distinct test identity per target keeps database entries apart. Hypothesis
    # keys its database by the test's source, the same for every target here, plus
    # this digest (what Hypothesis's stateful tests set for the same reason).
    body.__qualname__ = f"streamfuzz[{target}]"
    body._hypothesis_internal_add_digest = target.encode()  # type: ignore[attr-defined]
    body = hypothesis.settings(settings, max_examples=max_examples)(given(strategy)(body))
    if seed is not None:
        body = hypothesis.seed(seed)(body)
    stages.enter(stages.HYPOTHESIS)
    try:
        with profiles.seed_only(), profiles.rare_collections():
            body()
    except _Found:
        pass
    except _Stopped:
        result.stopped = True
    except KeyboardInterrupt:
        # Ctrl-C: a failure found is saved below as far as it was shrunk; with
        # nothing found, Interrupted carries the examples run so far. Either
        # way the interrupt goes on.
        result.interrupted = True
    except Flaky:
        # The last failure seen is the smallest that ever failed; keep it.
        result.flaky = not result.shrink_truncated
    finally:
        stages.leave()
    result.elapsed_s = time.monotonic() - start
    result.held = sorted(held)
    if result.failure is not None and corpus_dir is not None:
        entry = corpus.Entry(target=target, protocol=protocol.name, kind=result.failure.kind,
                             message=result.failure.message, scenario=result.scenario,
                             found_on=found_on(pool, options, target), flaky=result.flaky)
        result.corpus_path = corpus.save(corpus_dir, entry)
    if result.interrupted and result.failure is None:
        raise Interrupted(result)
    return result


def _factory_or_none(target: str) -> Any:
    """A user's factory, for the protocol it declares; built-ins need no import."""
    try:
        return targets.load(target) if ":" in target else None
    except targets.TargetError:
        return None


def replay(pool: RankPool, entry: corpus.Entry, target: str | None = None,
           attempts: int = 1) -> Verdict:
    """Replay a corpus entry with the oracles that found it.

    A race found by the value oracle on a GPU gets ``attempts`` tries to show.
    """
    options = RunOptions.from_dict(entry.found_on)
    verdict = Verdict()
    for _ in range(max(1, attempts)):
        verdict = evaluate(pool, target or entry.target, entry.scenario, options)
        if not verdict.ok:
            break
    return verdict
