"""CUDA on CPU: a target's plain torch.cuda code, run on simulated streams.

On ``--device cpu`` a rank has no CUDA, yet the code under test is engine code
written against ``torch.cuda``: it makes streams and events, allocates with
``device="cuda"``, pins host buffers and copies with ``non_blocking=True``.
For the duration of one example (``session``), inside the rank process only:

* ``torch.cuda``'s and ``torch.accelerator``'s stream, event and device calls,
  and ``torch.Event`` and ``torch.Stream``, are swapped for the simulated ones
  (``streamfuzz.fuzz.sim.stream_types``, given by the session's ``api``), and restored after;
* a torch-function mode (``streamfuzz.fuzz.sim.memory``) rewrites every ``cuda`` device
  to ``cpu`` before torch parses the arguments (so nothing initialises CUDA),
  turns ``pin_memory`` into a plain host copy, and keeps ``.cuda()``/``.to("cuda")``
  copies; a tensor that stands for device memory answers ``cuda:0`` wherever
  code asks its device (``device``, ``is_cuda``, ``get_device``), since engine
  code takes its GPU path only when it sees one; ``torch.set_default_device``
  and ``with torch.device("cuda")`` make device memory;
* ``streamfuzz.fuzz.sim.memory.Memory`` remembers which CPU storages stand for device
  memory and which for pinned or pageable host memory, since CPU tensors stand
  for all three. Meta tensors stay meta: engine code that builds a model on ``meta`` and
  materializes it on ``cuda`` gets device memory.

What is not simulated raises ``NotSimulated``: one line naming the call, and
how to run it on a GPU in the words of whatever runs the simulation
(``Simulation``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from streamfuzz.fuzz.sim.device import (
    DEVICE,
    FUZZ,
    SIMULATED_DEVICE,
    DeviceProperties,
    NotSimulated,
    Simulation,
    check_index,
    check_stream,
    is_cuda,
    not_simulated,
    running,
    running_as,
)
from streamfuzz.fuzz.sim.memory import DeviceMode, Memory, resizes_seen, storage_key

__all__ = ["DEVICE", "FUZZ", "SIMULATED_DEVICE", "TORCH_STREAM", "DeviceProperties", "Memory",
           "NotSimulated", "Simulation", "running", "session", "storage_key"]


# -- the torch.cuda and torch.accelerator functions --------------------------------
class _Device:
    """``torch.cuda.device(i)`` / ``torch.accelerator.device_index(i)``: one device."""

    def __init__(self, device: Any = None) -> None:
        check_index(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _cuda_patches(api: Any) -> dict[str, Any]:
    def current_stream(device: Any = None) -> Any:
        check_index(device)
        return api.current_stream()

    def default_stream(device: Any = None) -> Any:
        check_index(device)
        return api.main

    def set_stream(s: Any) -> None:
        if s is not None:
            check_stream(s, "torch.cuda.set_stream()")
        api.set_stream(s)

    def synchronize(device: Any = None) -> None:
        check_index(device)
        api.synchronize()

    def set_device(device: Any) -> None:
        check_index(device)

    def get_device_properties(device: Any = None) -> DeviceProperties:
        check_index(device)
        return SIMULATED_DEVICE

    def get_device_name(device: Any = None) -> str:
        check_index(device)
        return SIMULATED_DEVICE.name

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        check_index(device)
        return SIMULATED_DEVICE.major, SIMULATED_DEVICE.minor

    return {
        "Stream": api.stream_type, "Event": api.event_type,
        "ExternalStream": api.external_stream_type,
        "stream": api.stream_context_type, "StreamContext": api.stream_context_type,
        "current_stream": current_stream, "default_stream": default_stream,
        "set_stream": set_stream, "synchronize": synchronize,
        "is_available": lambda: True, "is_initialized": lambda: True, "init": lambda: None,
        "_lazy_init": lambda: None, "current_device": lambda: 0, "device_count": lambda: 1,
        "set_device": set_device, "device": _Device, "device_of": lambda t: _Device(),
        "get_device_name": get_device_name,
        "get_device_properties": get_device_properties,
        "get_device_capability": get_device_capability,
        "get_arch_list": lambda: [f"sm_{SIMULATED_DEVICE.major}{SIMULATED_DEVICE.minor}"],
        "is_bf16_supported": lambda including_emulation=True: True,
        "is_current_stream_capturing": lambda: False,
        "get_sync_debug_mode": lambda: 0, "set_sync_debug_mode": lambda mode: None,
    }


def _random_patches() -> dict[str, Any]:
    """The device's random numbers: its factory calls run on the CPU and draw
    from the CPU's default generator, so its state is the device's too
    (seeding one seeds the other, unlike on a GPU)."""
    cpu = torch.default_generator

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        check_index(device)
        return cpu.get_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        check_index(device)
        cpu.set_state(new_state)

    def set_rng_state_all(new_states: Any) -> None:
        for state in new_states:
            cpu.set_state(state)

    def manual_seed(seed: int) -> None:
        cpu.manual_seed(int(seed))

    def seed() -> None:
        cpu.seed()

    return {"get_rng_state": get_rng_state, "set_rng_state": set_rng_state,
            "get_rng_state_all": lambda: [cpu.get_state()],
            "set_rng_state_all": set_rng_state_all,
            "manual_seed": manual_seed, "manual_seed_all": manual_seed,
            "seed": seed, "seed_all": seed, "initial_seed": cpu.initial_seed,
            "default_generators": (cpu,)}


def _memory_patches(memory: Memory) -> dict[str, Any]:
    """The caching allocator's statistics, of the device memory the session
    holds (``streamfuzz.fuzz.sim.memory.DeviceBytes``); ``empty_cache`` lets
    what is reserved fall back to what is held."""
    counts = memory.counts

    def stat(value: Any) -> Any:
        def call(device: Any = None) -> Any:
            check_index(device)
            return value()
        return call

    def stats() -> dict[str, int]:
        current, reserved = counts.current(), counts.reserved()
        out = {}
        for kind in ("allocated_bytes", "active_bytes"):
            out[f"{kind}.all.current"] = current
            out[f"{kind}.all.peak"] = counts.peak
        out["reserved_bytes.all.current"] = reserved
        out["reserved_bytes.all.peak"] = counts.reserved_peak()
        out.update({"num_alloc_retries": 0, "num_ooms": 0})
        return dict(sorted(out.items()))

    total = SIMULATED_DEVICE.total_memory
    return {
        "memory_allocated": stat(counts.current),
        "max_memory_allocated": stat(lambda: counts.peak),
        "memory_reserved": stat(counts.reserved),
        "max_memory_reserved": stat(counts.reserved_peak),
        "reset_peak_memory_stats": stat(counts.reset_peaks),
        "reset_max_memory_allocated": stat(counts.reset_peaks),
        "memory_stats": stat(stats), "empty_cache": counts.empty_cache,
        "mem_get_info": stat(lambda: (total - counts.reserved(), total)),
    }


def _accelerator_patches(api: Any) -> dict[str, Any]:
    cuda = _cuda_patches(api)

    def set_device_index(device: Any) -> None:
        check_index(device)

    return {
        "current_stream": cuda["current_stream"], "set_stream": cuda["set_stream"],
        "synchronize": cuda["synchronize"], "device_count": lambda: 1,
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
        "set_device_index": set_device_index, "set_device_idx": set_device_index,
        "device_index": _Device,
    }


TORCH_STREAM = torch.Stream
"""torch's own ``Stream``: a session swaps ``stream_types.GenericStream`` in for it."""


TORCH_GENERATOR = torch.Generator
"""torch's own ``Generator``: a session swaps ``_Generator`` in for it."""


class _GeneratorType(type):
    """``isinstance`` and ``issubclass`` against the stand-in ask torch's own ``Generator``."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, TORCH_GENERATOR)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, TORCH_GENERATOR)


class _Generator(metaclass=_GeneratorType):
    """``torch.Generator(device="cuda")``, as engines make one to sample on the
    device: a CPU generator, which the device's factory calls (CPU calls here)
    take."""

    def __new__(cls, device: Any = "cpu") -> Any:
        if is_cuda(device):
            check_index(device)
            device = "cpu"
        return TORCH_GENERATOR(device)


def _torch_patches(api: Any) -> dict[str, Any]:
    """``torch.Event`` and ``torch.Stream``, the device-generic ones, on ``api``'s
    types; ``torch.Generator`` making CPU generators for the device."""
    return {"Event": api.generic_event_type, "Stream": api.generic_stream_type,
            "Generator": _Generator}


_ACCELERATOR = {"_get_accelerator": lambda: torch.device("cuda")}
"""What torch asks for the accelerator where no device is named
(``torch.get_device_module()``, c10d's and FSDP's default device): CUDA, so
that engine code that picks its stream API this way takes its CUDA path."""


_KEEP = frozenset({"cast", "lru_cache", "classproperty", "NewType", "Any", "Callable",
                   "Optional"})


@functools.cache
def _unsimulated(module: Any, simulated: frozenset[str]) -> dict[str, Any]:
    """Every other public function or class of ``module`` (not exceptions, not
    the legacy tensor types): calling it raises ``NotSimulated``. Made once:
    a session only swaps them in."""
    out = {}
    for name, value in vars(module).items():
        if name.startswith("_") or name in simulated or name in _KEEP:
            continue
        if inspect.isclass(value) and (issubclass(value, BaseException)
                                       or name.endswith(("Tensor", "Storage"))):
            continue
        if inspect.isfunction(value) or inspect.isclass(value):
            out[name] = not_simulated(f"{module.__name__}.{name}")
    return out


def _nvtx_patches() -> dict[str, Any]:
    """NVTX ranges and marks annotate a profile and order nothing: here they do
    nothing, keeping only the nesting depth that ``range_push``/``range_pop`` return."""
    depth = [0]

    def range_push(msg: str) -> int:
        depth[0] += 1
        return depth[0] - 1

    def range_pop() -> int:
        if depth[0] == 0:
            return -1
        depth[0] -= 1
        return depth[0]

    @contextlib.contextmanager
    def nvtx_range(msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        range_push(msg)
        try:
            yield
        finally:
            range_pop()

    return {"range_push": range_push, "range_pop": range_pop, "range": nvtx_range,
            "range_start": lambda msg: 0, "range_end": lambda range_id: None,
            "mark": lambda msg: None}


@functools.cache
def _cuda_graphs() -> dict[str, Any]:
    return {name: not_simulated(f"torch.cuda.graphs.{name}")
            for name in ("CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle")}


@contextlib.contextmanager
def _patched(module: Any, values: dict[str, Any]) -> Iterator[None]:
    namespace = vars(module)
    saved = {name: namespace[name] for name in values if name in namespace}
    try:
        namespace.update(values)
        yield
    finally:
        namespace.update(saved)
        for name in values.keys() - saved.keys():
            del namespace[name]


@contextlib.contextmanager
def _default_device_kept() -> Iterator[None]:
    """torch's default device as it was before the session, after it: a
    ``set_default_device("cuda")`` inside means the simulated device, which
    is gone once the session ends."""
    before = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    try:
        yield
    finally:
        if getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is not before:
            torch.set_default_device(before.device if before is not None else None)


@contextlib.contextmanager
def session(api: Any, simulation: Simulation = FUZZ) -> Iterator[Memory]:
    """torch.cuda and torch.accelerator on ``api``'s simulated streams, for one
    example or block; ``simulation`` names what runs it in messages."""
    memory = Memory(api.host_read, api.resized)
    cuda = _cuda_patches(api)
    cuda.update(_random_patches())
    cuda.update(_memory_patches(memory))
    cuda.update(_unsimulated(torch.cuda, frozenset(cuda)))
    cuda["_sleep"] = not_simulated("torch.cuda._sleep")
    accel = _accelerator_patches(api)
    accel.update(_unsimulated(torch.accelerator, frozenset(accel)))
    with contextlib.ExitStack() as stack:
        stack.enter_context(running_as(simulation))
        stack.enter_context(_default_device_kept())
        stack.enter_context(_patched(torch.cuda, cuda))
        stack.enter_context(_patched(torch.accelerator, accel))
        stack.enter_context(_patched(torch.cuda.graphs, _cuda_graphs()))
        stack.enter_context(_patched(torch.cuda.nvtx, _nvtx_patches()))
        stack.enter_context(_patched(torch, _torch_patches(api)))
        stack.enter_context(_patched(torch._C, _ACCELERATOR))
        stack.enter_context(resizes_seen(memory))
        stack.enter_context(DeviceMode(memory))
        yield memory
