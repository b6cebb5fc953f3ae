"""A private MPS server for the worlds that share one GPU.

Without MPS, processes on one GPU take turns on it in time slices: a world
whose stream is held at a gate keeps its slice while it runs nothing, and
the other worlds wait. Under an MPS server their work shares the GPU at once
(bench/README.md has the measurements). The server is the campaign's own:
its pipe and log folders are in the worlds' shared folder, so that no other
process on the node connects to it, and it stops with the campaign. A
controller killed with -9 takes the control daemon with it (it runs in the
foreground, as the controller's child, with PDEATHSIG).

Off by default: under MPS a fatal fault of one client (a device-side
assert, an illegal address) ends every client on the GPU, so one world's
crash would reach the others' ranks and read there as their targets'
crashes. Ask for it where targets never fault on the device. ``auto`` starts
one only where several worlds of one rank share a GPU, the control program
is on PATH, and no MPS is set up already; where it cannot start, the worlds
time-slice as before and one line says why. ``on`` makes that a usage error
instead, before any world starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamfuzz.fuzz import host
from streamfuzz.fuzz.errors import FuzzError

MODES = ("auto", "on", "off")
DEFAULT_MODE = "off"

CONTROL = "nvidia-cuda-mps-control"

PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"

_SYSTEM_PIPE = Path("/tmp/nvidia-mps")
"""Where a node-wide MPS control daemon listens unless told otherwise."""

_READY_S = 10.0

_PROBE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
ctx, dev = ctypes.c_void_p(), ctypes.c_int()
for step, rc in (("cuInit", lambda: cuda.cuInit(0)),
                 ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0)),
                 ("cuDevicePrimaryCtxRetain",
                  lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))):
    err = rc()
    if err:
        sys.exit(f"{step} returned CUDA error {err}")
"""
"""A CUDA context made through the driver API alone (no torch: a fraction of a
second), to learn that clients can reach the server before any world starts."""


class MpsUnavailable(FuzzError, RuntimeError):
    """Why no private server runs; the caller words it for ``auto`` or ``on``."""


class Server:
    """A running control daemon; ``env`` points a process's CUDA at it."""

    def __init__(self, folder: Path) -> None:
        self.pipe, self.log = folder / "mps-pipe", folder / "mps-log"
        self.env = {PIPE_ENV: str(self.pipe), LOG_ENV: str(self.log)}
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        control = shutil.which(CONTROL)
        if control is None:
            raise MpsUnavailable(f"{CONTROL} is not on PATH")
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env}
        # Its output to a file, never a pipe: a daemon that logs for hours would
        # fill a pipe nobody reads and stop, and every world with it.
        out = self.log / "control.out"
        with open(out, "wb") as fh:
            self._proc = subprocess.Popen([control, "-f"], env=env, stdin=subprocess.DEVNULL,
                                          stdout=fh, stderr=subprocess.STDOUT,
                                          preexec_fn=_end_with_us, start_new_session=True)
        deadline = time.monotonic() + _READY_S
        while not (self.pipe / "control").exists():
            if self._proc.poll() is not None:
                raise MpsUnavailable(f"{CONTROL} -f exited {self._proc.returncode}"
                                     + _last_line(out))
            if time.monotonic() > deadline:
                self.stop()
                raise MpsUnavailable(f"{CONTROL} made no control pipe in {_READY_S:.0f} s")
            time.sleep(0.02)
        try:
            probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                                   text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.stop()
            raise MpsUnavailable("a CUDA client did not start under it in 60 s") from None
        if probe.returncode != 0:
            self.stop()
            last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
            raise MpsUnavailable(f"a CUDA client could not start under it ({last})"
                                 + _last_line(self.log / "control.log"))

    def stop(self) -> None:
        """Quit the daemon (its server with it); kill it if it does not go."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        control = shutil.which(CONTROL) or CONTROL
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([control], input=b"quit\n", env={**os.environ, **self.env},
                           capture_output=True, timeout=10)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wanted(mode: str, device: str, worlds: int, world_size: int) -> bool:
    """Whether this campaign starts a private server: ``on``, or ``auto`` where
    worlds of one rank share a GPU and no MPS is set up on the node already."""
    if mode == "off" or device != "cuda":
        return False
    if mode == "on":
        return True
    return (worlds > 1 and world_size == 1 and PIPE_ENV not in os.environ
            and not (_SYSTEM_PIPE / "control").exists())


def _end_with_us() -> None:
    host.signal_at_parent_death(signal.SIGTERM)


def _last_line(path: Path) -> str:
    """``: LAST LINE`` of a log, or nothing: the log itself goes with the campaign."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1].strip()}" if lines else ""

