"""Ranks forked from one process that has imported torch once.

A rank's cold start is mostly ``import torch``. Spawned, every rank pays it at
once, each on a core of its own or, on a small host, fighting the others and
the driver for one. A zygote (``python -m streamfuzz.fuzz.zygote.serve``) imports torch
and the rank's modules once, before any thread or device exists, then forks each rank
on request: the ranks of a world start together, a replacement world starts
in milliseconds, and ``python -m streamfuzz run`` starts its zygote before its own
imports, so the two overlap.

CUDA ranks are forked too, as long as the zygote itself never touches CUDA (a
process that has cannot fork one that uses it): it counts GPUs through NVML,
as torch's own fork-safe check does, and each forked rank starts CUDA for
itself. Where NVML cannot count, the zygote counts through CUDA, says so, and
ends once it has seen a GPU. Anything wrong with the zygote (it cannot start,
dies, or does not answer) makes the pool spawn its ranks instead;
``STREAMFUZZ_ZYGOTE=0`` always does.

A ``run`` that will likely use GPUs has its first world start early: the
zygote forks one rank per device before its own imports, and each starts its
device's context and NCCL's once-a-process start in a thread while it imports
torch, so that both are off the path to the first example
(``STREAMFUZZ_EARLY_CUDA=0`` forks them after the imports instead, as every
later world is; ``=context`` leaves NCCL's start to the process group).

The driver side imports no torch. Requests and replies are JSON lines on the
zygote's stdin and stdout: ``{"env", "cwd", "log"}`` in, ``{"ready"}`` once,
``{"pid"}`` per fork, ``{"gpus", "forks"}`` per probe and ``{"exit", "code"}``
per rank that ended (the zygote is the ranks' parent, so it reaps them and
says how each ended).

This module is the driver's side. The zygote process is ``streamfuzz.fuzz.zygote.serve``,
its early ranks ``streamfuzz.fuzz.zygote.early``, and what a forked child does to become a
rank ``streamfuzz.fuzz.zygote.child``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from streamfuzz.fuzz import ROOT
from streamfuzz.fuzz import env as variables
from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.host import count_gpus_with

if TYPE_CHECKING:  # the driver imports this first thing: only what it must
    from pathlib import Path
    from typing import Any

ENV = variables.ZYGOTE
"""Set to 0 to spawn every rank (the zygote's off switch)."""

EARLY_ENV = variables.EARLY_CUDA
"""Set to 0 to fork every CUDA rank from the zygote (early ranks' off switch),
to ``context`` to have early ranks start CUDA's context but not NCCL."""


class ZygoteError(FuzzError, RuntimeError):
    """The zygote cannot fork a rank now; the caller spawns one instead."""


def enabled() -> bool:
    """Fork ranks? Not where it is switched off, nor off Linux (fork, /proc)."""
    return variables.text(ENV, "1") != "0" and sys.platform.startswith("linux")


class Zygote:
    """The driver's handle on one zygote process (started at once, ready later)."""

    def __init__(self, env: dict[str, str], log: Path | None = None,
                 cuda_ranks: int = 0) -> None:
        """``env``: what the zygote imports under (the ranks get their own at fork);
        ``cuda_ranks``: CUDA ranks to start early, one per device from 0."""
        env = _own_env(env)
        self.env_key = _key(env)
        err = open(log, "wb") if log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamfuzz.fuzz.zygote.serve", str(cuda_ranks)], env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        finally:
            if not isinstance(err, int):  # the log file, not DEVNULL
                err.close()
        self._buf = b""
        self._ready = False
        self.codes: dict[int, int] = {}
        self.broken: str | None = None
        self.forks = True
        """False once the zygote has touched CUDA: it cannot fork a rank then."""

    def fork(self, env: dict[str, str], log: Path, timeout: float) -> ForkedRank:
        """One rank with ``env``, output to ``log``; waits up to ``timeout`` for
        the zygote to be ready. Raises ZygoteError when it cannot."""
        if not self.forks:
            raise ZygoteError("the zygote has touched CUDA")
        request = {"env": env, "cwd": os.getcwd(), "log": str(log)}
        return ForkedRank(self, self.ask(request, "pid", timeout))

    def ask(self, request: dict[str, Any], key: str, timeout: float) -> Any:
        """Send ``request``; the answer's ``key``, within ``timeout`` or ZygoteError."""
        if self.broken:
            raise ZygoteError(self.broken)
        deadline = time.monotonic() + timeout
        stdin = self.proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        try:
            stdin.write(json.dumps(request).encode() + b"\n")
            stdin.flush()
        except OSError as exc:
            self._break(f"the zygote is gone ({exc})")
        while True:
            for msg in self._read(max(0.0, deadline - time.monotonic())):
                if key in msg:
                    return msg[key]
            if self.broken:
                self._break(self.broken)
            if time.monotonic() >= deadline:
                self._break(f"the zygote did not answer within {timeout:.0f}s")

    def _break(self, why: str) -> None:
        self.broken = why
        self.close()
        raise ZygoteError(why)

    def _read(self, timeout: float) -> list[dict[str, Any]]:
        """The messages that arrive within ``timeout`` (exit codes recorded)."""
        if self.proc.stdout is None or self.proc.stdout.closed:
            return []
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return []
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.broken = self.broken or "the zygote exited"
            self.proc.stdout.close()
            return []
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours: something the zygote's imports printed
            if "exit" in msg:
                self.codes[msg["exit"]] = msg["code"]
            else:
                self.forks = self.forks and msg.get("forks", True)
                out.append(msg)
        return out

    def reap(self, timeout: float = 0.0) -> None:
        """Take in what the zygote has said so far (at most ``timeout`` waiting)."""
        self._read(timeout)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and not (self.proc.stdout is None
                                                 or self.proc.stdout.closed)

    def close(self) -> None:
        """End the zygote (ranks it forked die with it)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                try:
                    f.close()
                except OSError:
                    pass


def _own_env(env: dict[str, str]) -> dict[str, str]:
    env = dict(env, PYTHONUNBUFFERED="1", **{variables.PARENT: str(os.getpid())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def _key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What imports may depend on: the environment less streamfuzz's own
    variables, which a rank reads when it runs (each rank gets its own)."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(variables.PREFIX)))


class ForkedRank:
    """A forked rank, seen as the pool sees a ``subprocess.Popen``: ``pid``,
    ``returncode``, ``poll()``, ``wait(timeout)``, ``kill()``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self, timeout: float = 0.0) -> int | None:
        if self.returncode is None:
            self.zygote.reap(timeout)
            code = self.zygote.codes.get(self.pid)
            if code is None and not self.zygote.alive and not _exists(self.pid):
                code = -signal.SIGKILL  # it died with its zygote
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
            self.poll(left)
        return code

    def kill(self) -> None:
        if self.poll() is not None:  # reaped: the pid may be another process's now
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie no longer does: an orphan's reaper
    need not reap it at once, or ever, in a container without an init)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


_early: Zygote | None = None


def prestart(argv: list[str]) -> None:
    """Start a zygote now for a ``run``, before the driver's own imports; it
    answers the GPU probe, and the first pool of that environment adopts it.
    Called only for a run of one world (``streamfuzz.fuzz.worlds.at_start``):
    the controller of several starts no rank of its own."""
    global _early
    if not enabled() or not argv or argv[0] != "run" or "-h" in argv or "--help" in argv:
        return
    try:
        _early = Zygote(dict(os.environ), cuda_ranks=_cuda_ranks(argv))
    except OSError:
        _early = None
    else:
        import atexit

        atexit.register(_discard)
        count_gpus_with(early_gpus)


def _cuda_ranks(argv: list[str]) -> int:
    """The CUDA ranks a ``run`` will likely start, guessed without CUDA or torch:
    its ``--world-size``, else the GPUs the driver lists. 0 where it runs on
    the CPU or early ranks are switched off. A guess too high costs a rank
    started and ended; the world is what the driver decides."""
    if variables.text(EARLY_ENV, "1") == "0" or flag(argv, "--device", "auto") == "cpu":
        return 0
    gpus = listed_gpus()
    try:
        size = int(flag(argv, "--world-size", "0"))
    except ValueError:
        size = 0
    return min(size, gpus) if size > 0 else gpus


def listed_gpus() -> int:
    """The GPUs the NVIDIA driver lists, as many as ``CUDA_VISIBLE_DEVICES``
    leaves visible: counted without CUDA or torch, before either is imported."""
    try:
        gpus = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # CUDA reads it up to the first entry it cannot use
        listed = [v.strip() for v in visible.split(",")]
        gpus = min(gpus, next((i for i, v in enumerate(listed) if not v or v.startswith("-")),
                              len(listed)))
    return gpus


def flag(argv: list[str], name: str, default: str) -> str:
    """The value of ``name`` in a raw command line (``--name V`` or
    ``--name=V``, the last one given): what is known before the parse."""
    value = default
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def early_gpus(timeout: float = 120.0) -> int | None:
    """GPUs visible, counted by the prestarted zygote (it has imported torch
    already); None without one. A zygote that had to touch CUDA to count them
    forks nothing more: it is ended."""
    global _early
    z = _early
    if z is None:
        return None
    try:
        gpus = z.ask({"probe": True}, "gpus", timeout)
    except ZygoteError:
        gpus = None
    if gpus is None or not z.forks:
        _early = None
        z.close()
    return gpus


def adopt(env: dict[str, str]) -> Zygote | None:
    """The prestarted zygote, when it imported under ``env`` (else it is ended)."""
    global _early
    z, _early = _early, None
    if z is None:
        return None
    if _key(_own_env(env)) != z.env_key or not z.alive:
        z.close()
        return None
    return z


def discard() -> None:
    """End the prestarted zygote unused (a command whose ranks run elsewhere)."""
    _discard()


def _discard() -> None:
    global _early
    if _early is not None:
        _early.close()
        _early = None
