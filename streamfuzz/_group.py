"""A one-rank process group, so collectives inside a checked block just work.

A test process (a pytest-xdist worker too) is one rank of a world of one.
The store listens on a port the OS picks (port 0), so concurrent workers
never race for one. A group the user started is used as it is; the one
started here is destroyed when the test session ends (or the process exits).
Multi-rank checks are the fuzzer's job (``python -m streamfuzz run``).
"""

from __future__ import annotations

import atexit
import sys

import torch
import torch.distributed as dist

_started = False


def ensure() -> None:
    """Start the default group (rank 0 of 1) unless one already exists.

    Called before a block starts, so ``torch.cuda`` is still the real one: with
    a GPU the group takes CUDA tensors too (NCCL), whatever the block's device.
    """
    global _started
    if not dist.is_available() or dist.is_initialized():
        return
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    gpu = torch.cuda.is_available() and dist.is_nccl_available()
    backend = "cpu:gloo,cuda:nccl" if gpu else "gloo"
    hook = sys.excepthook
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    # torch prefixes every line of an uncaught traceback with the rank: noise
    # in a process that is no distributed job, only a world of one.
    sys.excepthook = hook
    if not _started:
        atexit.register(close)
    _started = True


def close() -> None:
    """Destroy the group started by ``ensure`` (never one the user started)."""
    global _started
    if _started and dist.is_initialized():
        dist.destroy_process_group()
    _started = False


def rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

