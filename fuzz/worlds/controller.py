"""The controller: starts N worlds, relays their output and signals, waits
for them, and merges what they found."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from streamfuzz.fuzz import mps
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.plan import Plan, WorldOf
from streamfuzz.fuzz.stop import StopReason, handled
from streamfuzz.fuzz.worlds.child import write_plan

_PACKAGE = __name__.partition(".")[0]
"""The command's package (``streamfuzz``), as ``python -m`` runs it: each world
starts as a user's ``python -m streamfuzz`` would."""


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
        """``per_world(index, shared)`` hands world ``index`` its plan
        (``child.write_plan``) and gives the options it adds to ``argv``, the
        user's command line (none: a world is told only which it is);
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


def _wait(proc: subprocess.Popen[str]) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # relayed by the handler already; keep waiting
            continue


def run_worlds(plan: Plan) -> int:
    """``fuzz run`` by ``plan.worlds`` worlds: each gets its share of
    ``--max-examples``, and its own seed where one is given; the exit status is
    the run's."""
    from streamfuzz.fuzz import worlds_report
    from streamfuzz.fuzz.corpus import write_json_atomic

    count, device, world_size = plan.worlds, plan.device, plan.world_size
    report = plan.run_settings().report
    share = -(-plan.run_settings().max_examples // count)

    def per_world(i: int, shared: Path) -> list[str]:
        run = replace(plan.run_settings(), max_examples=share, report=shared / f"world-{i}.json",
                      requested_device=device)
        write_plan(_world(plan, i, shared, run=run))
        return []

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

    count, device, world_size = plan.worlds, plan.device, plan.world_size
    out = plan.soak_settings().out
    database = plan.soak_settings().database or out / "hypothesis-db"
    dirs = [out / f"world-{i}" for i in range(count)]

    def per_world(i: int, shared: Path) -> list[str]:
        write_plan(_world(plan, i, shared,
                          soak=replace(plan.soak_settings(), out=dirs[i], database=database)))
        return []

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


def _world(plan: Plan, index: int, shared: Path, **settings: Any) -> Plan:
    """World ``index``'s plan: one world, its own seed where one is given, and
    its own part of the campaign (``settings``)."""
    seed = plan.seed + index if plan.seed is not None else None
    return replace(plan, worlds=1, world_of=WorldOf(index, plan.worlds, shared), seed=seed,
                   **settings)


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
