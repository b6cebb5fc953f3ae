"""``python -m streamfuzz bench``: how fast the fuzzer is, and what Hypothesis costs.

For each device and draft-broadcast target (bench measures that protocol
only) it measures, on one warm rank pool:

* fuzzer examples/s (Hypothesis + driver, generation only, failures counted
  and not raised) and, on exactly the scenarios it drew, a hand-written loop
  that does the same per-example work (the same rank processes, the same run
  and judgement of one example, ``driver.run_and_judge``) without Hypothesis
  or the driver's campaign loop: the ratio fuzzer/loop is their overhead
  alone; medians over seeds;
* the cost of each oracle: the loop again with oracles switched off one by one;
* for the built-in versions, what writing them as plain torch.cuda costs
  against their ``ctx.streams`` form (``streamfuzz.fuzz.draft.targets.pp_draft_streams``): the
  two forms alternate on the same scenarios, round by round;
* on fresh pools (a cold start: processes, process group, gate compile, with
  an empty Triton cache), the examples and seconds to the first failure and
  the time spent shrinking it, median over seeds; and from a user's cold
  start, ``python -m streamfuzz run`` in a new process, the seconds from spawning
  it to its first failure;
* where the time goes: the stage counters (``streamfuzz.fuzz.stages``) of the driver and
  of every rank, per example, on fresh ranks that count (a table, and a
  stacked bar chart ``stages-DEVICE.png`` where matplotlib is installed);
* detection rates with gates and with spins: the same scenarios (a crafted
  minimal one, repeated, and random ones drawn without Hypothesis) run both ways.

It writes ``bench.json``, ``bench.md`` and the charts into ``--out``.
"""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import Phase

from streamfuzz.fuzz import corpus, driver, profiles, stages, stages_report, targets
from streamfuzz.fuzz.bench.report import fmt, markdown
from streamfuzz.fuzz.draft import PROTOCOL as DRAFT
from streamfuzz.fuzz.draft.scenario import (
    CHURN_DTYPES,
    FILL_RANGE,
    ITEMSIZE,
    Churn,
    Delay,
    Scenario,
    Step,
)
from streamfuzz.fuzz.draft.strategies.scenarios import scenarios
from streamfuzz.fuzz.options import DEFAULT, Hold, Oracle, RunOptions
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.verdict import Verdict

Log = Callable[[str], None]
ORACLE_SETS = {"none": frozenset(), "value": frozenset({Oracle.VALUE}),
               "value+reuse": frozenset({Oracle.VALUE, Oracle.REUSE}), "all": frozenset(Oracle)}
DETECTION_ORACLES = frozenset({Oracle.VALUE, Oracle.REUSE})
"""Gates against spins is about what manifests: the lifetime oracle would find
the bug from the order of events, held or not."""


@dataclass
class LoopResult:
    examples: int
    elapsed_s: float
    failures: int

    @property
    def examples_per_s(self) -> float:
        return self.examples / self.elapsed_s if self.elapsed_s else 0.0


def judge(pool: RankPool, target: str, scenario: Scenario, options: RunOptions) -> Verdict:
    """One example without Hypothesis: the ranks' run and its judgement, as
    ``driver.evaluate`` has them; ``options`` go to the ranks unchanged."""
    return driver.run_and_judge(pool, target, scenario, options)


def hand_loop(pool: RankPool, target: str, batch: Sequence[Scenario],
              options: RunOptions) -> LoopResult:
    """The baseline: scenarios drawn up front, then a plain loop over the ranks."""
    failures = 0
    start = time.perf_counter()
    for scenario in batch:
        failures += not judge(pool, target, scenario, options).ok
    return LoopResult(len(batch), time.perf_counter() - start, failures)


# -- scenarios without Hypothesis ----------------------------------------------
def random_scenario(rng: random.Random, world_size: int, max_steps: int = 6) -> Scenario:
    """A scenario from the strategies' distribution, drawn with a plain RNG."""
    reqs, k = rng.randint(1, 16), rng.randint(1, 4)
    steps = []
    for _ in range(rng.randint(1, max_steps)):
        n = rng.randint(0, reqs)
        idx = tuple(rng.sample(range(reqs), n))
        final = tuple(rng.random() < 0.5 for _ in idx)
        churn = []
        for _ in range(rng.randint(0, 4)):
            dtype = rng.choice(CHURN_DTYPES)
            cls = 512 // ITEMSIZE[dtype]
            lo, hi = FILL_RANGE[dtype]
            fill = rng.randint(0, reqs - 1) if rng.random() < 0.5 else rng.randint(reqs, hi)
            churn.append(Churn(stream=rng.choice(("main", "side")),
                               numel=rng.randint(1, cls) if rng.random() < 0.5
                               else rng.randint(cls + 1, 8 * cls),
                               dtype=dtype, fill=max(lo, fill), keep=rng.random() < 0.5))
        delays = []
        for _ in range(rng.randint(0, 2)):
            side = rng.random() < 0.5
            delays.append(Delay(point=rng.choice(("pre_call", "post_call")),
                                stream="side" if side else "main",
                                cycles=rng.choice((100_000, 1_000_000, 5_000_000)),
                                until=rng.choice(("after_churn", "before_next_call",
                                                  "after_call", "")) if side else ""))
        steps.append(Step(idx_mapping=idx, idx_dtype=rng.choice(("int64", "int32")),
                          final=final,
                          num_sampled=tuple(rng.randint(1, k + 1) if f else 0 for f in final),
                          num_rejected=tuple(rng.randint(0, k) for _ in idx),
                          churn=tuple(churn), delays=tuple(delays)))
    return Scenario(world_size=world_size, max_num_reqs=reqs, num_spec_steps=k,
                    pipeline_depth=rng.randint(1, 3), steps=tuple(steps))


def crafted(bug: str, world_size: int, cycles: int = 1_000_000) -> Scenario:
    """The smallest forced interleaving for each bug (the spec's H200 experiments).

    ``reuse``: the broadcast stream is held until main has allocated and filled
    a block of ``idx_mapping``'s size class. ``war``: held until the next
    step's drafter has rewritten the same rows.
    """
    n = 4
    base = Step(idx_mapping=tuple(range(n)), idx_dtype="int64", final=(True,) * n,
                num_sampled=(1,) * n, num_rejected=(0,) * n)
    steps: tuple[Step, ...]
    if bug == "reuse":
        hold = Delay("pre_call", "side", cycles, until="after_churn")
        # Several same-class blocks, kept: whichever free block the allocator
        # picks first, idx_mapping's is among those handed out.
        churn = tuple(Churn("main", n, "int64", 1, True) for _ in range(4))
        steps = (replace(base, churn=churn, delays=(hold,)),)
    else:
        hold = Delay("pre_call", "side", cycles, until="before_next_call")
        steps = (replace(base, delays=(hold,)), base)
    return Scenario(world_size=world_size, max_num_reqs=8, num_spec_steps=2, steps=steps)


# -- the measurements ----------------------------------------------------------
def _settings(generate_only: bool) -> hypothesis.settings:
    base = profiles.get("ci")
    if generate_only:
        return hypothesis.settings(base, phases=(Phase.generate,))
    return base


def throughput(pool: RankPool, target: str, examples: int, seeds: int = 1,
               options: RunOptions = DEFAULT,
               oracle_examples: int = 50, oracle_rounds: int = 2,
               waiting: bool = True) -> dict[str, Any]:
    """Per seed, the fuzzer and then the loop on the scenarios it drew, with the
    same ``options`` (by default those of ``fuzz run``): medians over seeds, and
    the median of the seeds' ratios. Then, on the first seed's first
    ``oracle_examples`` scenarios, the loop per oracle set. ``waiting``: also
    the fuzzer judging each example before drawing the next, on the same seeds
    (as long again as the fuzzer's own run, which for a target that crashes
    its ranks is most of the row). On CUDA, rank 0's reserved memory before
    and after each seed's fuzzer run is kept beside the rates."""
    fuzzer, waits, loop, ratios, failures, held = [], [], [], [], [0, 0], set()
    reserved: list[tuple[float | None, float | None]] = []
    restarts = pool.restarts
    first: list[Scenario] = []
    for seed in range(max(1, seeds)):
        drawn: list[Scenario] = []
        strategy = scenarios(world_size=pool.world_size).map(_kept_in(drawn))
        before = _reserved_mib(pool)
        fz = driver.fuzz(pool, target, _settings(True), max_examples=examples, seed=seed,
                         strategy=strategy, options=options, stop_on_failure=False)
        reserved.append((before, _reserved_mib(pool)))
        if waiting:  # the same fuzzer, judging each example before drawing the next
            waits.append(driver.fuzz(pool, target, _settings(True), max_examples=examples,
                                     seed=seed, options=options, stop_on_failure=False,
                                     pipeline=False).examples_per_s)
        lp = hand_loop(pool, target, drawn, options)
        fuzzer.append(fz.examples_per_s)
        loop.append(lp.examples_per_s)
        ratios.append(fz.examples_per_s / lp.examples_per_s if lp.examples_per_s else 0.0)
        failures[0] += fz.failures
        failures[1] += lp.failures
        held.update(fz.held)
        first = first or drawn
    fuzz_restarts = pool.restarts - restarts
    # Interleaved rounds, best of each: one pass is at the mercy of a busy host.
    per_oracle: dict[str, float] = {}
    for _ in range(oracle_rounds):
        for name, oracle_set in ORACLE_SETS.items():
            r = hand_loop(pool, target, first[:oracle_examples],
                          replace(options, oracles=oracle_set))
            ms = 1000 * r.elapsed_s / max(1, r.examples)
            per_oracle[name] = min(ms, per_oracle.get(name, ms))
    form = api_forms(pool, target, first[:oracle_examples * 2], options)
    return {
        "api_forms": form,
        "examples": examples, "seeds": len(fuzzer),
        "fuzzer_ex_s": statistics.median(fuzzer), "loop_ex_s": statistics.median(loop),
        "waiting_ex_s": statistics.median(waits) if waits else None,
        "ratio": statistics.median(ratios),
        "per_seed": {"fuzzer_ex_s": fuzzer, "waiting_ex_s": waits, "loop_ex_s": loop,
                     "ratio": ratios, "gpu_reserved_mib": reserved},
        "fuzzer_failures": failures[0], "loop_failures": failures[1],
        "restarts_in_fuzzer_run": fuzz_restarts, "held_by": sorted(held),
        "oracle_examples": min(oracle_examples, len(first)),
        "ms_per_example": per_oracle,
        "oracles": options.oracle_names(),
        "oracle_cost_ms": {"value": per_oracle["value"] - per_oracle["none"],
                           "reuse": per_oracle["value+reuse"] - per_oracle["value"],
                           "lifetime": per_oracle["all"] - per_oracle["value+reuse"]},
    }


def _kept_in(drawn: list[Scenario]) -> Callable[[Scenario], Scenario]:
    """A map for a strategy that keeps what it draws in ``drawn``."""
    def keep(scenario: Scenario) -> Scenario:
        drawn.append(scenario)
        return scenario
    return keep


def breakdown(device: str, world: int, target: str, examples: int,
              options: RunOptions = DEFAULT, timeout: float = 60.0,
              warmup_examples: int = 20) -> dict[str, Any]:
    """Where the fuzzer's time goes, per example and per process: the stage
    counters (``streamfuzz.fuzz.stages``) of this driver and of every rank, over one
    generate-only run of ``examples`` (seed 0) on fresh ranks that count from
    their start. Counting costs a little; throughput is measured without it."""
    stages.enable(stages.HYPOTHESIS)
    try:
        with RankPool(world, device, timeout=timeout, env={stages.ENV: "1"}) as pool:
            driver.fuzz(pool, target, _settings(True), max_examples=warmup_examples, seed=99,
                        options=options, stop_on_failure=False)
            pids = [os.getpid(), *pool.pids]
            ranks_before, before = pool.stage_totals(), stages.totals()
            cpu_before = [thread_cpu(p) for p in pids]
            start = time.perf_counter()
            fz = driver.fuzz(pool, target, _settings(True), max_examples=examples, seed=0,
                             options=options, stop_on_failure=False)
            wall = time.perf_counter() - start
            cpu_after = [thread_cpu(p) for p in pids]
            after, ranks_after = stages.totals(), pool.stage_totals()
    finally:
        stages.disable()
    n = max(1, fz.examples)

    def per_example(seconds: dict[str, float]) -> dict[str, float]:
        return {k: 1000 * v / n for k, v in seconds.items()}

    return {
        "target": target, "examples": fz.examples, "wall_ms": 1000 * wall / n,
        "driver": per_example(stages.since(before, after)),
        "ranks": [per_example(stages.since(b or {}, a or {}))
                  for b, a in zip(ranks_before, ranks_after)],
        "cpu_threads": [per_example(stages.since(b, a))
                        for b, a in zip(cpu_before, cpu_after)],
    }


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each of a process's threads, summed by thread name
    (Linux ``/proc``; empty elsewhere). The stage counters are wall clock; this
    says which threads burn the cores a busy host shares (gloo's own threads
    among them)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                text = fh.read()
        except OSError:
            continue  # a thread that ended
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


STREAMS_FORM = {name: f"streamfuzz.fuzz.draft.targets.pp_draft_streams:{name.replace('-', '_')}"
                for name in DRAFT.versions}
"""Each built-in version's ``ctx.streams`` form, for ``api_forms``."""


def api_forms(pool: RankPool, target: str, batch: Sequence[Scenario], options: RunOptions,
              rounds: int = 5) -> dict[str, Any] | None:
    """Plain torch.cuda against the ``ctx.streams`` form of the same version, on
    the same scenarios; the two alternate, and each round gives one ratio
    (median reported), so a busy host slows both sides of a ratio alike.
    None for a target that has no ``ctx.streams`` form."""
    streams_form = STREAMS_FORM.get(target)
    if streams_form is None or not batch:
        return None
    ratios, plain, streams = [], [], []
    for _ in range(rounds):
        a = hand_loop(pool, target, batch, options).examples_per_s
        b = hand_loop(pool, streams_form, batch, options).examples_per_s
        plain.append(a)
        streams.append(b)
        ratios.append(a / b if b else 0.0)
    return {"examples": len(batch), "rounds": rounds, "plain_ex_s": statistics.median(plain),
            "streams_ex_s": statistics.median(streams), "ratio": statistics.median(ratios),
            "ratios": ratios}


def _reserved_mib(pool: RankPool) -> float | None:
    """Rank 0's CUDA caching allocator, reserved MiB (None off CUDA): a fuzzer
    run that grows it paid for new blocks the runs after it reuse."""
    if pool.device != "cuda":
        return None
    mem = pool.stats()
    got = mem[0].gpu_reserved if mem and mem[0] is not None else None
    return None if got is None else round(got / 2**20, 1)


def first_failure(device: str, world: int, target: str, seed: int, max_examples: int,
                  budget_s: float, options: RunOptions, timeout: float,
                  shrink_budget_s: float | None) -> dict[str, Any]:
    """From a cold start: fresh ranks, an empty Triton cache, then fuzz until found.

    ``shrink_budget_s`` None: stop at the first failure, no shrinking.
    """
    env = {"TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="streamfuzz-triton-")}
    t0 = time.perf_counter()
    with RankPool(world, device, timeout=timeout, env=env) as pool:
        start_s = time.perf_counter() - t0
        res = driver.fuzz(pool, target, _settings(shrink_budget_s is None),
                          max_examples=max_examples, seed=seed, budget_s=budget_s,
                          options=options, shrink_budget_s=shrink_budget_s)
        gates = pool.info[0].gates if pool.info else None
        setup = pool.info[0].setup_s if pool.info else None
    failure = res.failure
    seen = res.first_failure_s if failure is not None else None
    return {
        "seed": seed, "found": failure is not None,
        "kind": failure.kind if failure is not None else None,
        "start_s": start_s, "examples": res.first_failure_examples,
        "fuzz_s": res.first_failure_s,
        "cold_s": start_s + seen if seen is not None else None,
        "shrink_s": (res.elapsed_s - seen
                     if seen is not None and shrink_budget_s is not None else None),
        "shrink_truncated": res.shrink_truncated,
        "examples_run": res.examples, "held_by": res.held, "gates": gates,
        "rank_setup_s": setup,
        "shrunk": res.scenario.describe() if res.scenario else None,
    }


def from_process_start(device: str, world: int, target: str, seed: int, max_examples: int,
                       budget_s: float, options: RunOptions, timeout: float) -> dict[str, Any]:
    """A user's cold start: ``python -m streamfuzz run`` in a fresh process (interpreter,
    imports, rank processes and all), timed from before it is spawned to the
    first failure it sees (the run's report says when); no shrinking to speak of."""
    with tempfile.TemporaryDirectory(prefix="streamfuzz-cold-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "streamfuzz", "run", "--target", target, "--device", device,
               "--world-size", str(world), "--seed", str(seed),
               "--max-examples", str(max_examples), "--budget", str(budget_s),
               "--shrink-budget", "0.001", "--timeout", str(timeout), "--profile", "ci",
               "--oracle", ",".join(options.oracle_names()) or "all",
               "--hold", options.hold.value, "--corpus", str(Path(tmp) / "corpus"),
               "--report", str(report)]
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(tmp) / "triton"))
        t0 = time.time()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=budget_s + 4 * timeout + 300)
        wall = time.time() - t0
        data = json.loads(report.read_text()) if report.exists() else {}
    (row,) = data.get("targets") or [{}]
    at = row.get("first_failure_at")
    return {"seed": seed, "found": at is not None, "exit": proc.returncode,
            "s": at - t0 if at is not None else None,
            "examples": row.get("first_failure_examples"), "process_s": wall,
            "fuzz_s": row.get("first_failure_s"), "rank_start_s": data.get("rank_start_s"),
            "error": None if data else proc.stderr.strip()[-300:]}


def detection(pool: RankPool, target: str, batch: Sequence[Scenario]) -> dict[str, Any]:
    """Failing examples out of ``len(batch)``, with gates and with spins."""
    out: dict[str, Any] = {"examples": len(batch)}
    for hold in Hold:
        r = hand_loop(pool, target, batch, RunOptions(oracles=DETECTION_ORACLES, hold=hold))
        out[hold.value] = r.failures
    return out


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def run(devices: Sequence[str], names: Sequence[str], *, seeds: int = 5, examples: int = 200,
        detect_examples: int = 200, random_examples: int = 100, oracle_examples: int = 50,
        ff_examples: int = 1000, ff_budget_s: float = 60.0, shrink_budget_s: float = 30.0,
        warmup_examples: int = 30, waiting: bool = True,
        world_sizes: dict[str, int] | None = None, timeout: float = 60.0,
        options: RunOptions = DEFAULT, log: Log = print,
        save: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """Every measurement for every device and target; returns the report.

    Shrinking is timed on the first seed only (bounded by ``shrink_budget_s``);
    the other seeds stop at their first failure. ``save`` gets the report after
    every stage, so a run cut short still leaves its tables behind. ``waiting``:
    see ``throughput``.
    """
    report: dict[str, Any] = {"machine": {"host": platform.node(), "cpu": platform.processor()
                                          or platform.machine(),
                                          "python": platform.python_version()},
                              "hypothesis": hypothesis.__version__, "runs": []}
    keep = save or (lambda _: None)
    plan = _Plan(seeds=seeds, examples=examples, detect_examples=detect_examples,
                 random_examples=random_examples, oracle_examples=oracle_examples,
                 ff_examples=ff_examples, ff_budget_s=ff_budget_s,
                 shrink_budget_s=shrink_budget_s, warmup_examples=warmup_examples,
                 waiting=waiting, timeout=timeout, options=options, log=log,
                 checkpoint=lambda: keep(report))
    for device in devices:
        world = (world_sizes or {}).get(device, 2 if device == "cpu" else 1)
        run_info: dict[str, Any] = {"device": device, "world_size": world,
                                    "targets": [{"target": name} for name in names]}
        report["runs"].append(run_info)
        # Cold starts first: the headline numbers survive a run cut short.
        for row in run_info["targets"]:
            if row["target"] not in targets.CORRECT:
                _cold_starts(plan, device, world, row)
        _on_a_warm_pool(plan, device, world, run_info)
        # Last, on fresh ranks that count their stages (a cost the rows above do not pay).
        for row in run_info["targets"]:
            row["stages"] = breakdown(device, world, row["target"], examples, options, timeout)
            log(f"  {row['target']}: stages per example {_stage_line(row['stages'])}")
            plan.checkpoint()
    return report


@dataclass(frozen=True)
class _Plan:
    """What ``run`` was asked for, as each of its stages reads it; ``checkpoint``
    hands the report as it stands to ``run``'s ``save``."""

    seeds: int
    examples: int
    detect_examples: int
    random_examples: int
    oracle_examples: int
    ff_examples: int
    ff_budget_s: float
    shrink_budget_s: float
    warmup_examples: int
    waiting: bool
    timeout: float
    options: RunOptions
    log: Log
    checkpoint: Callable[[], None]


def _cold_starts(plan: _Plan, device: str, world: int, row: dict[str, Any]) -> None:
    """``row``'s first failures from a cold start, per seed: on fresh pools,
    then from a fresh ``python -m streamfuzz run`` process."""
    name = row["target"]
    runs = [first_failure(device, world, name, seed, plan.ff_examples, plan.ff_budget_s,
                          plan.options, plan.timeout,
                          plan.shrink_budget_s if seed == 0 else None)
            for seed in range(plan.seeds)]
    row["first_failure"] = {
        "seeds": runs, "found": sum(r["found"] for r in runs),
        "median_examples": _median([r["examples"] for r in runs]),
        "median_cold_s": _median([r["cold_s"] for r in runs]),
        "median_start_s": _median([r["start_s"] for r in runs]),
        "median_shrink_s": _median([r["shrink_s"] for r in runs]),
        "shrink_truncated": any(r["shrink_truncated"] for r in runs),
        "gates": runs[0]["gates"],
    }
    plan.log(f"[{device}] {name}: first failure found {row['first_failure']['found']}/"
             f"{plan.seeds}, median cold {row['first_failure']['median_cold_s']}, "
             f"gates: {runs[0]['gates']}")
    plan.checkpoint()
    procs = [from_process_start(device, world, name, seed, plan.ff_examples, plan.ff_budget_s,
                                plan.options, plan.timeout) for seed in range(plan.seeds)]
    row["from_process_start"] = {
        "seeds": procs, "found": sum(p["found"] for p in procs),
        "median_s": _median([p["s"] for p in procs]),
        "median_examples": _median([p["examples"] for p in procs])}
    plan.log(f"[{device}] {name}: from process start, found "
             f"{row['from_process_start']['found']}/{plan.seeds}, median "
             f"{row['from_process_start']['median_s']} s")
    plan.checkpoint()


def _on_a_warm_pool(plan: _Plan, device: str, world: int, run_info: dict[str, Any]) -> None:
    """Every target's throughput and (off CPU) detection rates, on one pool."""
    t0 = time.perf_counter()
    with RankPool(world, device, timeout=plan.timeout) as pool:
        info = pool.info[0] if pool.info else None
        run_info.update({"device_name": info.device_name if info else None,
                         "torch": info.torch if info else None,
                         "backend": info.backend if info else None,
                         "gates": info.gates if info else None,
                         "warm_start_s": time.perf_counter() - t0})
        plan.log(f"[{device}] world {world}, {run_info['device_name']}, "
                 f"gates: {run_info['gates']}")
        # Warm up first (imports, strategy caches, the ranks' allocators), so
        # that the first target's numbers are not the warm-up's.
        driver.fuzz(pool, "main-gather", _settings(True), max_examples=plan.warmup_examples,
                    seed=99, options=plan.options, stop_on_failure=False)
        rng = random.Random(1234)
        random_batch = [random_scenario(rng, world) for _ in range(plan.random_examples)]
        for row in run_info["targets"]:
            name = row["target"]
            tp = row["throughput"] = throughput(pool, name, plan.examples, seeds=plan.seeds,
                                                options=plan.options,
                                                oracle_examples=plan.oracle_examples,
                                                waiting=plan.waiting)
            grew = [pair for pair in tp["per_seed"]["gpu_reserved_mib"] if None not in pair]
            plan.log(f"  {name}: fuzzer {tp['fuzzer_ex_s']:.1f} ex/s (waiting for each "
                     f"verdict {fmt(tp['waiting_ex_s'])}), loop {tp['loop_ex_s']:.1f} ex/s "
                     f"(medians of {tp['seeds']} seeds)" + (
                         "; rank 0 reserved MiB, each seed's fuzzer run before -> after: "
                         + ", ".join(f"{a} -> {b}" for a, b in grew) if grew else ""))
            plan.checkpoint()
            if device == "cpu":
                continue  # simulated streams: nothing manifests, nothing to hold
            row["detection"] = {
                "crafted": detection(pool, name, [crafted(
                    "reuse" if name == "pre-fix" else "war", world)] * plan.detect_examples),
                "random": detection(pool, name, random_batch),
            }
            plan.log(f"  {name}: detection {row['detection']}")
            plan.checkpoint()


def _stage_line(b: dict[str, Any]) -> str:
    def ms(d: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
    return "; ".join([f"driver: {ms(b['driver'])}"]
                     + [f"rank {r}: {ms(v)}" for r, v in enumerate(b["ranks"])])


def write(out: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    corpus.write_json_atomic(out / "bench.json", report)
    md = out / "bench.md"
    corpus.write_text_atomic(md, markdown(report))
    for r in report["runs"]:
        breakdowns = [t["stages"] for t in r["targets"] if t.get("stages")]
        if breakdowns:
            stages_report.plot(out / f"stages-{r['device']}.png", breakdowns,
                               f"{r['device']}, world size {r['world_size']}: "
                               f"ms per example by stage")
    return out / "bench.json", md
