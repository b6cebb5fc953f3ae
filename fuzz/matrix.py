"""``python -m streamfuzz matrix``: every built-in target against every oracle.

A cell is one target fuzzed by one set of oracles (a column) over seeds
0..K-1 with the ``ci`` profile (no database, so the seed alone decides). It shows whether the bug
was found, after how many examples and seconds, and how small the shrunk case
is. The exit status is the CI check: 1 when a column with the lifetime oracle
misses a target expected to be found on some seed, or any column flags a
target expected clean. Built-ins are expected as they are (the correct ones
clean, the others found); a user's target declares it (``expected = "clean"``
or ``"found"`` on its factory, or ``--expect``), and one that does not is
reported, never failed.
The value oracle cannot see stream bugs on CPU (every op runs at once), so its
misses there are reported, not failed.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz import driver, profiles, targets
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.plan import Plan
from streamfuzz.fuzz.ranks import RankPool

DEFAULT_COLUMNS = (frozenset({Oracle.LIFETIME}), frozenset({Oracle.VALUE}))

EXPECTATIONS = ("clean", "found")
"""What a target may declare it expects of every column: no finding, or one."""


def expectation(name: str, given: dict[str | None, str] | None = None) -> str | None:
    """What ``name`` is expected to be: ``given`` for it (``--expect T=...``),
    else the built-in's own, else its factory's ``expected`` attribute, else
    ``given`` for every user target (``--expect ...``); None: undeclared."""
    given = given or {}
    if name in given:
        return given[name]
    if targets.is_builtin(name):
        return "clean" if name in targets.CORRECT else "found"
    declared = getattr(targets.load(name), "expected", None) if ":" in name else None
    if declared is not None and declared not in EXPECTATIONS:
        raise targets.TargetError(f"target {name!r} declares expected = {declared!r}: "
                                  f"use one of {', '.join(map(repr, EXPECTATIONS))}")
    return declared or given.get(None)


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
    expected: str | None = "found"
    """``clean``, ``found``, or None (undeclared: reported, never failed)."""
    found: list[str] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    sizes: list[str] = field(default_factory=list)
    total_examples: int = 0
    total_s: float = 0.0

    @property
    def expected_found(self) -> bool:
        if self.world < 2 and self.target in targets.protocol_of(self.target).receiver_side:
            return False
        return self.expected == "found"

    @property
    def oracle(self) -> str:
        return column_name(self.options.oracles)

    def ok(self) -> bool:
        """Whether this cell passes the CI check (see the module docstring)."""
        if self.expected is None:
            return True
        if self.expected == "clean":
            return not self.found
        if not self.expected_found:
            return True
        if not self.options.runs(Oracle.LIFETIME):
            return True
        return len(self.found) == self.seeds


def _size(s: Any) -> str:
    short = getattr(s, "short", None)  # a protocol's own one-line size
    if short is not None:
        return short()
    steps = getattr(s, "steps", None)
    if steps is None:
        return s.describe()
    return f"{len(steps)} steps/{sum(st.num_reqs for st in steps)} reqs"


def run_cell(pool: RankPool, target: str, oracles: frozenset[Oracle], seeds: int,
             max_examples: int, expected: str | None = "found") -> Cell:
    """Fuzz ``target`` with ``oracles`` alone, once per seed."""
    cell = Cell(target, RunOptions(oracles=oracles), seeds, pool.world_size, expected)
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
    if c.expected is None:
        mark = "  (no expectation)"
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


def main(plan: Plan) -> int:
    """Run the matrix the CLI asked for; returns the exit status."""
    matrix, device, world = plan.matrix_settings(), plan.device, plan.world_size
    names = plan.names
    given = dict(matrix.expect)
    for name in given:
        if name is not None and name not in names:
            raise targets.TargetError(f"--expect {name}={given[name]}: {name!r} is not one "
                                      "of the --target rows")
    expected = {name: expectation(name, given) for name in names}
    columns: list[frozenset[Oracle]] = []
    for col in matrix.columns or DEFAULT_COLUMNS:
        for note in RunOptions(oracles=col).judging(device):
            print(f"streamfuzz: {note}", file=sys.stderr)
        if col not in columns:
            columns.append(col)
    cells = []
    with RankPool(world, device, timeout=plan.timeout_s) as pool:
        for name in names:
            for col in columns:
                cells.append(run_cell(pool, name, col, matrix.seeds, matrix.max_examples,
                                      expected[name]))
    print_table(cells, device, world, matrix.max_examples, matrix.seeds)
    for name in names:
        if expected[name] is None:
            print(f"note: {name} declares no expectation, so its cells are reported, not "
                  "judged: set expected = \"clean\" (or \"found\") on its factory, or pass "
                  f"--expect {name}=clean")
    bad = [c for c in cells if not c.ok()]
    for c in bad:
        why = ("flagged a target expected clean" if c.expected == "clean"
               else "missed on some seed")
        print(f"FAIL: {c.target} x {c.oracle}: {why}")
    return 1 if bad else 0
