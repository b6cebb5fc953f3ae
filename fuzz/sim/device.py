"""The one simulated CUDA device: what it is, what runs it, and what it does not simulate.

Every part of CUDA on CPU (``streamfuzz.fuzz.sim.memory``, ``streamfuzz.fuzz.sim.cuda_on_cpu``,
``streamfuzz.fuzz.sim.stream_types``) speaks of this device; a call it does not model
raises ``NotSimulated`` in the words of whatever runs the simulation.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from streamfuzz.fuzz.errors import FuzzError

DEVICE = torch.device("cuda", 0)
"""The device a target sees on the simulation (``ctx.device``)."""



@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` answers on the simulation: a
    Hopper-class card, since engine code picks its kernels and buffer sizes by
    capability and memory at start-up, and the fuzzer runs the paths it picks
    for current GPUs."""

    name: str = "simulated CUDA device (CPU)"
    major: int = 9
    minor: int = 0
    total_memory: int = 80 * 2**30
    multi_processor_count: int = 132
    L2_cache_size: int = 50 * 2**20
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 48 * 2**10
    shared_memory_per_block_optin: int = 227 * 2**10
    shared_memory_per_multiprocessor: int = 228 * 2**10
    is_integrated: int = 0
    is_multi_gpu_board: int = 0


SIMULATED_DEVICE = DeviceProperties()
"""The one simulated device's properties; ``get_device_capability`` is its (major, minor)."""


@dataclasses.dataclass(frozen=True)
class Simulation:
    """What runs the simulation, as its messages name it to the user: where it
    runs, and how to run the same code on a GPU."""

    where: str
    on_gpu: str


FUZZ = Simulation("on --device cpu", "run this target with --device cuda")
"""A fuzz target on ``--device cpu``; ``streamfuzz.checked`` passes its own words."""

_running: list[Simulation] = []
"""The simulation of the session now open (innermost last)."""


def running() -> Simulation | None:
    """The simulation now open, or None outside every session."""
    return _running[-1] if _running else None


@contextlib.contextmanager
def running_as(simulation: Simulation) -> Iterator[None]:
    """``simulation`` is the one open (``running()``) for the length of a session."""
    _running.append(simulation)
    try:
        yield
    finally:
        _running.pop()


class NotSimulated(FuzzError, RuntimeError):
    """A CUDA feature the CPU simulation does not model."""

    def __init__(self, what: str) -> None:
        sim = running() or FUZZ
        super().__init__(f"{what} is not simulated {sim.where} (see docs/cuda-on-cpu.md); "
                         f"{sim.on_gpu}")


def is_cuda(device: Any) -> bool:
    """Whether a ``device`` argument names the CUDA device (an index does, as in torch)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool)


def check_index(device: Any) -> None:
    """The simulation has one device, 0: any other index is a target's mistake here."""
    if device is None:
        return
    index = device if isinstance(device, int) else torch.device(device).index
    if index not in (None, 0):
        raise NotSimulated(f"CUDA device {index} (the simulation has device 0 only)")


def check_stream(value: Any, call: str) -> None:
    """A stream where ``call`` takes one: anything else fails in the caller's line,
    as torch fails there, never later inside the lifetime oracle."""
    if not hasattr(value, "stream_id"):
        raise TypeError(f"{call} takes a stream, not {type(value).__name__}")


def not_simulated(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulated(name)
    return call


