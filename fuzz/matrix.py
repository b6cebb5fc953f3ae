"""``python -m fuzz matrix``: every built-in target against every oracle.

A cell is one target fuzzed by one set of oracles (a column) over seeds
0..K-1 with the ``ci`` profile (no database, so the seed alone decides). It shows whether the bug
was found, after how many examples and seconds, and how small the shrunk case
is. The exit status is the CI check: 1 when a column with the lifetime oracle
misses a buggy built-in or a mutant on some seed, or any column flags a
correct target.
The value oracle cannot see stream bugs on CPU (every op runs at once), so its
misses there are reported, not failed.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

from fuzz import driver, profiles, protocols, targets
from fuzz.options import Oracle, RunOptions
from fuzz.ranks import RankPool
from fuzz.scenario import Scenario

DEFAULT_COLUMNS = (frozenset({Oracle.LIFETIME}), frozenset({Oracle.VALUE}))


def column_name(oracles: frozenset[Oracle]) -> str:
    """``all``, or the oracles' names joined by ``+``."""
    if oracles == frozenset(Oracle):
        return "all"
    return "+".join(RunOptions(oracles=oracles).oracle_names()) or "none"


@dataclass
class Cell:
    """One target x column (a set of oracles) over several seeds."""

    target: str
    options: RunOptions
    seeds: int = 0
    world: int = 2
    found: list[str] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    sizes: list[str] = field(default_factory=list)
    total_examples: int = 0
    total_s: float = 0.0

    @property
    def expected_found(self) -> bool:
        if self.world < 2 and self.target in protocols.of_target(self.target).receiver_side:
            return False
        return self.target not in targets.CORRECT

    @property
    def oracle(self) -> str:
        return column_name(self.options.oracles)

    def ok(self) -> bool:
        """Whether this cell passes the CI check (see the module docstring)."""
        if self.target in targets.CORRECT:
            return not self.found
        if not self.expected_found:
            return True
        if not self.options.runs(Oracle.LIFETIME):
            return True
        return len(self.found) == self.seeds


def _size(s: Scenario) -> str:
    short = getattr(s, "short", None)  # a protocol's own one-line size
    if short is not None:
        return short()
    return f"{len(s.steps)} steps/{sum(st.num_reqs for st in s.steps)} reqs"


def run_cell(pool: RankPool, target: str, oracles: frozenset[Oracle], seeds: int,
             max_examples: int) -> Cell:
    """Fuzz ``target`` with ``oracles`` alone, once per seed."""
    cell = Cell(target, RunOptions(oracles=oracles), seeds, pool.world_size)
    settings = profiles.get("ci")
    for seed in range(seeds):
        res = driver.fuzz(pool, target, settings, max_examples=max_examples, seed=seed,
                          options=cell.options)
        cell.total_examples += res.examples
        cell.total_s += res.elapsed_s
        if res.failure is not None:
            cell.found.append(res.failure.kind)
            cell.examples.append(res.first_failure_examples or 0)
            cell.seconds.append(res.first_failure_s or 0.0)
            cell.sizes.append(_size(res.scenario))
    return cell


def _row(c: Cell) -> tuple[str, ...]:
    if c.found:
        kinds = "/".join(sorted(set(c.found)))
        result = f"found {kinds} {len(c.found)}/{c.seeds}"
        ex = f"{statistics.median(c.examples):g} (max {max(c.examples)})"
        secs = f"{statistics.median(c.seconds):.1f} (max {max(c.seconds):.1f})"
        size = min(c.sizes, key=lambda s: tuple(int(x.split()[0]) for x in s.split("/")))
    else:
        result, ex, secs, size = f"clean {c.seeds}/{c.seeds}", "-", "-", "-"
    rate = f"{c.total_examples / c.total_s:.1f}" if c.total_s else "-"
    mark = "" if c.ok() else "  <-- FAIL"
    return (c.target, c.oracle, result + mark, ex, secs, size, rate)


def print_table(cells: list[Cell], device: str, world: int, max_examples: int,
                seeds: int) -> None:
    header = ("target", "oracle", "result (seeds)", "examples to 1st: median",
              "seconds to 1st: median", "smallest shrunk", "ex/s")
    rows = [header] + [_row(c) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print(f"streamfuzz matrix on {device}, world size {world}, "
          f"{max_examples} examples x {seeds} seed(s) per cell:")
    for r in rows:
        print("  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())


def main(args: argparse.Namespace, device: str, world: int) -> int:
    """Run the matrix the CLI asked for; returns the exit status."""
    names = args.target or list(targets.BUILTIN)
    for name in names:
        targets.check_importable(name)
    columns: list[frozenset[Oracle]] = []
    for col in args.oracle or DEFAULT_COLUMNS:
        if col not in columns:
            columns.append(col)
    cells = []
    with RankPool(world, device, timeout=args.timeout) as pool:
        for name in names:
            for col in columns:
                cells.append(run_cell(pool, name, col, args.seeds, args.max_examples))
    print_table(cells, device, world, args.max_examples, args.seeds)
    bad = [c for c in cells if not c.ok()]
    for c in bad:
        why = "flagged a correct target" if not c.expected_found else "missed on some seed"
        print(f"FAIL: {c.target} x {c.oracle}: {why}")
    return 1 if bad else 0
