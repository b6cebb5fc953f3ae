"""Facts about this machine that the driver needs before and beside its ranks:
how many GPUs there are and their free memory (without loading CUDA here), how
many CPU ranks fit, this process's resident memory, a ``host:port``; and what
every process the driver starts shares with it: it dies with its parent, an
early rank's start is told in ``EARLY_START_ENV``, and a world's ranks meet
through the file ``STORE_ENV`` names."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

from streamfuzz.fuzz import env

EARLY_START_ENV = env.EARLY_START
"""Set in an early rank: JSON, seconds each piece it started beside its imports
took, and how long it then waited for its request (``early_idle``)."""

STORE_ENV = env.STORE
"""Set in a rank the driver started: the file its world's ranks meet through
(``torch.distributed``'s file store), made fresh for each start of the world."""

_first_counter: Callable[[], int | None] | None = None


def count_gpus_with(counter: Callable[[], int | None]) -> None:
    """Have ``probe_gpus`` ask ``counter`` first: a process that has imported
    torch already (the zygote ``python -m streamfuzz run`` starts early) counts at no
    cost; None from it means that a throwaway process counts instead."""
    global _first_counter
    _first_counter = counter


def probe_gpus() -> int:
    """Count GPUs in another process, so the driver itself never loads CUDA: the
    one offered through ``count_gpus_with`` where there is one, else a throwaway
    process."""
    gpus = _first_counter() if _first_counter is not None else None
    if gpus is not None:
        return gpus
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def gpu_free_mib() -> float | None:
    """The least free memory of this node's GPUs, from NVML (no CUDA context is
    made here); None where NVML cannot be asked."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or not count.value:
            return None
        free = []
        for i in range(count.value):
            handle, mem = ctypes.c_void_p(), _Memory()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0
                    or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0):
                return None
            free.append(mem.free / 2**20)
        return min(free)
    finally:
        nvml.nvmlShutdown()


CPU_RANK_MIB = 512
"""Memory a CPU rank is budgeted (one measured 230-300 MiB resident; README)."""

CPU_RANKS_PER_CORE = 4
"""Gloo ranks per core beyond which a world spends its time waiting for a turn
on a core and its start runs past any timeout."""


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)


def cpu_world_limit() -> tuple[int, str]:
    """The most CPU ranks this machine can hold, and why that many."""
    n = cores()
    by_cores = n * CPU_RANKS_PER_CORE
    avail = _mem_available_mib()
    by_mem = int(avail // CPU_RANK_MIB) if avail is not None else by_cores
    if avail is not None and by_mem < by_cores:
        return max(1, by_mem), (f"{avail / 1024:.1f} GiB of memory available at "
                                f"{CPU_RANK_MIB} MiB a rank")
    return by_cores, f"{n} core(s) at {CPU_RANKS_PER_CORE} ranks a core"


def _mem_available_mib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_bytes() -> int:
    """Resident set size of this process (one small /proc read; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``; raises ValueError with the reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)


def die_with_parent(parent: int | None = None) -> None:
    """A process the driver started (a spawned rank, the zygote, through it a
    forked rank) must not outlive its parent, ``env.PARENT``'s unless
    ``parent`` is given: a driver killed with -9 would otherwise leave a spare
    world waiting forever."""
    if parent is None:
        parent = env.integer(env.PARENT, 0)
    if not parent or not sys.platform.startswith("linux"):
        return
    if not signal_at_parent_death(signal.SIGKILL):
        return
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def signal_at_parent_death(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies
    (Linux's PR_SET_PDEATHSIG); False where that cannot be asked."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
    return True
