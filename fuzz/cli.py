"""``python -m streamfuzz`` / ``streamfuzz``: run, replay, matrix, bench, soak, mutate, scan.

Exit status: 0 nothing found (or every replayed entry behaves as recorded),
1 a failure was found and saved (or a replay disagreed), 2 bad usage or config,
3 (soak with external ranks) the ranks were lost before the budget was spent,
70 streamfuzz itself crashed (a traceback, not a finding), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from streamfuzz.fuzz import corpus, profiles, targets, upstream
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.__main__ import EXIT_CRASH
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.host import cpu_world_limit, probe_gpus
from streamfuzz.fuzz.options import (
    DEFAULT,
    MUTATE,
    ORACLE_CHOICES,
    Hold,
    OptionsError,
    Oracle,
    RunOptions,
    parse_oracles,
)
from streamfuzz.fuzz.ranks import RankPool


class UsageError(BadInput):
    """Bad usage or configuration: one line, exit status 2."""


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


def _run_options(args: argparse.Namespace, device: str | None = None) -> RunOptions:
    """The options of a run that judges on ``device``: refused (bad input) where
    no oracle can see anything there, a note on stderr for each that cannot."""
    options = RunOptions(oracles=args.oracle, hold=args.hold)
    if device is not None:
        _judging(options, device)
    return options


def _judging(options: RunOptions, device: str) -> None:
    for note in options.judging(device):
        print(f"streamfuzz: {note}", file=sys.stderr)


def _address(text: str) -> tuple[str, int]:
    from streamfuzz.fuzz.host import parse_address

    try:
        return parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _world_of(text: str) -> Any:
    from streamfuzz.fuzz.worlds import WorldOf

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


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="streamfuzz", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                       help="where the ranks run; auto: CUDA where a GPU is visible, "
                            "else the CPU (default auto)")
        q.add_argument("--timeout", type=_seconds, default=60.0,
                       help="seconds one example may take before it is a hang (default 60)")

    r = sub.add_parser("run", help="fuzz targets; shrunk failures go to the corpus",
                       epilog=_targets_epilog())
    _add_target(r, "built-in name, package.module:attr or path/to/file.py:attr; repeatable "
                   "(default: the three versions)")
    common(r)
    r.add_argument("--world-size", type=_positive, default=None,
                   help="ranks (default: 2 on cpu, every GPU on cuda)")
    r.add_argument("--max-examples", type=_positive, default=200,
                   help="examples per target at most, shrinking not counted (default 200)")
    r.add_argument("--budget", type=_seconds, default=None,
                   help="seconds per target at most, shrinking not counted (default: none)")
    r.add_argument("--shrink-budget", type=_seconds, default=120.0,
                   help="seconds of shrinking per failure before the case is saved (default 120)")
    r.add_argument("--seed", type=int, default=None,
                   help="Hypothesis seed, for a repeatable run (default: random)")
    r.add_argument("--weight-scale", type=_positive, default=1,
                   help="weight-sync targets: multiply every parameter's first dimension "
                        "(GPU soaks; default 1: a few KiB an example)")
    r.add_argument("--corpus", type=Path, default=Path("corpus"),
                   help="directory the shrunk failures are saved in (default corpus/)")
    r.add_argument("--report", type=Path, default=None,
                   help="write a JSON report to this file (default: none)")
    r.add_argument("--profile", choices=profiles.PROFILES, default="default",
                   help="Hypothesis settings profile (default: default)")
    _add_run_options(r)
    _add_worlds(r)
    r.add_argument("--upstream", metavar="PATH|VERSION", default=None,
                   help="the vLLM whose own PPHandler the vllm-pp targets run: a wheel, sdist "
                        "or source tree, or a version in the cache (default: an installed "
                        "vllm); alone, it fuzzes vllm-pp and, for 0.30-0.32, vllm-pp-pre-pr")

    k = sub.add_parser("soak", help="a time-budgeted campaign that survives crashes, hangs "
                       "and kills, resumes, and ends with a report and a plot")
    k.add_argument("--budget", type=_duration, required=True,
                   help="total campaign time, e.g. 30s, 10m, 8h (counts earlier starts; "
                        "required)")
    _add_target(k, "targets to rotate over; several after one --target, or repeated "
                   "(default: all built-ins)", nargs="+")
    common(k)
    k.add_argument("--world-size", type=_positive, default=None,
                   help="ranks (default: 2 on cpu, every GPU on cuda)")
    k.add_argument("--out", type=Path, default=Path("soak"),
                   help="campaign directory: journal, state, log, report (default soak/); "
                        "starting again with the same one resumes the campaign")
    k.add_argument("--corpus", type=Path, default=Path("corpus"),
                   help="directory the shrunk failures are saved in (default corpus/)")
    k.add_argument("--database", type=Path, default=None,
                   help="Hypothesis example database, may be shared by several nodes "
                        "(default OUT/hypothesis-db)")
    k.add_argument("--round", type=_duration, default=300.0,
                   help="time per round before the next target (default 5m)")
    k.add_argument("--round-examples", type=_positive, default=2000,
                   help="examples per round at most; bounds the driver's memory (default 2000)")
    k.add_argument("--shrink", type=_duration, default=None,
                   help="time a round may spend shrinking past --round (default: --round)")
    k.add_argument("--stats-every", type=_duration, default=10.0,
                   help="memory and throughput sample period (default 10s)")
    k.add_argument("--recycle-mib", type=_mib, default=32.0,
                   help="replace the ranks once one has grown this many MiB since it warmed "
                        "up, bounding a leak in the libraries they call (default 32; 0: never)")
    k.add_argument("--seed", type=int, default=None,
                   help="Hypothesis seed: repeatable rounds, and no example database "
                        "(default: random, with the database)")
    _add_run_options(k)
    _add_worlds(k)
    k.add_argument("--listen", type=_address, default=None, metavar="HOST:PORT",
                   help="with --ranks-external: where ranks started by torchrun connect "
                        "(default: none, the driver starts its ranks)")
    k.add_argument("--ranks-external", type=_positive, default=None, metavar="N",
                   help="do not start ranks; wait for N ranks launched by torchrun "
                        "(default: none, the driver starts its ranks)")
    k.add_argument("--startup-timeout", type=_duration, default=600.0,
                   help="how long to wait for the ranks to join (default 10m)")

    y = sub.add_parser("replay", help="replay corpus entries as regressions")
    y.add_argument("paths", nargs="+", type=Path,
                   help="corpus entries (*.json) or folders of them, such as corpus/")
    common(y)
    y.add_argument("--attempts", type=_positive, default=3,
                   help="tries for an entry found on a GPU (races need not show at once; "
                        "default 3)")

    b = sub.add_parser("bench", help="throughput vs a hand-written loop, time to first failure")
    b.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="auto: the CPU, and CUDA too where a GPU is visible (default auto)")
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
    b.add_argument("--timeout", type=_seconds, default=60.0,
                   help="seconds one example may take before it is a hang (default 60)")
    b.add_argument("--waiting", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the fuzzer judging each example before drawing the next "
                        "(the 'waiting ex/s' column; as long again as the fuzzer's run; "
                        "default on)")
    b.add_argument("--out", type=Path, default=Path("reports/bench"),
                   help="where the JSON and markdown reports go (default reports/bench)")
    _add_run_options(b)
    m = sub.add_parser("matrix", help="every built-in target x oracle: found or clean")
    m.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the ranks run (default cpu)")
    m.add_argument("--timeout", type=_seconds, default=60.0,
                   help="seconds one example may take before it is a hang (default 60)")
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
    u = sub.add_parser("mutate", help="remove each sync of a target in turn and fuzz it: "
                       "which syncs does the fuzzer catch missing?")
    u.add_argument("--target", required=True, metavar="T",
                   help="built-in name, package.module:attr or path/to/file.py:attr "
                        "(required)")
    u.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="where the mutants run (default cpu)")
    u.add_argument("--timeout", type=_seconds, default=60.0,
                   help="seconds one example may take before it is a hang (default 60)")
    u.add_argument("--world-size", type=_positive, default=None,
                   help="ranks per mutant (default: 2 on cpu, 1 on cuda)")
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
    from streamfuzz.fuzz.scan.command import add_parser as add_scan

    add_scan(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with _terminate_as_interrupt():
            return _command(argv)
    except BadInput as exc:  # usage, target, corpus, options, upstream, ranks' start
        _say_error(exc)
        return 2
    except KeyboardInterrupt:
        print("streamfuzz: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"streamfuzz: crashed (exit {EXIT_CRASH}): a bug in streamfuzz or its "
              "environment, not a finding", file=sys.stderr)
        return EXIT_CRASH


def _say_error(exc: BaseException) -> None:
    """Bad usage or configuration, as the one line on stderr that says it."""
    print(f"streamfuzz: error: {exc}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a job's time limit, ``kill``) is handled as Ctrl-C: what was
    found is saved as shrunk so far and the report written, where the default
    action would end the process at once. ``soak`` installs its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _command(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if getattr(args, "world_of", None) is not None:
        from streamfuzz.fuzz.worlds import end_with_parent

        end_with_parent()
    if args.command == "run":
        return _run(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "matrix":
        from streamfuzz.fuzz import matrix

        device, gpus = _device(args.device)
        return matrix.main(args, device, _world_size(device, gpus, None))
    if args.command == "soak":
        return _soak(args)
    if args.command == "mutate":
        return _mutate(args)
    if args.command == "scan":
        from streamfuzz.fuzz.scan.command import main as scan

        return scan(args)
    return _replay(args)


def _device(requested: str) -> tuple[str, int]:
    gpus = probe_gpus() if requested in ("cuda", "auto") else 0
    if requested == "cuda" and gpus == 0:
        raise UsageError("--device cuda: no CUDA GPU is visible here")
    return ("cuda" if gpus else "cpu"), gpus


def _world_size(device: str, gpus: int, requested: int | None) -> int:
    if device == "cpu":
        size = requested or 2
        _check_cpu_world(size, f"--world-size {size}")
        return size
    size = requested or gpus
    if size > gpus:
        raise UsageError(f"--world-size {size} needs {size} GPUs (one per rank; NCCL refuses "
                         f"two ranks on one GPU) but {gpus} visible")
    return size


def _worlds(args: argparse.Namespace, device: str, world: int) -> int:
    """How many worlds: ``--worlds``, else what the node holds (1 inside a world)."""
    if args.world_of is not None:
        return 1
    if args.worlds is not None:
        if device == "cpu":
            _check_cpu_world(args.worlds * world, f"--worlds {args.worlds} of {world} ranks")
        return int(args.worlds)
    from streamfuzz.fuzz.worlds import default_worlds

    return default_worlds(device, world)[0]


def _check_cpu_world(size: int, what: str) -> None:
    limit, why = cpu_world_limit()
    if size > limit:
        raise UsageError(f"{what}: this machine holds at most {limit} CPU ranks ({why})")


def _check_dir(path: Path, flag: str) -> None:
    """A directory that exists or can be made, and takes a new file; else one
    line, exit 2. Tried for real (root passes any permission check); the
    folders made for the try are removed again, so that a run that writes
    nothing there leaves nothing behind (every writer makes its own folder)."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: exists and is not a directory")
    made = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".streamfuzz-probe.", suffix=".tmp", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: not a writable directory "
                         f"({exc.strerror or exc})") from None
    finally:
        for p in made:  # deepest first; one that another writer filled meanwhile stays
            with contextlib.suppress(OSError):
                p.rmdir()


def _check_file(path: Path, flag: str) -> None:
    """A file that can be written (its folder is made if missing)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    _check_dir(path.parent, flag)


class _Progress:
    """A live line on a terminal, fuzzing then shrinking. Elsewhere (a pipe, a
    log) one line when shrinking starts, so that its minutes are not silence."""

    def __init__(self, target: str, shrink_budget_s: float | None = None,
                 lost: Callable[[], bool] | None = None) -> None:
        self.target = target
        self.lost = lost
        """Whether another world claimed the failure (it shrinks it, not this one)."""
        self.shrink_budget_s = shrink_budget_s
        self.tty = sys.stderr.isatty()
        self.failures = 0
        self.found_at: tuple[int, float] | None = None
        self.last = 0.0

    def __call__(self, examples: int, elapsed: float, failed: int) -> None:
        self.failures += failed
        if failed and self.found_at is None:
            self.found_at = (examples, elapsed)
            if not self.tty and not (self.lost is not None and self.lost()):
                bound = (f", at most {self.shrink_budget_s:g}s"
                         if self.shrink_budget_s is not None else "")
                print(f"[{self.target}] found a failure after {examples} examples; shrinking "
                      f"it{bound} (Ctrl-C saves it as shrunk so far)", file=sys.stderr,
                      flush=True)
        now = time.monotonic()
        if self.tty and now - self.last > 0.2:
            self.last = now
            rate = examples / elapsed if elapsed else 0.0
            if self.found_at is not None:
                n, t = self.found_at
                line = (f"[{self.target}] shrinking: {examples - n} examples tried in "
                        f"{elapsed - t:.0f}s, {self.failures} failing")
            else:
                line = f"[{self.target}] {examples} examples, {rate:.1f}/s, 0 failures"
            sys.stderr.write(f"\r\033[K{line}")
            sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _run(args: argparse.Namespace) -> int:
    names = _with_upstream(args.target, args.upstream)
    for name in names:
        targets.check_importable(name)
    _check_dir(args.corpus, "--corpus")
    if args.report:
        _check_file(args.report, "--report")
    options = _run_options(args)
    if not options.oracles:  # bad input before any work, the GPU count included
        options.judging(args.device)
    try:
        device, gpus = _device(args.device)
    except KeyboardInterrupt:  # the GPU count waits for torch's import: the report says so
        print("interrupted while counting GPUs: no target ran")
        if args.report:
            _write_report(args.report, [], args.device, args.world_size or 0, 0, options, True)
        _say_interrupted(args, [])
        return 130
    world = _world_size(device, gpus, args.world_size)
    _judging(options, device)
    corpus.sweep(args.corpus)
    worlds = _worlds(args, device, world)
    if worlds > 1:
        from streamfuzz.fuzz.worlds import run_worlds

        return run_worlds(args, worlds, device, world)
    settings = profiles.get(args.profile)
    for name in names if args.world_of is None or args.world_of.index == 0 else ():
        up = targets.upstream_of(name)
        if up is not None:
            print(f"{name}: {up.describe()}")
    results: list[Any] = []
    misused: list[str] = []
    start_s: dict[str, float] = {}
    pool = RankPool(world, device, timeout=args.timeout)
    try:
        try:
            pool.start()
            start_s = dict(pool.info[0].setup_s) if pool.info else {}
        except KeyboardInterrupt:  # before any target ran: the report says so
            interrupted = True
            print(f"interrupted while the {world} ranks were starting: no target ran")
        else:
            interrupted = _fuzz_each(pool, names, args, settings, options, world, results,
                                     misused)
    finally:
        pool.close()
    restarts = pool.restarts
    if results and args.world_of is None:  # the controller prints every world's
        _print_table(results, device, world)
    if args.report:
        _write_report(args.report, results, device, world, restarts, options, interrupted,
                      misused, start_s)
    if interrupted:
        _say_interrupted(args, [str(r.corpus_path) for r in results if r.corpus_path])
        return 130
    if misused:
        return 2
    return 1 if any(r.failure and not r.duplicate for r in results) else 0


def _say_interrupted(args: argparse.Namespace, saved: list[str]) -> None:
    print("streamfuzz: interrupted" + (f"; saved {', '.join(saved)}" if saved else "")
          + (f"; report in {args.report}" if args.report else ""), file=sys.stderr)


def _fuzz_each(pool: RankPool, names: list[str], args: argparse.Namespace, settings: Any,
               options: RunOptions, world: int, results: list[Any], misused: list[str]) -> bool:
    """Fuzz each target in turn, appending to ``results``; True once Ctrl-C ended it.
    A target the ranks find set up wrong is one line on stderr, in ``misused``,
    and the next target runs."""
    from streamfuzz.fuzz import driver
    from streamfuzz.fuzz.worlds import Claims

    claims = Claims(args.world_of.shared) if args.world_of is not None else None
    for name in names:
        claim, stop = claims.pair(name) if claims is not None else (None, None)
        progress = _Progress(name, args.shrink_budget, lost=stop)
        try:
            res = driver.fuzz(pool, name, settings, max_examples=args.max_examples,
                              seed=args.seed, budget_s=args.budget,
                              shrink_budget_s=args.shrink_budget, corpus_dir=args.corpus,
                              progress=progress, options=options,
                              strategy=_strategy(name, world, args.weight_scale),
                              claim=claim, stop=stop)
        except driver.Interrupted as exc:  # before anything was found in this target
            res = exc.result
        except KeyboardInterrupt:  # outside the examples: nothing ran in this target
            res = driver.CampaignResult(target=name, interrupted=True)
        except targets.TargetError as exc:
            misused.append(str(exc))
            _say_error(exc)
            continue
        finally:
            progress.done()
        results.append(res)
        if claims is None or (res.failure is not None and not res.duplicate):
            _print_result(res)
        if res.interrupted:
            return True
    return False


def _with_upstream(names: list[str] | None, source: str | None) -> list[str]:
    """Target names with the vLLM family pinned to a version (``vllm-pp@0.32.0``).

    ``--upstream`` names the vLLM; the ranks find it again through
    ``STREAMFUZZ_UPSTREAM``. Without it the family runs an installed vllm.
    """
    bare = [n for n in names or () if (_vllm_family(n) or ("", "v"))[1] is None]
    if source is None and not bare:
        return list(names or targets.VERSIONS)
    up = upstream.resolve(source)
    if up.kind != "installed":
        rest = os.environ.get(upstream.ENV_PATHS)
        os.environ[upstream.ENV_PATHS] = os.pathsep.join(filter(None, [up.path, rest]))
    if not names:
        names = ["vllm-pp"] + (["vllm-pp-pre-pr"] if up.api == "table" else [])
    out = []
    for name in names:
        fam = _vllm_family(name)
        out.append(f"{fam[0]}@{up.version}" if fam and fam[1] is None else name)
    return out


def _vllm_family(name: str) -> tuple[str, str | None] | None:
    """Any family that runs vLLM's code (the draft broadcast's, or the weight sync's)."""
    family, _, version = name.partition("@")
    if family == targets.WEIGHTS_FAMILY:
        return family, version or None
    return targets.upstream_family(name)


def _strategy(name: str, world: int, scale: int) -> Any:
    """The weight-sync strategy at ``scale``; None (the protocol's default) otherwise."""
    if scale == 1 or protocols.of_target(name).name != "weight-sync":
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


def _print_table(results: list, device: str, world: int) -> None:
    rows = [("target", "result", "examples", "ex/s", "first failure", "seconds", "corpus")]
    for r in results:
        first = (f"{r.first_failure_examples} ex / {r.first_failure_s:.1f}s"
                 if r.failure else "-")
        result = r.failure.kind if r.failure else "interrupted" if r.interrupted else "clean"
        rows.append((r.target, result, str(r.examples),
                     f"{r.examples_per_s:.1f}", first, f"{r.elapsed_s:.1f}",
                     str(r.corpus_path or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"\nstreamfuzz on {device}, world size {world}:")
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _write_report(path: Path, results: list, device: str, world: int, restarts: int,
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
                     "upstream": targets.provenance(r.target),
                     "coverage": r.coverage.to_dict() if r.coverage else None}
                    for r in results],
        "coverage": {r.target: r.coverage.to_dict() for r in results if r.coverage},
        "errors": list(errors or ()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_json_atomic(path, report)


def _bench(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import bench

    draft = protocols.get(protocols.DEFAULT)
    names = args.target or [*draft.versions, *draft.mutants]
    for name in names:
        targets.check_importable(name)
        if protocols.of_target(name, targets.load(name) if ":" in name else None) is not draft:
            raise UsageError(f"bench measures the {draft.name} protocol only: {name!r} is a "
                             f"{protocols.of_target(name).name} target")
    gpus = probe_gpus() if args.device in ("cuda", "auto") else 0
    if args.device == "cuda" and gpus == 0:
        raise UsageError("--device cuda: no CUDA GPU is visible here")
    if args.cuda_world_size > max(gpus, 1) and args.device != "cpu":
        raise UsageError(f"--cuda-world-size {args.cuda_world_size}: {gpus} GPU(s) visible")
    devices = {"cpu": ["cpu"], "cuda": ["cuda"], "auto": ["cpu"] + (["cuda"] if gpus else [])}
    report = bench.run(devices[args.device], names, seeds=args.seeds, examples=args.examples,
                       detect_examples=args.detect_examples,
                       random_examples=args.random_examples,
                       oracle_examples=args.oracle_examples,
                       shrink_budget_s=args.shrink_budget, ff_examples=args.ff_examples,
                       ff_budget_s=args.ff_budget, timeout=args.timeout,
                       world_sizes={"cpu": args.cpu_world_size, "cuda": args.cuda_world_size},
                       options=_run_options(args), waiting=args.waiting,
                       log=lambda line: print(line, flush=True),
                       save=lambda partial: bench.write(args.out, partial))
    json_path, md_path = bench.write(args.out, report)
    print(f"\n{md_path.read_text()}\nwrote {json_path} and {md_path}")
    return 0


def _mutate(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import mutate, mutate_report

    try:
        sites = mutate.select(args.target, args.site)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    device, gpus = _device(args.device)
    world = args.world_size or (2 if device == "cpu" else 1)
    _world_size(device, gpus, world)
    options = RunOptions(oracles=args.oracle)
    _judging(options, device)
    try:
        report = mutate.run(args.target, sites, device=device, world_size=world,
                            jobs=args.jobs or mutate.default_jobs(device, gpus, world),
                            max_examples=args.max_examples, seed=args.seed,
                            options=options, timeout=args.timeout,
                            shrink_budget_s=args.shrink_budget, corpus_dir=args.corpus,
                            log=lambda line: print(line, flush=True))
    except mutate.NotClean as exc:
        print(f"streamfuzz: {exc}", file=sys.stderr)
        return 1
    json_path, md_path = mutate_report.write(args.out, report)
    print(f"\n{mutate_report.text(report)}\nwrote {json_path} and {md_path}")
    return 0 if report.complete else 130


def _soak(args: argparse.Namespace) -> int:
    import os

    from streamfuzz.fuzz.soak import Soak, SoakConfig, stop_on_signals
    from streamfuzz.fuzz.worlds import Claims

    names = args.target or list(targets.BUILTIN)
    names = [n for arg in names for n in arg.split(",") if n]
    for name in names:
        targets.check_importable(name)
    _check_dir(args.out, "--out")
    _check_dir(args.corpus, "--corpus")
    if args.database:
        _check_dir(args.database, "--database")
    if (args.listen is None) != (args.ranks_external is None):
        raise UsageError("--listen and --ranks-external go together")
    if args.ranks_external:
        if args.device == "auto":
            raise UsageError("--ranks-external needs --device cpu or cuda (what the ranks use)")
        device, world = args.device, args.ranks_external
    else:
        device, gpus = _device(args.device)
        world = _world_size(device, gpus, args.world_size)
    key = os.environ.get("STREAMFUZZ_AUTHKEY", "")
    try:
        authkey = bytes.fromhex(key) if key else None
    except ValueError:
        raise UsageError("STREAMFUZZ_AUTHKEY must be hex") from None
    worlds = 1 if args.ranks_external else _worlds(args, device, world)
    if worlds > 1:
        from streamfuzz.fuzz.worlds import soak_worlds

        return soak_worlds(args, worlds, device, world)
    cfg = SoakConfig(targets=names, budget_s=args.budget, out=args.out, corpus=args.corpus,
                     database=args.database or args.out / "hypothesis-db", round_s=args.round,
                     shrink_s=args.shrink, round_examples=args.round_examples,
                     stats_every_s=args.stats_every, seed=args.seed,
                     recycle_mib=args.recycle_mib, options=_run_options(args, device),
                     claims=None if args.world_of is None else Claims(args.world_of.shared))
    pool = RankPool(world, device, timeout=args.timeout, startup_timeout=args.startup_timeout,
                    listen=args.listen, authkey=authkey)
    soak = Soak(pool, cfg)
    with stop_on_signals(soak):
        try:
            if args.listen:
                print(f"soak: waiting for {world} ranks on {args.listen[0]}:{args.listen[1]} "
                      f"(torchrun ... -m streamfuzz.fuzz.rank_main)", file=sys.stderr, flush=True)
            pool.start()
            report = soak.run()
        finally:
            pool.close()
    if pool.lost is not None:
        print(f"soak: the external ranks are gone ({pool.lost}); the driver cannot replace "
              "them. Restart them (torchrun --max-restarts does) and start the same soak "
              "command again: it resumes.", file=sys.stderr)
        return 3
    if soak.stop_reason in _STOP_SIGNALS:
        return 130  # interrupted, as for every command; the summary and report are written
    return 1 if report["failures"] else 0


_STOP_SIGNALS = ("SIGINT", "SIGTERM")
"""The stop reasons of a soak that a signal ended (``streamfuzz.fuzz.soak.stop_on_signals``)."""


def _replay(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import driver

    entries = [corpus.load(p) for p in corpus.discover(args.paths)]
    if not entries:
        raise UsageError("no corpus entries (*.json) under the given paths")
    device, gpus = _device(args.device)
    bad = 0
    by_world: dict[tuple[str, int], list[corpus.Entry]] = {}
    for e in entries:
        try:
            targets.check_importable(e.target)
            targets.check_upstream(e.target, e.found_on.get("upstream"))
        except targets.TargetError as exc:
            raise UsageError(f"{e.path}: {exc}") from None
        need = e.device
        if need != "cuda":
            _check_cpu_world(e.scenario.world_size,
                             f"{e.path}: world size {e.scenario.world_size}")
        if need == "cuda" and device != "cuda":
            print(f"{e.path}: skipped (found on cuda; no GPU here)")
            continue
        by_world.setdefault((need, e.scenario.world_size), []).append(e)
    for (dev, world), group in sorted(by_world.items()):
        if dev == "cuda" and world > gpus:
            for e in group:
                print(f"{e.path}: skipped (needs {world} GPUs, {gpus} visible)")
            continue
        with RankPool(world, dev, timeout=args.timeout) as pool:
            for e in group:
                bad += _replay_one(driver, pool, e, args.attempts if dev == "cuda" else 1)
    return 1 if bad else 0


def _available(name: str) -> bool:
    try:
        targets.check_importable(name)
    except targets.TargetError:
        return False
    return True


def _replay_one(driver: Any, pool: RankPool, e: corpus.Entry, attempts: int) -> int:
    v = driver.replay(pool, e, attempts=attempts)
    status = f"still fails ({v.first.kind}: {v.first.message})" if not v.ok else "PASSES"
    wrong = v.ok
    line = f"{e.path}: {e.target} {status}"
    fix = protocols.get(e.protocol).correct
    if targets.is_builtin(e.target) and e.target not in targets.CORRECT:
        fixed = driver.replay(pool, e, target=fix)
        line += f"; {fix} " + ("passes" if fixed.ok else f"FAILS ({fixed.first.message})")
        wrong = wrong or not fixed.ok
    elif targets.upstream_family(e.target) and _available(targets.UPSTREAM_FIXED):
        fixed = driver.replay(pool, e, target=targets.UPSTREAM_FIXED)
        line += f"; {targets.UPSTREAM_FIXED} " + ("passes" if fixed.ok else
                                                  f"FAILS ({fixed.first.message})")
        wrong = wrong or not fixed.ok
    elif v.ok:  # a user's target: its entry records a bug of that code
        line += (": the bug no longer reproduces there. If you fixed it, delete this entry "
                 "(a replay expects every entry of a user's target to fail on it) or keep "
                 "its scenario as a regression test of the fix; if you did not, the failure "
                 "depends on timing or on the machine it was found on")
    print(line)
    return int(wrong)

