"""Early CUDA ranks: forked from the zygote before its own imports.

A forked rank starts CUDA only once the zygote has imported torch, and CUDA's
start then lies on the path to the first example. A rank forked from the
zygote before its imports can start its device's context, then NCCL, in a
thread while it imports torch itself. The first world's ranks are such early
ranks, one per device the driver will likely use; later worlds are forked as
before.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

from streamfuzz.fuzz.host import EARLY_START_ENV, die_with_parent
from streamfuzz.fuzz.zygote import EARLY_ENV
from streamfuzz.fuzz.zygote.child import become_rank, import_rank


def start_ranks(count: int, start_cwd: str) -> dict[int, tuple[int, int]]:
    """``count`` early ranks, by device index: each one's pid and the pipe its
    request is handed on."""
    early: dict[int, tuple[int, int]] = {}
    for index in range(count):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            for _, fd in early.values():
                os.close(fd)
            _early_rank(index, r, start_cwd)
        os.close(r)
        early[index] = (pid, w)
    return early


def _early_rank(index: int, requests: int, start_cwd: str) -> None:
    """In a child forked before any import: device ``index``'s context and
    NCCL's start made in a thread beside the imports, then the rank the zygote
    hands over, if any."""
    try:
        os.dup2(2, 1)  # the zygote's stdout carries its answers, not our imports' prints
        die_with_parent(os.getppid())
        took: dict[str, float] = {}
        imported = threading.Event()
        beside = threading.Thread(target=_start_beside, args=(index, took, imported),
                                  daemon=True, name="streamfuzz-early-start")
        beside.start()
        main = import_rank()
        imported.set()
        beside.join()
        ready = time.perf_counter()
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(requests, 65536)
            if not chunk:  # not needed after all
                os._exit(0)
            line += chunk
        req = json.loads(line)
    except BaseException:
        os._exit(1)
    took["early_idle"] = round(time.perf_counter() - ready, 3)  # room left beside the imports
    req["env"][EARLY_START_ENV] = json.dumps(took)
    become_rank(main, req, (requests,), start_cwd)


def _start_beside(index: int, took: dict[str, float], imported: threading.Event) -> None:
    """An early rank's thread: device ``index``'s context, then NCCL's start
    unless switched off; ``took`` gets the seconds of each piece that worked."""
    context = _make_context(index)
    if context is None:
        return
    took["early_context"] = round(context, 3)
    if os.environ.get(EARLY_ENV) != "context":
        nccl = _start_nccl(index, imported)
        if nccl is not None:
            took["early_nccl"] = round(nccl, 3)


def _make_context(index: int) -> float | None:
    """Device ``index``'s primary context, the one torch's CUDA runtime adopts;
    the seconds it took, None where it failed (torch then starts CUDA itself,
    as in a forked rank)."""
    import ctypes

    t0 = time.perf_counter()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), index) == 0
            and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0):
        return time.perf_counter() - t0
    return None


def _start_nccl(index: int, imported: threading.Event) -> float | None:
    """NCCL's once-a-process start (mostly loading its kernels into the context),
    paid by one communicator of device ``index`` alone, made and destroyed: a
    process group made later starts without it. It waits for torch's import to
    load its NCCL and uses that very library, never one of its own choosing;
    where none is loaded by the time ``imported`` is set (a torch without CUDA,
    or with NCCL linked in), it does nothing. The seconds it took, None where
    it did nothing or NCCL refused."""
    import ctypes

    while True:
        done = imported.is_set()
        try:  # RTLD_NOLOAD: a handle on the library only if it is loaded already
            nccl = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            break
        except OSError:
            if done:
                return None
            imported.wait(0.01)
    t0 = time.perf_counter()
    comm, devices = ctypes.c_void_p(), (ctypes.c_int * 1)(index)
    if nccl.ncclCommInitAll(ctypes.byref(comm), 1, devices) != 0:
        return None
    nccl.ncclCommDestroy(comm)
    return time.perf_counter() - t0


def hand_request(early: dict[int, tuple[int, int]], req: dict[str, Any], line: bytes,
                 children: set[int]) -> int | None:
    """The early rank for ``req``'s ``LOCAL_RANK``, handed ``req``; None: fork one.
    Early ranks the first world has no place for are ended on its first request."""
    env = req["env"]
    try:
        world, local = int(env.get("WORLD_SIZE", "0")), int(env.get("LOCAL_RANK", "-1"))
    except ValueError:
        world = local = -1
    for index in [i for i in early if i >= world]:
        _end_early(early.pop(index))
    got = early.pop(local, None)
    if got is None:
        return None
    pid, fd = got
    if pid not in children:  # it died starting: fork instead
        os.close(fd)
        return None
    try:
        os.write(fd, line + b"\n")
    except OSError:
        _end_early(got)
        return None
    os.close(fd)
    return pid


def _end_early(early: tuple[int, int]) -> None:
    pid, fd = early
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.close(fd)
