"""Parallel worlds: one campaign run by N independent worlds side by side.

A world is a driver and its ranks, what one ``fuzz run`` or ``fuzz soak``
has. N worlds are N child processes of the same command (``--worlds 1``),
each with its own seed, sharing the example database and the corpus, as
libFuzzer's ``-jobs`` and HypoFuzz's workers do. Worlds of one GPU take turns
on it, so they scale as far as each world leaves it idle: a gate holds its
stream in the GPU's front end and runs nothing (``streamfuzz.fuzz._gate_wait``).

Each target's finding is claimed once (``Claims``): the world that claims it
shrinks and saves it, the others stop that target and go on to the next, so
one bug found by every world at its first example is shrunk and saved once.
The controller prefixes each world's lines with ``[wN]``, forwards Ctrl-C and
SIGTERM to every world (each saves what it found and writes its report), and
merges the reports (``streamfuzz.fuzz.worlds_report``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from streamfuzz.fuzz import env, host, mps
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.plan import Plan, WorldOf
from streamfuzz.fuzz.stop import StopReason, handled

GPU_WORLDS_CAP = 16
"""Worlds on one set of GPUs at most, by default: at 16 the GPU is most of the
time busy (bench/README.md has the curve and the soak)."""

ENV_WORLDS = env.WORLDS
"""The number of worlds where ``--worlds`` is not given: a machine's or a test
suite's own default (a CI runner whose jobs share its cores), never above what
``--worlds`` itself may ask."""

CUDA_WORLD_MIB = 3500
"""GPU memory a world's rank is budgeted on its device, context and NCCL
included (16 worlds peaked at 51 GiB on one H100; bench/README.md)."""

_PACKAGE = __name__.partition(".")[0]
"""The command's package (``streamfuzz``), as ``python -m`` runs it: each world
starts as a user's ``python -m streamfuzz`` would."""


def default_worlds(device: str, world_size: int) -> tuple[int, str]:
    """How many worlds this node holds by default, and why. On CPU a world keeps
    its driver and each of its gloo ranks busy, so a core each. On a GPU node a
    rank spends much of an example waiting for the GPU and a driver less than
    half a core (bench/README.md): a core per rank, as many as the GPUs' free
    memory holds, and at most ``GPU_WORLDS_CAP``."""
    cores = host.cores()
    if device == "cuda":
        n, why = max(1, cores // world_size), f"{cores} cores at one a rank"
        free = host.gpu_free_mib()
        if free is not None and free // CUDA_WORLD_MIB < n:
            n = max(1, int(free // CUDA_WORLD_MIB))
            why = f"{free / 1024:.0f} GiB free on a GPU at {CUDA_WORLD_MIB} MiB a world"
        if n > GPU_WORLDS_CAP:
            n, why = GPU_WORLDS_CAP, why + f", at most {GPU_WORLDS_CAP} on one set of GPUs"
        return n, why
    by_cores = max(1, cores // (world_size + 1))
    limit, why = host.cpu_world_limit()
    n = max(1, min(by_cores, limit // world_size))
    return n, f"{cores} cores at {world_size + 1} processes a world ({why})"


@dataclass(frozen=True)
class Count:
    """How many worlds, and whether the user asked (``--worlds`` or
    ``$STREAMFUZZ_WORLDS``, named by ``why``) or the node's size decided."""

    worlds: int
    why: str
    asked: bool


def how_many(asked: int | None, device: str, world_size: int) -> Count:
    """The worlds of a campaign: ``asked`` (``--worlds``), else
    ``$STREAMFUZZ_WORLDS``, else ``default_worlds``. Decided before the command
    line's parse (``at_start``), so that only a world's driver starts a zygote,
    and after it on the device found; ValueError for a bad variable."""
    if asked is not None:
        return Count(asked, f"--worlds {asked}", True)
    text = env.text(ENV_WORLDS)
    if text.strip():
        if not text.strip().isdigit() or int(text) < 1:
            raise ValueError(f"{ENV_WORLDS}={text!r}: not a number of worlds (an integer "
                             f">= 1); unset it to run as many worlds as the node holds")
        return Count(int(text), f"{ENV_WORLDS}={int(text)}", True)
    return Count(*default_worlds(device, world_size), False)


def at_start(argv: list[str]) -> int:
    """The worlds a raw command line will run, by ``how_many`` on the device and
    world size it will likely get (guessed without torch or CUDA, as the
    zygote's early ranks are): 1 in a world, and where the line cannot tell."""
    from streamfuzz.fuzz import zygote

    if (not argv or argv[0] not in ("run", "soak") or zygote.flag(argv, "--world-of", "")
            or zygote.flag(argv, "--ranks-external", "")):
        return 1
    device = zygote.flag(argv, "--device", "auto")
    if device == "auto":
        device = "cuda" if zygote.listed_gpus() else "cpu"
    try:
        asked = zygote.flag(argv, "--worlds", "")
        size = int(zygote.flag(argv, "--world-size", "0")) or (
            2 if device == "cpu" else max(1, zygote.listed_gpus()))
        return how_many(int(asked) if asked else None, device, size).worlds
    except ValueError:  # refused once parsed, before any work
        return 1


class Claims:
    """First come, first served, across processes: one file per key, made
    with ``O_EXCL`` (atomic on every local file system)."""

    def __init__(self, shared: Path) -> None:
        self._dir = shared / "claims"
        self._dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self._dir / hashlib.blake2b(key.encode(), digest_size=8).hexdigest()

    def take(self, key: str) -> bool:
        """Whether this process is the first to claim ``key``."""
        try:
            os.close(os.open(self._path(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def taken(self, key: str) -> bool:
        return self._path(key).exists()

    def hold(self, key: str, give_up: Callable[[], bool]) -> None:
        """Wait until no other process holds ``key``, then hold it until
        ``release``: a soak's worlds shrink and save one target's failures one
        world at a time, so that no world removes a first sight another saved.
        A holder that died (its pid is gone) holds nothing."""
        path = self._path(key)
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if give_up() or not _alive(path):
                    path.unlink(missing_ok=True)
                    continue
                time.sleep(0.05)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return

    def release(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def pair(self, key: str) -> tuple[Callable[[], bool], Callable[[], bool]]:
        """``claim`` and ``stop`` for ``driver.fuzz``: stop once another
        process claimed ``key`` (never once this one did)."""
        won: list[bool] = []

        def claim() -> bool:
            won.append(self.take(key))
            return won[-1]

        def stop() -> bool:
            return not any(won) and self.taken(key)

        return claim, stop


@dataclass
class World:
    """One child process and what came of it."""

    index: int
    argv: list[str]
    proc: subprocess.Popen[str] | None = None
    rc: int | None = None


class Controller:
    """Starts the worlds, relays their output and signals, waits for them."""

    def __init__(self, argv: list[str], count: int,
                 per_world: Any, env: dict[str, str] | None = None, mps_mode: str = "") -> None:
        """``per_world(index, shared)`` gives the options a world adds to ``argv``;
        ``mps_mode`` is ``auto`` or ``on`` where a private MPS server is wanted
        (``streamfuzz.fuzz.mps.wanted``), else empty."""
        self.shared = Path(tempfile.mkdtemp(prefix="streamfuzz-worlds-"))
        self.worlds = [World(i, [sys.executable, "-m", _PACKAGE, *argv,
                                 *per_world(i, self.shared), "--worlds", "1",
                                 "--world-of", str(WorldOf(i, count, self.shared))])
                       for i in range(count)]
        self._env = env
        self._mps_mode = mps_mode
        self._mps: mps.Server | None = None
        self.gpu_sharing = ""
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self.signals: list[int] = []
        self.started = 0.0
        self.wall_s = 0.0

    def run(self) -> list[int]:
        """Every world's exit status; Ctrl-C and SIGTERM are relayed, not raised."""
        with handled(self._relay):
            return self._run()

    def _run(self) -> list[int]:
        self.started = time.monotonic()
        try:
            self._share_gpu()
            for w in self.worlds:
                if self.signals:  # Ctrl-C or SIGTERM before this world started: it never does
                    w.rc = 130
                    continue
                w.proc = subprocess.Popen(w.argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, bufsize=1,
                                          env=self._env, start_new_session=True)
                for src, dst in ((w.proc.stdout, sys.stdout), (w.proc.stderr, sys.stderr)):
                    t = threading.Thread(target=self._pump, args=(w.index, src, dst),
                                         daemon=True)
                    t.start()
                    self._pumps.append(t)
            for w in self.worlds:
                if w.proc is not None:
                    w.rc = _wait(w.proc)
            for t in self._pumps:
                t.join(timeout=5)
        finally:
            self.wall_s = time.monotonic() - self.started
            for w in self.worlds:  # an error of our own: no world outlives us
                if w.proc is not None and w.proc.poll() is None:
                    w.proc.kill()
            if self._mps is not None:
                self._mps.stop()
        return [w.rc if w.rc is not None else 70 for w in self.worlds]

    def _share_gpu(self) -> None:
        """Start the private MPS server the campaign asked for, if any."""
        if not self._mps_mode:
            return
        server = mps.Server(self.shared)
        try:
            server.start()
        except mps.MpsUnavailable as exc:
            if self._mps_mode == "on":
                raise BadInput(f"--mps on: no MPS server: {exc}") from None
            self.gpu_sharing = f"time slices (no MPS server: {exc})"
        else:
            self._mps, self.gpu_sharing = server, "a private MPS server"
            self._env = {**(self._env or os.environ), **server.env}
        print(f"streamfuzz: the worlds share the GPU by {self.gpu_sharing}", file=sys.stderr,
              flush=True)

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.shared, ignore_errors=True)

    def _relay(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)
        for w in self.worlds:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signum)

    def _pump(self, index: int, src: IO[str] | None, dst: IO[str]) -> None:
        if src is None:
            return
        prefix = f"[w{index}] "
        for line in src:
            with self._lock:
                dst.write(prefix + line.lstrip("\r").replace("\r\033[K", ""))
                dst.flush()


def _alive(path: Path) -> bool:
    """Whether the process that wrote its pid into ``path`` still runs (a
    file too new to hold its pid yet counts as alive)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return True
    if not text:
        return True
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def _wait(proc: subprocess.Popen[str]) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # relayed by the handler already; keep waiting
            continue


def end_with_parent() -> None:
    """In a world: SIGTERM once the controller dies (Linux), so that a killed
    controller leaves no world running; the world saves what it found and stops."""
    if not host.signal_at_parent_death(signal.SIGTERM):
        return
    if os.getppid() == 1:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


# -- the commands -------------------------------------------------------------------
def run_worlds(plan: Plan) -> int:
    """``fuzz run`` by ``plan.worlds`` worlds: each gets its share of
    ``--max-examples``, and its own seed where one is given; the exit status is
    the run's."""
    from streamfuzz.fuzz import worlds_report
    from streamfuzz.fuzz.corpus import write_json_atomic

    count, device, world_size, seed = plan.worlds, plan.device, plan.world_size, plan.seed
    report = plan.run_settings().report
    share = -(-plan.run_settings().max_examples // count)

    def per_world(i: int, shared: Path) -> list[str]:
        extra = ["--device", device, "--max-examples", str(share),
                 "--report", str(shared / f"world-{i}.json")]
        return extra + (["--seed", str(seed + i)] if seed is not None else [])

    _discard_early_ranks()
    print(f"streamfuzz: {count} worlds of {world_size} {device} rank(s), "
          f"{share} examples each at most", file=sys.stderr, flush=True)
    ctl = Controller(list(plan.argv), count, per_world, mps_mode=_mps_mode(plan))
    try:
        exits = ctl.run()
        reports = [worlds_report.read(ctl.shared / f"world-{i}.json") for i in range(count)]
        merged = worlds_report.merge_run(reports, exits, ctl.wall_s, ctl.gpu_sharing or None)
        print("\n" + "\n".join(worlds_report.run_table(merged)))
        if report:
            report.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(report, merged)
    finally:
        ctl.cleanup()
    status = _status(exits, ctl.signals, bool(merged["failures"]))
    if status == 130:
        print("streamfuzz: interrupted" + (f"; report in {report}" if report else ""),
              file=sys.stderr)
    return status


def soak_worlds(plan: Plan) -> int:
    """``fuzz soak`` by ``count`` worlds, each in ``OUT/world-N`` (a campaign
    started again with the same ``--out`` resumes each), sharing the database
    and the corpus; the merged report is ``OUT/report.*``."""
    from streamfuzz.fuzz import soak_report, worlds_report

    count, device, world_size, seed = plan.worlds, plan.device, plan.world_size, plan.seed
    out = plan.soak_settings().out
    database = plan.soak_settings().database or out / "hypothesis-db"
    dirs = [out / f"world-{i}" for i in range(count)]

    def per_world(i: int, shared: Path) -> list[str]:
        extra = ["--device", device, "--out", str(dirs[i]), "--database", str(database)]
        return extra + (["--seed", str(seed + i)] if seed is not None else [])

    print(f"soak: {count} worlds of {world_size} {device} rank(s) -> {out}/world-*",
          file=sys.stderr, flush=True)
    ctl = Controller(list(plan.argv), count, per_world, mps_mode=_mps_mode(plan))
    try:
        exits = ctl.run()
    finally:
        ctl.cleanup()
    stop = StopReason(signal.Signals(ctl.signals[0]).name) if ctl.signals else None
    try:
        rep = worlds_report.merge_soak(out, dirs, exits, stop, ctl.gpu_sharing or None)
    except RuntimeError as exc:
        print(f"soak: {exc}; see {out}/world-*/soak.log", file=sys.stderr)
        return 70
    rates = ", ".join(f"w{w['world']} {w['examples_per_s']:.1f}/s" for w in rep["worlds"])
    memory = soak_report.memory_text(rep).partition(" (")[0]
    print(f"soak: {soak_report.per_target_text(rep)}", file=sys.stderr)
    print(f"soak: {count} worlds: {rep['examples']} examples, {rep['examples_per_s']:.1f}/s "
          f"in total ({rates}); {len(rep['distinct_failures'])} distinct failures; "
          f"{soak_report.ran_text(rep)}; memory {memory}; "
          f"report in {out}/report.md", file=sys.stderr)
    return _status(exits, ctl.signals, bool(rep["failures"]))


def _mps_mode(plan: Plan) -> str:
    mode = plan.mps
    return mode if mps.wanted(mode, plan.device, plan.worlds, plan.world_size) else ""


def _status(exits: list[int], signals: list[int], found: bool) -> int:
    """The campaign's exit status out of its worlds': a signal or an
    interrupted world is 130, bad usage 2, a world that crashed 70."""
    if signals or 130 in exits:
        return 130
    if 2 in exits:
        return 2
    if any(rc not in (0, 1) for rc in exits):
        return 70
    return 1 if found or 1 in exits else 0


def _discard_early_ranks() -> None:
    """End a zygote started where the start guessed one world wrongly (a
    device guessed from the driver's GPU list that torch cannot use): the
    ranks are the worlds' to start. ``at_start`` starts none otherwise."""
    from streamfuzz.fuzz import zygote

    zygote.discard()
