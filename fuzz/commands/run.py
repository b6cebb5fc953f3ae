"""``run``: fuzz each target in turn, print what was found, write the report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import corpus, profiles, targets
from streamfuzz.fuzz.commands import say_error
from streamfuzz.fuzz.commands.plan import CountingGPUs
from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.plan import Plan
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.status_line import StatusLine
from streamfuzz.fuzz.stop import StopReason


class Progress:
    """A live line on a terminal, fuzzing then shrinking. Elsewhere (a pipe, a
    log) one line when shrinking starts, so that its minutes are not silence."""

    def __init__(self, target: str, shrink_budget_s: float | None = None,
                 lost: Callable[[], bool] | None = None) -> None:
        self.target = target
        self.lost = lost
        """Whether another world claimed the failure (it shrinks it, not this one)."""
        self.shrink_budget_s = shrink_budget_s
        self.line = StatusLine(sys.stderr, every_s=0.2)
        self.failures = 0
        self.found_at: tuple[int, float] | None = None

    def __call__(self, examples: int, elapsed: float, failed: int) -> None:
        self.failures += failed
        if failed and self.found_at is None:
            self.found_at = (examples, elapsed)
            if not self.line.tty and not (self.lost is not None and self.lost()):
                bound = (f", at most {self.shrink_budget_s:g}s"
                         if self.shrink_budget_s is not None else "")
                print(f"[{self.target}] found a failure after {examples} examples; shrinking "
                      f"it{bound} (Ctrl-C saves it as shrunk so far)", file=sys.stderr,
                      flush=True)
        self.line.draw(lambda: self._text(examples, elapsed))

    def _text(self, examples: int, elapsed: float) -> str:
        if self.found_at is not None:
            n, t = self.found_at
            return (f"[{self.target}] shrinking: {examples - n} examples tried in "
                    f"{elapsed - t:.0f}s, {self.failures} failing")
        rate = examples / elapsed if elapsed else 0.0
        return f"[{self.target}] {examples} examples, {rate:.1f}/s, 0 failures"

    def done(self) -> None:
        self.line.clear()


def run_command(plan: Plan) -> int:
    run = plan.run_settings()
    options, device, world = plan.options, plan.device, plan.world_size
    corpus.sweep(plan.corpus)
    if plan.worlds > 1:
        from streamfuzz.fuzz.worlds import run_worlds

        return run_worlds(plan)
    settings = profiles.get(run.profile)
    for name in plan.names if plan.world_of is None or plan.world_of.index == 0 else ():
        up = targets.upstream_of(name)
        if up is not None:
            print(f"{name}: {up.describe()}")
    results: list[Any] = []
    misused: list[str] = []
    start_s: dict[str, float] = {}
    pool = RankPool(world, device, timeout=plan.timeout_s)
    try:
        try:
            pool.start()
            start_s = dict(pool.info[0].setup_s) if pool.info else {}
        except KeyboardInterrupt:  # before any target ran: the report says so
            interrupted = True
            print(f"interrupted while the {world} ranks were starting: no target ran")
        else:
            interrupted = _fuzz_each(pool, plan, settings, results, misused)
    finally:
        pool.close()
    restarts = pool.restarts
    if results and plan.speaks_for_all:  # the controller prints every world's
        _print_table(results, device, world, options.running_on(device))
    if run.report:
        write_report(run.report, results, device, world, restarts, options, interrupted,
                      misused, start_s)
    if interrupted:
        _say_interrupted(plan, [str(r.corpus_path) for r in results if r.corpus_path])
        return 130
    if misused:
        return 2
    return 1 if any(r.failure and not r.duplicate for r in results) else 0


def interrupted_counting_gpus(args: argparse.Namespace, stopped: CountingGPUs) -> int:
    """Ctrl-C while the GPU count waited for torch's import: the report says
    that no target ran."""
    print("interrupted while counting GPUs: no target ran")
    if args.report:
        write_report(args.report, [], args.device, args.world_size or 0, 0, stopped.options,
                     True)
    print("streamfuzz: interrupted" + (f"; report in {stopped.shown}" if stopped.shown else ""),
          file=sys.stderr)
    return 130


def _say_interrupted(plan: Plan, saved: list[str]) -> None:
    # A world's report is the controller's temporary file, merged and removed:
    # the controller names the report the user asked for.
    report = plan.run_settings().report if plan.speaks_for_all else None
    print("streamfuzz: interrupted" + (f"; saved {', '.join(saved)}" if saved else "")
          + (f"; report in {report}" if report else ""), file=sys.stderr)


def _fuzz_each(pool: RankPool, plan: Plan, settings: Any, results: list[Any],
               misused: list[str]) -> bool:
    """Fuzz each target in turn, appending to ``results``; True once Ctrl-C ended it.
    A target the ranks find set up wrong is one line on stderr, in ``misused``,
    and the next target runs."""
    from streamfuzz.fuzz import driver
    from streamfuzz.fuzz.worlds import Claims

    run = plan.run_settings()
    claims = Claims(plan.world_of.shared) if plan.world_of is not None else None
    for target in plan.targets:
        name = target.name
        claim, stop = claims.pair(name) if claims is not None else (None, None)
        progress = Progress(name, run.shrink_budget_s, lost=stop)
        try:
            res = driver.fuzz(pool, target, settings, max_examples=run.max_examples,
                              seed=plan.seed, budget_s=run.budget_s,
                              shrink_budget_s=run.shrink_budget_s, corpus_dir=plan.corpus,
                              progress=progress, options=plan.options,
                              strategy=_strategy(target.protocol, plan.world_size,
                                                 run.weight_scale),
                              claim=claim, stop=stop)
        except driver.Interrupted as exc:  # before anything was found in this target
            res = exc.result
        except KeyboardInterrupt:  # outside the examples: nothing ran in this target
            res = driver.CampaignResult(target=name, reason=StopReason.INTERRUPTED)
        except targets.TargetError as exc:
            misused.append(str(exc))
            say_error(exc)
            continue
        finally:
            progress.done()
        results.append(res)
        if claims is None or (res.failure is not None and not res.duplicate):
            _print_result(res)
        if res.interrupted:
            return True
    return False


def _strategy(protocol: str, world: int, scale: int) -> Any:
    """The weight-sync strategy at ``scale``; None (the protocol's default) otherwise."""
    if scale == 1 or protocol != "weight-sync":
        return None
    from streamfuzz.fuzz.weight_sync.strategies import weight_sync_scenarios

    return weight_sync_scenarios(world_size=world, scale=scale)


def _print_result(res: Any) -> None:
    if res.failure is None and res.interrupted:
        print(f"{res.target}: interrupted after {res.examples} examples "
              f"({res.elapsed_s:.1f}s), nothing found so far")
        return
    if res.failure is None:
        cov = res.coverage
        print(f"{res.target}: clean over {res.examples} examples"
              f"{cov.note() if cov else ''} ({res.elapsed_s:.1f}s)")
        unchecked = cov.unchecked() if cov else None
        if unchecked:
            print(f"  {unchecked}")
        return
    flaky = " [flaky: the shrunk case did not fail again]" if res.flaky else ""
    if res.shrink_truncated:
        flaky += " [shrinking stopped at --shrink-budget]"
    if res.interrupted:
        flaky += " [interrupted while shrinking: saved as shrunk so far]"
    print(f"{res.target}: FOUND {res.failure.kind} after {res.first_failure_examples} examples "
          f"({res.first_failure_s:.1f}s){flaky}\n  {res.failure.message}\n"
          f"  {'shrunk so far' if res.interrupted or res.shrink_truncated else 'shrunk'}: "
          f"{res.scenario.describe()}\n"
          f"  saved: {res.corpus_path}")


def _print_table(results: list, device: str, world: int, oracles: list[str]) -> None:
    rows = [("target", "result", "examples", "ex/s", "first failure", "seconds", "corpus")]
    for r in results:
        first = (f"{r.first_failure_examples} ex / {r.first_failure_s:.1f}s"
                 if r.failure else "-")
        result = r.failure.kind if r.failure else "interrupted" if r.interrupted else "clean"
        rows.append((r.target, result, str(r.examples),
                     f"{r.examples_per_s:.1f}", first, f"{r.elapsed_s:.1f}",
                     str(r.corpus_path or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # "clean" means no finding by these: say which judged (on CPU, not reuse).
    print(f"\nstreamfuzz on {device}, world size {world}, judged by {', '.join(oracles)}:")
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def write_report(path: Path, results: list, device: str, world: int, restarts: int,
                  options: RunOptions, interrupted: bool = False,
                  errors: list[str] | None = None,
                  rank_start_s: dict[str, float] | None = None) -> None:
    examples = sum(r.examples for r in results)
    elapsed = sum(r.elapsed_s for r in results)
    report = {
        "target": results[0].target if len(results) == 1 else [r.target for r in results],
        "device": device, "world_size": world, "examples": examples,
        "elapsed_s": round(elapsed, 3),
        "examples_per_s": round(examples / elapsed, 3) if elapsed else 0.0,
        "rank_restarts": restarts, "rank_start_s": dict(rank_start_s or {}),
        **options.to_dict(), "oracles": options.running_on(device), "interrupted": interrupted,
        "failures": [{"target": r.target, "kind": r.failure.kind,
                      "corpus_path": str(r.corpus_path), "message": r.failure.message,
                      "flaky": r.flaky, "shrinking_interrupted": r.interrupted}
                     for r in results if r.failure and not r.duplicate],
        "targets": [{"target": r.target, "examples": r.examples,
                     "elapsed_s": round(r.elapsed_s, 3),
                     "examples_per_s": round(r.examples_per_s, 3),
                     "first_failure_examples": r.first_failure_examples,
                     "first_failure_s": r.first_failure_s,
                     "first_failure_at": r.first_failure_at, "held_by": r.held,
                     "gate_timeouts": r.gate_timeouts,
                     "failure": r.failure.kind if r.failure else None,
                     "corpus_path": str(r.corpus_path) if r.corpus_path else None,
                     "duplicate": r.duplicate,
                     "interrupted": r.interrupted,
                     "stop": r.reason.value if r.reason else None,
                     "stop_text": r.reason.describe() if r.reason else None,
                     "upstream": targets.provenance(r.target),
                     "coverage": r.coverage.to_dict() if r.coverage else None}
                    for r in results],
        "coverage": {r.target: r.coverage.to_dict() for r in results if r.coverage},
        "errors": list(errors or ()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_json_atomic(path, report)
