"""The Hypothesis driver: scenarios in, verdicts out, shrunk failures saved.

It runs in a process that never touches a device. Each example goes to the
rank pool; the oracles judge the observations; a failure is raised back into
Hypothesis so that it shrinks, and the smallest failing scenario is saved to
the corpus before anything else happens.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import time
import unittest
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import hypothesis
from hypothesis import Phase, given
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.internal.reflection import function_digest

from streamfuzz.fuzz import corpus, profiles, stages, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz import stop as stop_signals
from streamfuzz.fuzz.campaign import CampaignResult
from streamfuzz.fuzz.coverage import Coverage
from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.messages import Target
from streamfuzz.fuzz.options import DEFAULT, RunOptions
from streamfuzz.fuzz.ranks import Outcome, RankPool, Ticket
from streamfuzz.fuzz.stop import StopReason
from streamfuzz.fuzz.verdict import Failure, Verdict

Scenario = Any
"""Any protocol's scenario type (``streamfuzz.fuzz.protocol``)."""

Progress = Callable[[int, float, int], None]
OnExample = Callable[[tuple[Scenario, ...]], None]
"""Called before each dispatch with the examples then in flight, oldest first:
the one about to be sent last, and (drawing ahead) the one sent before it whose
verdict is not read yet."""
OnVerdict = Callable[[Scenario, Verdict, list[str]], None]

def evaluate(pool: RankPool, target: str | Target, scenario: Scenario,
             options: RunOptions = DEFAULT) -> Verdict:
    """Run one scenario on every rank and judge it with ``options.oracles``.

    Rank-side oracles report ``findings`` in the observations; the value
    oracle runs here. Rank-side findings come first: they name the cause.
    """
    return run_and_judge(pool, target, scenario, options)


def run_and_judge(pool: RankPool, target: str | Target, scenario: Scenario,
                  options: RunOptions) -> Verdict:
    """One run of ``scenario`` with ``options`` passed to the ranks unchanged,
    judged, and run once more when it was clean but a gate timed out. A name
    is resolved first (``streamfuzz.fuzz.targets.resolve_target``)."""
    return _settle(pool, pool.submit(targets.resolve_target(target), scenario, options))


def _settle(pool: RankPool, ticket: Ticket) -> Verdict:
    """A submitted example's verdict.

    A gate that runs out its bound did not force its interleaving (a kernel's
    first launch under lazy module loading waits for the gate); the kernel is
    loaded now, so a clean example whose gate timed out runs once more. A
    finding in the first run stands: a timed-out gate still gives a real
    interleaving.
    """
    outcome = pool.collect(ticket)
    assert outcome is not None
    if outcome.usage is not None:
        raise targets.TargetError(outcome.usage)
    if outcome.setup:
        _check_setup(pool, ticket, outcome)
    scenario, options = ticket.scenario, ticket.options
    verdict = _judge(outcome, scenario, options.values)
    if verdict.ok and "gate-timeout" in verdict.held:
        verdict = _judge(pool.run(ticket.target, scenario, options), scenario, options.values)
        verdict.held = sorted(set(verdict.held) | {"rerun"})
    return verdict


_FACTORY_RUNS: weakref.WeakKeyDictionary[RankPool, set[str]] = weakref.WeakKeyDictionary()
"""Per pool, the targets whose factory ran on the smallest scenario."""


def _check_setup(pool: RankPool, ticket: Ticket, outcome: Outcome) -> None:
    """A factory that raised: set up wrong (TargetError, nothing saved) where it
    raises on the protocol's smallest scenario too, else the scenario made it
    raise, and the crash is a finding. Asked once per target and pool."""
    ran = _FACTORY_RUNS.setdefault(pool, set())
    if ticket.target.name in ran:
        return
    smallest = protocols.of_scenario(ticket.scenario).part("smallest")(pool.world_size)
    again = outcome if ticket.scenario == smallest else \
        pool.run(ticket.target, smallest, ticket.options)
    if not again.setup:
        ran.add(ticket.target.name)
        return
    assert again.failure is not None
    error, *frames = again.failure.message.splitlines()
    where = f" (at {frames[0].strip()})" if frames else ""
    raise targets.TargetError(f"target {ticket.target.name!r}: its factory raises on the smallest "
                              f"scenario, so no example can run: {error}{where}")


def _judge(outcome: Outcome, scenario: Scenario, values: bool) -> Verdict:
    if outcome.failure is not None:
        return Verdict([outcome.failure], calls=outcome.calls)
    obs = outcome.observations
    held = sorted({h for o in obs for h in o.held})
    found = [f for o in obs for f in o.findings]
    # Earliest step first; within a step, lower rank first.
    found.sort(key=lambda f: (f.step if f.step is not None else -1, f.rank or 0))
    stages.enter(stages.VALUE)
    wrong = protocols.of_scenario(scenario).part("values")(scenario, obs) if values else []
    stages.leave()
    return Verdict(found + wrong, held=held, calls=outcome.calls)


class _Found(FuzzError):
    """Raised into Hypothesis so that it shrinks; carries nothing Hypothesis needs."""


class _Misused(KeyboardInterrupt):
    """Carries a target set up wrong (``targets.TargetError``) out of Hypothesis,
    which would take any other exception for a failure to shrink."""


class _Stopped(KeyboardInterrupt):
    """Ends a run at once. Hypothesis lets a KeyboardInterrupt through without
    saving the example to its database or replaying it, unlike other exceptions."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


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


def found_on(pool: RankPool, options: RunOptions, target: str | None = None) -> dict[str, Any]:
    """Where a failure was found, with every run option (the oracles those
    that ran there, and ``hold``), for the corpus entry: ``fuzz replay`` judges
    it with the same ones. For upstream code, which release too (version,
    sha256 of the file, AST edit)."""
    info = pool.info[0] if pool.info else None
    found = {"torch": info.torch if info else None, "device": pool.device,
             "device_name": info.device_name if info else None,
             "backend": info.backend if info else None,
             "world_size": pool.world_size, "hypothesis": hypothesis.__version__,
             **options.to_dict(), "oracles": options.running_on(pool.device)}
    upstream = targets.provenance(target) if target else None
    if upstream:
        found["upstream"] = upstream
    return found


def fuzz(pool: RankPool, target: str | Target, settings: hypothesis.settings, *, max_examples: int,
         seed: int | None = None, budget_s: float | None = None,
         corpus_dir: Path | None = None,
         strategy: st.SearchStrategy[Scenario] | None = None,
         progress: Progress | None = None, options: RunOptions = DEFAULT,
         stop_on_failure: bool = True, shrink_budget_s: float | None = 120.0,
         on_example: OnExample | None = None, on_verdict: OnVerdict | None = None,
         stop: Callable[[], bool] | None = None, pipeline: bool = True,
         claim: Callable[[], bool] | None = None) -> CampaignResult:
    """Fuzz one target until ``max_examples``, ``budget_s`` or a shrunk failure.

    ``options`` go to every rank unchanged (see ``streamfuzz.fuzz.draft.runner``). With
    ``stop_on_failure`` False failures are counted in ``failures`` and the run
    goes on (the benchmark measures throughput that way). ``shrink_budget_s``
    bounds shrinking: past it no more examples run, the smallest failure so far
    is kept and ``shrink_truncated`` is set (on a GPU every crash costs a new
    CUDA context per shrink step; a smaller case found late is worth less than
    one saved now).

    ``on_example`` runs before each dispatch with the examples then in
    flight (a journal can make them durable first); ``on_verdict`` gets each
    verdict with its behaviour labels (a campaign can save a failure before
    shrinking starts). When ``stop`` returns true the run ends before the next
    dispatch, even while shrinking: the smallest failure so far is still saved.

    With ``pipeline`` (the default) Hypothesis draws the next scenario while
    the ranks run the last one: see ``_Campaign``. The examples judged, the
    first failure and the shrunk case are those of a run without it.

    ``claim`` is asked once, at the first failure, whether this run owns it:
    parallel worlds fuzzing one target find its easy bugs all at once, and
    one of them shrinks and saves it. A run that does not own its failure
    stops at once and saves nothing (``duplicate``).
    """
    resolved = targets.resolve_target(target)
    target = resolved.name
    protocol = protocols.get(resolved.protocol)
    result = CampaignResult(target=target,
                            coverage=Coverage(protocol, pool.world_size, pool.device))
    if strategy is None:
        strategy = protocol.part("strategy")(world_size=pool.world_size)
    own_seed = pipeline and seed is None
    if own_seed:
        seed = random.SystemRandom().getrandbits(64)  # the replay must draw the same examples

    def entry(failure: Failure, scenario: Scenario, flaky: bool = False) -> corpus.Entry:
        return corpus.Entry(target=target, protocol=protocol.name, kind=failure.kind,
                            message=failure.message, scenario=scenario,
                            found_on=found_on(pool, options, target), flaky=flaky)

    # The first failure is on disk before shrinking starts, so a kill loses nothing.
    first = corpus.FirstSight(corpus_dir) if corpus_dir is not None and stop_on_failure \
        else None
    owned: list[bool] = []

    def sight(scenario: Scenario, failure: Failure) -> None:
        if claim is not None and not owned:
            owned.append(claim())
        if first is not None and (not owned or owned[0]):
            first.save(entry(failure, scenario))

    def stopping() -> bool:
        return bool(owned and not owned[0]) or (stop is not None and stop())

    campaign = _Campaign(pool, resolved, result, options, budget_s=budget_s,
                         stop_on_failure=stop_on_failure, shrink_budget_s=shrink_budget_s,
                         progress=progress, on_example=on_example, on_verdict=on_verdict,
                         stop=stopping if claim is not None else stop, own_seed=own_seed,
                         first_sight=sight if first is not None or claim is not None
                         else None)
    _run_phases(campaign, strategy, settings, max_examples, seed, pipeline=pipeline)
    if result.failure is not None and result.reason is not None \
            and result.reason is not StopReason.CLAIMED:
        _shrink_again_later(campaign.db_key, settings)
    result.elapsed_s = time.monotonic() - campaign.start
    result.held = sorted(campaign.held)
    if owned and not owned[0]:
        result.reason = StopReason.CLAIMED
    return _settled(result, corpus_dir, first, entry)


def _shrink_again_later(key: bytes | None, settings: hypothesis.settings) -> None:
    """A failure whose shrinking was cut short goes from the database's primary
    entries to its secondary ones. Hypothesis takes a primary entry that still
    fails for one shrunk to the end and does not shrink it again: a soak's
    later rounds found the half-shrunk failure at their first example and
    saved it unchanged, every round. Replayed from the secondary entries it
    fails just as first, and its shrinking goes on from there."""
    db = settings.database
    if db is None or key is None:
        return
    for value in list(db.fetch(key)):
        db.move(key, key + b".secondary", value)


def _settled(result: CampaignResult, corpus_dir: Path | None, first: corpus.FirstSight | None,
             entry: Callable[[Failure, Scenario, bool], corpus.Entry]) -> CampaignResult:
    """The run's end: its reason, its failure saved (the first sight replaced)."""
    result.end(StopReason.SHRUNK if result.failure is not None else StopReason.MAX_EXAMPLES)
    if result.failure is not None and corpus_dir is not None and not result.duplicate:
        result.corpus_path = corpus.save(corpus_dir, entry(result.failure, result.scenario,
                                                           result.flaky))
    if first is not None:
        first.settle(result.corpus_path)  # the shrunk entry replaces the first sight
    if result.interrupted and result.failure is None:
        raise Interrupted(result)
    return result



def _run_phases(campaign: _Campaign, strategy: st.SearchStrategy[Scenario],
                settings: hypothesis.settings, max_examples: int, seed: int | None, *,
                pipeline: bool) -> None:
    """Hypothesis's phases, in sync, or ahead (then replayed up to a late failure)."""
    own_seed = campaign.own_seed
    phases = tuple(settings.phases)
    ahead_phases = tuple(p for p in phases if p not in _SAVED_PHASES)
    if not pipeline or not ahead_phases:
        campaign.run(strategy, settings, max_examples, seed, phases, "sync")
    else:
        if own_seed and settings.database is not None and any(p in phases
                                                              for p in _SAVED_PHASES):
            # Past failures replay one at a time: Hypothesis deletes an entry
            # that passes, so it must never be told "passed" before it did.
            campaign.run(strategy, settings, max_examples, seed,
                         tuple(p for p in phases if p in _SAVED_PHASES + (Phase.shrink,)),
                         "sync")
        # The past failures replayed count against max_examples, as in one run:
        # "--max-examples 5" ran 5 of them and 5 more, and said "clean over 10".
        left = max_examples - campaign.result.examples
        if campaign.goes_on() and left > 0:
            campaign.run(strategy, settings, left, seed, ahead_phases, "ahead")
            if campaign.deferred is not None and campaign.goes_on():
                # The failure was seen one example late: replay Hypothesis up to
                # it (the same seed draws the same examples) and shrink from there.
                campaign.result.reason = None
                campaign.run(strategy, settings, left, seed, ahead_phases, "replay")


_CTRL_C_PATIENCE_S = 3.0
"""How long a Ctrl-C waits for the example in flight, whose finding would
otherwise be lost: one example, not a hang's ``timeout``."""

_SAVED_PHASES = (Phase.explicit, Phase.reuse)
"""Phases that run examples Hypothesis did not generate in this run."""


class _Ahead(KeyboardInterrupt):
    """The example before this one failed, seen only now that this one is
    drawn: the run ends at once (a KeyboardInterrupt, so that Hypothesis
    neither saves nor replays it) and is replayed up to the failure."""


@dataclass
class _Sent:
    scenario: Scenario
    ticket: Ticket
    call: int


def _digest(scenario: Scenario) -> bytes:
    return hashlib.blake2b(pickle.dumps(scenario, protocol=pickle.HIGHEST_PROTOCOL),
                           digest_size=8).digest()


class _Campaign:
    """One target's Hypothesis runs, their test body and what they found.

    A run is in one of three modes. ``sync``: each example runs and is judged
    before Hypothesis draws the next. ``ahead``: each call sends its example
    to the ranks, then judges the last call's, and returns: Hypothesis draws
    while the ranks work, and the ranks go from one example to the next
    without waiting for the driver. Hypothesis decides what to draw next from
    outcomes only, and every outcome before a first failure is a pass, so its
    examples are the same. A failure seen one call late ends the run (the
    example sent behind it is dropped unjudged), and ``replay`` runs
    Hypothesis again with the same seed, skips the examples that passed
    (checking each is the one drawn before), raises at the failing one with
    its verdict, and shrinks in sync: what a sync run would have done.
    """

    def __init__(self, pool: RankPool, target: Target, result: CampaignResult,
                 options: RunOptions, *, budget_s: float | None, stop_on_failure: bool,
                 shrink_budget_s: float | None, progress: Progress | None,
                 on_example: OnExample | None, on_verdict: OnVerdict | None,
                 stop: Callable[[], bool] | None, own_seed: bool,
                 first_sight: Callable[[Scenario, Failure], Any] | None) -> None:
        self.pool, self.target, self.result, self.options = pool, target, result, options
        self.first_sight = first_sight
        """Saves the first failure as seen, before any caller hears of it."""
        self.budget_s, self.stop_on_failure = budget_s, stop_on_failure
        self.shrink_budget_s, self.progress = shrink_budget_s, progress
        self.on_example, self.on_verdict, self.stop = on_example, on_verdict, stop
        self.start = time.monotonic()
        self.held: set[str] = set()
        self.mode = "sync"
        self.calls = 0
        self.flight: deque[_Sent] = deque()
        """Examples sent and not yet judged (ahead mode), oldest first: at most two."""
        self.digests: list[bytes] = []
        self.deferred: int | None = None
        """The call whose failure was seen late (ahead mode), replayed up to."""
        self.deferred_verdict: Verdict | None = None
        self.own_seed = own_seed
        """The seed is ours, only so that a replay draws what the ahead run drew."""
        self.db_key: bytes | None = None
        """The example database's key for this target's test (set by ``_test``)."""

    def goes_on(self) -> bool:
        """Whether nothing ended the campaign: no shrunk failure, no interrupt, no stop."""
        r = self.result
        if r.interrupted or (self.stop is not None and self.stop()):
            return False
        return r.failure is None or self.deferred is not None

    def run(self, strategy: st.SearchStrategy[Scenario], settings: hypothesis.settings,
            max_examples: int, seed: int | None, phases: tuple[Phase, ...], mode: str) -> None:
        self.mode, self.calls = mode, 0
        body = self._test(strategy, settings, max_examples, seed, phases)
        result = self.result
        stages.enter(stages.HYPOTHESIS)
        try:
            with profiles.seed_only(), profiles.rare_collections():
                body()
        except (_Found, _Ahead):
            pass
        except unittest.SkipTest:
            # Raised when a run executed nothing: a replay of past failures
            # that found none. A generating run always executes something.
            if Phase.generate in phases:
                raise
        except _Misused as exc:
            for sent in self.flight:
                self.pool.discard(sent.ticket)
            self.flight.clear()
            raise exc.args[0] from None
        except _Stopped as stopped:
            result.end(stopped.reason)
        except KeyboardInterrupt:
            # Ctrl-C: a failure found is saved as far as it was shrunk; with
            # nothing found, Interrupted carries the examples run so far. Either
            # way the interrupt goes on.
            result.end(StopReason.INTERRUPTED)
        except Flaky:
            # The last failure seen is the smallest that ever failed; keep it.
            result.flaky = not result.shrink_truncated
        finally:
            stages.leave()
        self._last()

    def _last(self) -> None:
        """The examples still in flight when an ahead run ended."""
        flight, self.flight = self.flight, deque()
        waited_out = False
        for sent in flight:
            if waited_out or self.deferred is not None or self.result.failure is not None:
                # Sent behind the example that failed (a run that waited would
                # not have drawn it), or behind one a Ctrl-C gave up on: its
                # replies are read in turn, its outcome dropped.
                self.pool.discard(sent.ticket)
                continue
            if self.result.interrupted:
                # Ctrl-C: keep what is already in, wait for nothing else.
                outcome = self.pool.collect(sent.ticket, patience=_CTRL_C_PATIENCE_S)
                if outcome is None:
                    waited_out = True
                    self.pool.discard(sent.ticket)
                    continue
                verdict = _judge(outcome, sent.scenario, self.options.values)
            else:
                verdict = _settle(self.pool, sent.ticket)
            try:
                self._account(sent.scenario, verdict, sent.call)
            except _Ahead:
                if self.result.interrupted:
                    self.deferred = None  # saved unshrunk: the user asked to stop

    def _test(self, strategy: st.SearchStrategy[Scenario], settings: hypothesis.settings,
              max_examples: int, seed: int | None, phases: tuple[Phase, ...]) -> Any:
        def body(scenario: Scenario) -> None:
            stages.enter(stages.DRIVER)
            try:
                self._body(scenario)
            except targets.TargetError as exc:
                raise _Misused(exc) from None
            finally:
                stages.leave()

        # A distinct test identity per target keeps database entries apart. Hypothesis
        # keys its database by the test's source, the same for every target here, plus
        # this digest (what Hypothesis's stateful tests set for the same reason).
        body.__qualname__ = f"streamfuzz[{self.target.name}]"
        body._hypothesis_internal_add_digest = self.target.name.encode()  # type: ignore[attr-defined]
        test = given(strategy)(body)
        self.db_key = function_digest(body)  # Hypothesis's key for this test's entries
        ours = hypothesis.settings(settings, max_examples=max_examples, phases=phases)
        if seed is None:
            return ours(test)
        if self.own_seed:
            # A seed that only makes the replay draw what the ahead run drew:
            # the settings go on after it, so that, as without a seed, the
            # database keeps what fails.
            return ours(hypothesis.seed(seed)(test))
        return hypothesis.seed(seed)(ours(test))

    def _body(self, scenario: Scenario) -> None:
        self.calls += 1
        result = self.result
        if self.mode == "replay":
            assert self.deferred is not None and self.deferred_verdict is not None  # set by ahead
            same = (self.calls <= len(self.digests)
                    and _digest(scenario) == self.digests[self.calls - 1])
            if same and self.calls < self.deferred:
                return  # passed in the ahead run
            self.mode = "sync"
            if same:
                verdict, self.deferred, self.deferred_verdict = self.deferred_verdict, None, None
                _found(verdict)
            # Hypothesis drew something else this time: judge from here on.
            self.deferred = self.deferred_verdict = None
        elapsed = time.monotonic() - self.start
        if stop_signals.signalled():  # a Ctrl-C that Python swallowed
            raise KeyboardInterrupt
        if self.stop is not None and self.stop():
            raise _Stopped(StopReason.ASKED)
        if result.failure is None and self.budget_s is not None and elapsed > self.budget_s:
            raise _Stopped(StopReason.BUDGET)
        if (self.shrink_budget_s is not None and result.first_failure_s is not None
                and elapsed - result.first_failure_s > self.shrink_budget_s):
            result.end(StopReason.SHRINK_BUDGET)
            return
        if self.on_example is not None:
            self.on_example((*(sent.scenario for sent in self.flight), scenario))
        if self.mode == "ahead":
            self.digests.append(_digest(scenario))
            self.flight.append(_Sent(scenario, self.pool.submit(self.target, scenario,
                                                                self.options), self.calls))
            if len(self.flight) > 1:
                # The last example's verdict, read once this one is queued
                # behind it, so that the ranks never wait for the driver. A
                # failure there ends the run: this one is then dropped
                # (``_last``), as a run that waited would not have drawn it.
                verdict = _settle(self.pool, self.flight[0].ticket)
                sent = self.flight.popleft()
                self._account(sent.scenario, verdict, sent.call)
            return
        self._account(scenario, evaluate(self.pool, self.target, scenario, self.options),
                      self.calls)

    def _account(self, scenario: Scenario, verdict: Verdict, call: int) -> None:
        result = self.result
        result.examples += 1
        self.held.update(verdict.held)
        if "gate-timeout" in verdict.held or "rerun" in verdict.held:
            result.gate_timeouts += 1
        if result.coverage is not None:
            result.coverage.add(verdict.calls)
        labels = behaviours(scenario, verdict)
        if hypothesis.currently_in_test_context():  # not for the last of an ahead run
            for label in labels:
                hypothesis.event(label)
        if not verdict.ok and result.failure is None and self.first_sight is not None:
            self.first_sight(scenario, verdict.first)
        if self.on_verdict is not None:
            self.on_verdict(scenario, verdict, labels)
        if self.progress is not None:
            self.progress(result.examples, time.monotonic() - self.start,
                          0 if verdict.ok else 1)
        if verdict.ok:
            return
        if result.first_failure_examples is None:
            result.first_failure_examples = result.examples
            result.first_failure_s = time.monotonic() - self.start
            result.first_failure_at = time.time()
        result.failures += 1
        if not self.stop_on_failure:
            return
        result.failure, result.scenario = verdict.first, scenario
        if self.mode == "ahead":
            self.deferred, self.deferred_verdict = call, verdict
            raise _Ahead
        _found(verdict)


def _found(verdict: Verdict) -> NoReturn:
    """The one place that raises a failure into Hypothesis: it tells bugs apart
    by where their exception was raised, so a replayed failure and its
    shrinking steps must raise from the same line."""
    raise _Found(verdict.summary())


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
