"""The command line's grammar: every command's options, and the types that
refuse bad values with one line before any work is done."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from streamfuzz.fuzz import mps, profiles, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.options import (
    DEFAULT,
    MUTATE,
    ORACLE_CHOICES,
    Hold,
    OptionsError,
    Oracle,
    parse_oracles,
)

DESCRIPTION = "Property-based fuzzing of cross-stream tensor lifetimes in PyTorch distributed code"

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise UsageError(f"{message} (see --help)")


def _number(text: str, parse: Callable[[str], Any], what: str, ok: Callable[[Any], bool],
            rule: str) -> Any:
    """An option's number, or the one line that says what it must be."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
    return value


def _positive(text: str) -> int:
    return _number(text, int, "an integer", lambda v: v >= 1, ">= 1")


def _seconds(text: str) -> float:
    return _number(text, float, "a number of seconds", lambda v: v > 0, "> 0")


MAX_WAIT_S = 86400.0
"""The longest wait on the ranks (``--timeout``, ``--startup-timeout``): the
system's waits count milliseconds in 32 bits (24.8 days), and ``--timeout 1e9``
crashed in one; a day is already no limit."""

MAX_WEIGHT_SCALE = 65536
"""``--weight-scale`` at most: a parameter's first dimension is up to 16 times
it, so an example's parameters reach 384 MiB a rank here; far beyond, the ranks
run out of memory, and that was saved as a crash of the target."""


def _wait(text: str) -> float:
    return _number(text, float, "a number of seconds", lambda v: 0 < v <= MAX_WAIT_S,
                   f"> 0 and at most {MAX_WAIT_S:g} (a day)")


def _wait_duration(text: str) -> float:
    value = _duration(text)
    if value > MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most a day ({MAX_WAIT_S:g}s)")
    return value


def _scale(text: str) -> int:
    return _number(text, int, "an integer", lambda v: 1 <= v <= MAX_WEIGHT_SCALE,
                   f"in 1..{MAX_WEIGHT_SCALE}")


def _mib(text: str) -> float:
    return _number(text, float, "a number of MiB", lambda v: v >= 0, ">= 0")


def _duration(text: str) -> float:
    from streamfuzz.fuzz.soak import parse_budget

    try:
        return parse_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _oracles(text: str) -> frozenset[Oracle]:
    try:
        return parse_oracles(text)
    except OptionsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _expect(text: str) -> tuple[str | None, str]:
    """``--expect [TARGET=]clean|found``: (the target, or None for every user target, what)."""
    from streamfuzz.fuzz.matrix import EXPECTATIONS

    name, _, what = text.rpartition("=")
    if what not in EXPECTATIONS:
        raise argparse.ArgumentTypeError(f"{text!r}: use clean, found, TARGET=clean or "
                                         "TARGET=found")
    return (name or None), what


class _OldSpelling(argparse.Action):
    """An option's old name: still works, with a warning naming the new one."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"streamfuzz: warning: {option_string} is now {self.new}; the old spelling "
              "still works, for now", file=sys.stderr)
        items = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, items + (values if isinstance(values, list) else [values]))


def _add_target(q: argparse.ArgumentParser, help: str, nargs: str | None = None) -> None:
    """``--target``, the one name of the target option in every command, and
    ``--targets``, its old spelling in soak, kept as an alias that warns."""
    q.add_argument("--target", dest="target", action="extend" if nargs else "append",
                   nargs=nargs, metavar="T", help=help)
    q.add_argument("--targets", dest="target", action=_OldSpelling, new="--target",
                   nargs="+", metavar="T", help=argparse.SUPPRESS)


def _targets_epilog() -> str:
    """Every built-in target and family, as ``run --help`` lists them."""
    others = [p for p in protocols.all_protocols().values()
              if p.name != protocols.DEFAULT]
    return ("built-in targets: the versions "
            f"{', '.join(targets.VERSIONS)}; the mutants {', '.join(targets.MUTANTS)}; the "
            f"correct variants {', '.join(targets.VARIANTS)}"
            + "".join(f"; {p.name}: {', '.join(p.targets)}" for p in others)
            + "; vLLM's own code: "
            + ", ".join(f"{f}@VERSION" for p in protocols.all_protocols().values()
                        for f in p.families))


def _add_run_options(q: argparse.ArgumentParser) -> None:
    """``--oracle`` and ``--hold``: what every rank is asked to do (``RunOptions``)."""
    q.add_argument("--hold", choices=[h.value for h in Hold], default=DEFAULT.hold.value,
                   help="how delays that name a point hold a stream: a gate kernel opened "
                        "at that point (falls back to spins where no gate kernel loads) or a spin "
                        f"(default {DEFAULT.hold.value})")
    q.add_argument("--oracle", type=_oracles, default=DEFAULT.oracles, metavar="O[,O]",
                   help=f"which oracles judge each example: {', '.join(ORACLE_CHOICES)} "
                        "(default all; reuse watches the CUDA allocator and does nothing "
                        "on CPU)")


def _address(text: str) -> tuple[str, int]:
    from streamfuzz.fuzz.host import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _world_of(text: str) -> Any:
    from streamfuzz.fuzz.plan import WorldOf

    try:
        return WorldOf.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_worlds(q: argparse.ArgumentParser) -> None:
    q.add_argument("--worlds", type=_positive, default=None, metavar="N",
                   help="independent worlds side by side, each its own driver and ranks, "
                        "sharing the example database and the corpus (default: as many as "
                        "the node holds; several share one GPU)")
    q.add_argument("--world-of", type=_world_of, default=None, help=argparse.SUPPRESS)
    q.add_argument("--mps", choices=mps.MODES, default=mps.DEFAULT_MODE,
                   help="worlds of one rank sharing a GPU run under a private MPS server, "
                        "started for the campaign and stopped with it; auto: where the "
                        "control program is found and no MPS runs already, else the GPU "
                        "is time-sliced; on: that or an error. Under MPS a device fault in "
                        "one world ends every world's ranks (default off)")


DEVICES = ("cpu", "cuda", "auto")


def _common(q: argparse.ArgumentParser, device: str = "auto", device_help: str | None = None,
            ) -> None:
    """``--device`` and ``--timeout``, declared once for every command that
    starts ranks; ``device``: the command's default."""
    q.add_argument("--device", choices=DEVICES, default=device,
                   help=device_help or "where the ranks run; auto: CUDA where a GPU is "
                                       "visible, else the CPU (default auto)")
    q.add_argument("--timeout", type=_wait, default=60.0,
                   help="seconds one example may take before it is a hang (default 60; "
                        "at most a day)")


def _world_size(q: argparse.ArgumentParser,
                help: str = "ranks (default: 2 on cpu, every GPU on cuda)") -> None:
    q.add_argument("--world-size", type=_positive, default=None, help=help)


def _campaign_options(q: argparse.ArgumentParser, seed_help: str) -> None:
    """What ``run`` and ``soak`` share: the world, where failures go, the
    seed, what every rank is asked (``--oracle``, ``--hold``) and the worlds."""
    _world_size(q)
    q.add_argument("--corpus", type=Path, default=Path("corpus"),
                   help="directory the shrunk failures are saved in (default corpus/)")
    q.add_argument("--seed", type=int, default=None, help=seed_help)
    _add_run_options(q)
    _add_worlds(q)



def _run_parser(sub: Any) -> None:
    """``run``."""
    r = sub.add_parser("run", help="fuzz targets; shrunk failures go to the corpus",
                       epilog=_targets_epilog())
    _add_target(r, "built-in name, package.module:attr or path/to/file.py:attr; repeatable "
                   "(default: the three versions)")
    _common(r)
    _campaign_options(r, "Hypothesis seed, for a repeatable run (default: random)")
    r.add_argument("--max-examples", type=_positive, default=200,
                   help="examples per target at most, shrinking not counted (default 200)")
    r.add_argument("--budget", type=_seconds, default=None,
                   help="seconds per target at most, shrinking not counted (default: none)")
    r.add_argument("--shrink-budget", type=_seconds, default=120.0,
                   help="seconds of shrinking per failure before the case is saved (default 120)")
    r.add_argument("--weight-scale", type=_scale, default=1,
                   help="weight-sync targets: multiply every parameter's first dimension "
                        f"(GPU soaks; default 1: a few KiB an example; at most "
                        f"{MAX_WEIGHT_SCALE})")
    r.add_argument("--report", type=Path, default=None,
                   help="write a JSON report to this file (default: none)")
    r.add_argument("--profile", choices=profiles.PROFILES, default="default",
                   help="Hypothesis settings profile (default: default)")
    r.add_argument("--upstream", metavar="PATH|VERSION", default=None,
                   help="the vLLM whose own PPHandler the vllm-pp targets run: a wheel, sdist "
                        "or source tree, or a version in the cache (default: an installed "
                        "vllm); alone, it fuzzes vllm-pp and, for 0.30-0.32, vllm-pp-pre-pr")


def _soak_parser(sub: Any) -> None:
    """``soak``."""
    k = sub.add_parser("soak", help="a time-budgeted campaign that survives crashes, hangs "
                       "and kills, resumes, and ends with a report and a plot")
    k.add_argument("--budget", type=_duration, required=True,
                   help="total campaign time, e.g. 30s, 10m, 8h (counts earlier starts; "
                        "required)")
    _add_target(k, "targets to rotate over; several after one --target, or repeated "
                   "(default: all built-ins)", nargs="+")
    _common(k)
    _campaign_options(k, "Hypothesis seed: repeatable rounds, and no example database "
                         "(default: random, with the database)")
    k.add_argument("--out", type=Path, default=Path("soak"),
                   help="campaign directory: journal, state, log, report (default soak/); "
                        "starting again with the same one resumes the campaign")
    k.add_argument("--database", type=Path, default=None,
                   help="Hypothesis example database, may be shared by several nodes "
                        "(default OUT/hypothesis-db)")
    k.add_argument("--round", type=_duration, default=300.0,
                   help="time per round before the next target, at most the budget's "
                        "share per target (default 5m)")
    k.add_argument("--round-examples", type=_positive, default=2000,
                   help="examples per round at most; bounds the driver's memory (default 2000)")
    k.add_argument("--shrink", type=_duration, default=None,
                   help="time a round may spend shrinking past --round (default: --round)")
    k.add_argument("--stats-every", type=_duration, default=10.0,
                   help="memory and throughput sample period (default 10s)")
    k.add_argument("--recycle-mib", type=_mib, default=32.0,
                   help="replace the ranks once one has grown this many MiB since it warmed "
                        "up, bounding a leak in the libraries they call (default 32; 0: never)")
    k.add_argument("--listen", type=_address, default=None, metavar="HOST:PORT",
                   help="with --ranks-external: where ranks started by torchrun connect "
                        "(default: none, the driver starts its ranks)")
    k.add_argument("--ranks-external", type=_positive, default=None, metavar="N",
                   help="do not start ranks; wait for N ranks launched by torchrun "
                        "(default: none, the driver starts its ranks)")
    k.add_argument("--startup-timeout", type=_wait_duration, default=600.0,
                   help="how long to wait for the ranks to join (default 10m; at most a day)")


def _replay_parser(sub: Any) -> None:
    """``replay``."""
    y = sub.add_parser("replay", help="replay corpus entries as regressions")
    y.add_argument("paths", nargs="+", type=Path,
                   help="corpus entries (*.json) or folders of them, such as corpus/")
    _common(y)
    y.add_argument("--attempts", type=_positive, default=3,
                   help="tries for an entry found on a GPU (races need not show at once; "
                        "default 3)")


def _bench_parser(sub: Any) -> None:
    """``bench``."""
    b = sub.add_parser("bench", help="throughput vs a hand-written loop, time to first failure")
    _common(b, device_help="auto: the CPU, and CUDA too where a GPU is visible "
                           "(default auto)")
    _add_target(b, "repeatable; bench measures the draft broadcast only (default: its "
                   "built-ins)")
    b.add_argument("--seeds", type=_positive, default=5,
                   help="seeds per target (default 5)")
    b.add_argument("--examples", type=_positive, default=200,
                   help="examples for throughput (fuzzer and loop each; default 200)")
    b.add_argument("--detect-examples", type=_positive, default=200,
                   help="examples for each gate-vs-spin detection rate (default 200)")
    b.add_argument("--random-examples", type=_positive, default=100,
                   help="random scenarios (no Hypothesis) for the detection rates "
                        "(default 100)")
    b.add_argument("--oracle-examples", type=_positive, default=50,
                   help="examples the oracle costs are measured on (default 50)")
    b.add_argument("--shrink-budget", type=_seconds, default=30.0,
                   help="most seconds of shrinking timed (first seed; default 30)")
    b.add_argument("--ff-examples", type=_positive, default=1000,
                   help="most examples per seed when looking for the first failure "
                        "(default 1000)")
    b.add_argument("--ff-budget", type=_seconds, default=60.0,
                   help="most seconds per seed when looking for the first failure "
                        "(default 60)")
    b.add_argument("--cpu-world-size", type=_positive, default=2,
                   help="ranks on the CPU (default 2)")
    b.add_argument("--cuda-world-size", type=_positive, default=1,
                   help="ranks on CUDA, one GPU each (default 1)")
    b.add_argument("--waiting", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the fuzzer judging each example before drawing the next "
                        "(the 'waiting ex/s' column; as long again as the fuzzer's run; "
                        "default on)")
    b.add_argument("--out", type=Path, default=Path("reports/bench"),
                   help="where the JSON and markdown reports go (default reports/bench)")
    _add_run_options(b)


def _matrix_parser(sub: Any) -> None:
    """``matrix``."""
    m = sub.add_parser("matrix", help="every built-in target x oracle: found or clean")
    _common(m, device="cpu", device_help="where the ranks run (default cpu)")
    m.add_argument("--max-examples", type=_positive, default=200,
                   help="examples per cell and seed at most (default 200)")
    m.add_argument("--seeds", type=_positive, default=1,
                   help="seeds 0..K-1 per cell (default 1)")
    m.add_argument("--oracle", type=_oracles, action="append", metavar="O[,O]",
                   help="a column: the oracles that judge it, as for run; repeatable "
                        "(default: a lifetime column and a value column)")
    _add_target(m, "rows; repeatable (default: every protocol's built-ins)")
    m.add_argument("--expect", type=_expect, action="append", metavar="[T=]clean|found",
                   help="what a user target is expected to be in every column: T=clean for "
                        "one row; clean alone for every user target that declares nothing "
                        "itself; repeatable (default: a built-in's own, else the factory's "
                        "expected attribute, else none: reported, never failed)")


def _mutate_parser(sub: Any) -> None:
    """``mutate``."""
    u = sub.add_parser("mutate", help="remove each sync of a target in turn and fuzz it: "
                       "which syncs does the fuzzer catch missing?")
    u.add_argument("--target", required=True, metavar="T",
                   help="built-in name, package.module:attr or path/to/file.py:attr "
                        "(required)")
    _common(u, device="cpu", device_help="where the mutants run (default cpu)")
    _world_size(u, "ranks per mutant (default: 2 on cpu, 1 on cuda)")
    u.add_argument("--max-examples", type=_positive, default=200,
                   help="examples per mutant, and for the original (default 200)")
    u.add_argument("--seed", type=int, default=0,
                   help="Hypothesis seed of every mutant's run (default 0)")
    u.add_argument("--jobs", type=_positive, default=None,
                   help="mutants fuzzed at once, one rank pool each (default: CPU cores "
                        "per world on cpu, GPUs per world on cuda)")
    u.add_argument("--oracle", type=_oracles, default=MUTATE.oracles, metavar="O[,O]",
                   help=f"{', '.join(ORACLE_CHOICES)} or a list (default lifetime; all "
                        "adds reuse on cuda)")
    u.add_argument("--site", type=_positive, action="append", metavar="LINE",
                   help="only the site(s) on this line; repeatable (default: every site)")
    u.add_argument("--shrink-budget", type=_seconds, default=30.0,
                   help="seconds of shrinking per caught mutant (default 30)")
    u.add_argument("--corpus", type=Path, default=None,
                   help="keep the shrunk cases of caught mutants here (default: not kept)")
    u.add_argument("--out", type=Path, default=Path("reports/mutate"),
                   help="where TARGET.json and TARGET.md go (default reports/mutate)")


def parser() -> argparse.ArgumentParser:
    """Every command's options."""
    p = _Parser(prog="streamfuzz", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_run_parser, _soak_parser, _replay_parser, _bench_parser, _matrix_parser,
                _mutate_parser):
        add(sub)
    from streamfuzz.fuzz.commands.check import add_parser as add_check
    from streamfuzz.fuzz.scan.command import add_parser as add_scan

    add_scan(sub)
    add_check(sub)
    return p
