"""CUDA on CPU: a target's plain torch.cuda code, run on simulated streams.

On ``--device cpu`` a rank has no CUDA, yet the code under test is engine code
written against ``torch.cuda``: it makes streams and events, allocates with
``device="cuda"``, pins host buffers and copies with ``non_blocking=True``.
For the duration of one example (``session``), inside the rank process only:

* ``torch.cuda``'s and ``torch.accelerator``'s stream, event and device calls,
  and ``torch.Event`` and ``torch.Stream``, are swapped for the simulated ones
  (``fuzz.streams``), and restored after;
* a torch-function mode rewrites every ``cuda`` device to ``cpu`` before torch
  parses the arguments (so nothing initialises CUDA), turns ``pin_memory``
  into a plain host copy, and keeps ``.cuda()``/``.to("cuda")`` copies;
  a tensor that stands for device memory answers ``cuda:0`` wherever code
  asks its device (``device``, ``is_cuda``, ``get_device``), since engine
  code takes its GPU path only when it sees one; ``torch.set_default_device``
  and ``with torch.device("cuda")`` make device memory;
* ``Memory`` remembers which CPU storages stand for device memory and which
  for pinned or pageable host memory, since CPU tensors stand for all three.
  Meta tensors stay meta: engine code that builds a model on ``meta`` and
  materializes it on ``cuda`` gets device memory.

What is not simulated raises ``NotSimulated``: one line naming the call, and
how to run it on a GPU in the words of whatever runs the simulation
(``Simulation``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._device as _default_device
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from fuzz import stages
from fuzz.errors import FuzzError
from fuzz.tensors import DEVICE as DEVICE_KIND
from fuzz.tensors import PAGEABLE, PINNED, tensors_in

_expired = torch.UntypedStorage._expired
"""``StorageWeakRef.expired`` on its ``cdata``, without two Python calls: asked at every op."""
_DEVICE_OF = torch.Tensor.device.__get__
_IS_CPU = torch.Tensor.is_cpu.__get__

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


class NotSimulated(FuzzError, RuntimeError):
    """A CUDA feature the CPU simulation does not model."""

    def __init__(self, what: str) -> None:
        sim = running() or FUZZ
        super().__init__(f"{what} is not simulated {sim.where} (see docs/cuda-on-cpu.md); "
                         f"'CUDA on CPU'); {sim.on_gpu}")


def storage_key(t: torch.Tensor) -> int | None:
    """What identifies ``t``'s storage (shared by its views), or None where it has none."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


class Memory:
    """What each CPU storage stands for: device memory, pinned or pageable host memory.

    Keyed by the storage's address with a weak reference beside it, so an
    address reused by a later storage is not mistaken for the old one, and
    nothing here keeps a storage alive. Storages never seen are host memory.
    """

    def __init__(self, host_read: Any = None) -> None:
        self._kinds: dict[int, tuple[Any, str]] = {}
        self.making: str | None = None
        """The kind of the storages the current call creates, when the call says."""
        self._since_sweep = 0
        self.host_read = host_read or (lambda t, op: None)
        """Told when the host reads host memory with no aten op (``tolist``, ``numpy``)."""

    def kind(self, t: torch.Tensor) -> str:
        return self.key_kind(t)[1]

    def key_kind(self, t: torch.Tensor) -> tuple[int | None, str]:
        """The storage's key (None where it has none) and what it stands for."""
        key = storage_key(t)
        if key is None:
            return None, PAGEABLE
        entry = self._kinds.get(key)
        if entry is None or _expired(entry[0].cdata):
            return key, PAGEABLE
        return key, entry[1]

    def is_device(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self.kind(t) == DEVICE_KIND

    def mark(self, t: torch.Tensor, kind: str) -> None:
        storage = t.untyped_storage()
        self._kinds[storage._cdata] = (StorageWeakRef(storage), kind)
        self._since_sweep += 1
        if self._since_sweep > 4096:
            self._since_sweep = 0
            self._kinds = {k: v for k, v in self._kinds.items() if not _expired(v[0].cdata)}

    def known(self, t: torch.Tensor) -> bool:
        entry = self._kinds.get(t.untyped_storage()._cdata)
        return entry is not None and not _expired(entry[0].cdata)

    def classify(self, args: Any, out: Any) -> None:
        """Mark the storages an op made: the kind its call asked for, else
        device memory when any input is, else pageable host memory."""
        if isinstance(out, torch.Tensor):  # most ops: one result
            if self.known(out):
                return
            fresh = [out]
        else:
            fresh = [t for t in tensors_in(out) if not self.known(t)]
            if not fresh:
                return
        kind = self.making
        if kind is None:
            kind = DEVICE_KIND if any(self.is_device(t) for t in tensors_in(args)) else PAGEABLE
        for t in fresh:
            if not t.is_meta:  # a meta tensor has no memory, here as on a GPU
                self.mark(t, kind)


def _is_cuda(device: Any) -> bool:
    """Whether a ``device`` argument names the CUDA device (an index does, as in torch)."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return isinstance(device, int) and not isinstance(device, bool)


def _check_index(device: Any) -> None:
    """The simulation has one device, 0: any other index is a target's mistake here."""
    if device is None:
        return
    index = device if isinstance(device, int) else torch.device(device).index
    if index not in (None, 0):
        raise NotSimulated(f"CUDA device {index} (the simulation has device 0 only)")


class _DeviceMode(TorchFunctionMode):
    """Rewrites ``cuda`` devices to ``cpu`` and says what kind of memory each call makes."""

    def __init__(self, memory: Memory) -> None:
        super().__init__()
        self.memory = memory

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        stages.enter(stages.SIMULATION)
        special = _METHODS.get(func)
        making = None
        if not kwargs:
            kwargs = {}
        elif special is None:
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device="cpu")
                making = DEVICE_KIND
            if kwargs.get("pin_memory"):
                kwargs = dict(kwargs, pin_memory=False)
                making = PINNED
        if (_default_device.CURRENT_DEVICE is not None and making is None and special is None
                and kwargs.get("device") is None and _is_cuda(_default_device.CURRENT_DEVICE)
                and func in _default_device._device_constructors()):
            # torch's default device (set_default_device, ``with torch.device``) is cuda:
            # a factory call makes device memory, as torch would give it the device.
            kwargs = dict(kwargs, device="cpu")
            making = DEVICE_KIND
        stages.enter(stages.RUNNER)
        try:
            if special is not None:
                return special(self.memory, *args, **kwargs)
            if making is None:
                return func(*args, **kwargs)
            return _making(self.memory, making, func, *args, **kwargs)
        finally:
            stages.leave()
            stages.leave()


def _making(memory: Memory, kind: str, func: Any, *args: Any, **kwargs: Any) -> Any:
    before, memory.making = memory.making, kind
    try:
        return func(*args, **kwargs)
    finally:
        memory.making = before


def _device(memory: Memory, t: torch.Tensor) -> torch.device:
    """``Tensor.device``: the CUDA device for device memory."""
    return DEVICE if memory.is_device(t) else _DEVICE_OF(t)


def _is_cuda_tensor(memory: Memory, t: torch.Tensor) -> bool:
    return memory.is_device(t)


def _is_cpu_tensor(memory: Memory, t: torch.Tensor) -> bool:
    return not memory.is_device(t) and _IS_CPU(t)


def _get_device(memory: Memory, t: torch.Tensor) -> int:
    return DEVICE.index if memory.is_device(t) else torch.Tensor.get_device(t)


def _type(memory: Memory, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``Tensor.type()``: ``torch.cuda.FloatTensor`` for device memory; a cast as torch's."""
    out = torch.Tensor.type(t, *args, **kwargs)
    if not args and not kwargs and memory.is_device(t):
        return out.replace("torch.", "torch.cuda.", 1)
    return out


def _to(memory: Memory, t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.to``: a copy whenever the memory kind changes, as on CUDA. A
    device other than the CPU and CUDA (``meta``) is torch's own."""
    given, args = args, list(args)
    target = kwargs.get("device")
    where = "device" if target is not None else None
    if target is None and args:
        first = args[0]
        if isinstance(first, (str, torch.device)) or (isinstance(first, int)
                                                       and not isinstance(first, bool)):
            target, where = first, 0
        elif isinstance(first, torch.Tensor):
            target = DEVICE if memory.is_device(first) else _DEVICE_OF(first)
            args[0] = first.dtype
    if target is None:
        return torch.Tensor.to(t, *args, **kwargs)
    to_device = _is_cuda(target)
    if not to_device and torch.device(target).type != "cpu":
        return torch.Tensor.to(t, *given, **kwargs)
    if where == "device":
        kwargs["device"] = "cpu"
    elif where == 0:
        args[0] = "cpu"
    else:
        args.insert(0, "cpu")
    on_device = memory.is_device(t)
    if to_device == on_device:
        return torch.Tensor.to(t, *args, **kwargs)
    kwargs["copy"] = True
    if to_device:
        kind = DEVICE_KIND
    else:
        # torch pins the output of a non-blocking device-to-host copy.
        kind = PINNED if kwargs.get("non_blocking") or (len(args) > 2 and args[2]) else PAGEABLE
    return _making(memory, kind, torch.Tensor.to, t, *args, **kwargs)


def _cuda(memory: Memory, t: torch.Tensor, device: Any = None, non_blocking: bool = False,
          **kwargs: Any) -> torch.Tensor:
    _check_index(device)
    if memory.is_device(t):
        return t
    return _making(memory, DEVICE_KIND, torch.Tensor.to, t, "cpu", non_blocking=non_blocking,
                   copy=True, **kwargs)


def _cpu(memory: Memory, t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    if not memory.is_device(t):
        return t
    return _making(memory, PAGEABLE, torch.Tensor.to, t, "cpu", copy=True, **kwargs)


def _pin_memory(memory: Memory, t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if memory.is_device(t):
        raise RuntimeError("cannot pin a device tensor: only dense CPU tensors can be pinned")
    if memory.kind(t) == PINNED:
        return t
    return _making(memory, PINNED, torch.Tensor.clone, t)


def _is_pinned(memory: Memory, t: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    return memory.kind(t) == PINNED


def _host_read(method: Any) -> Any:
    """``tolist``/``numpy``: on a device tensor, a blocking copy to the host
    first; on host memory, a read by the host that no aten op reports."""
    label = f"Tensor.{method.__name__}"

    def call(memory: Memory, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if memory.is_device(t):
            t = _cpu(memory, t)
        else:
            memory.host_read(t, label)
        return method(t, *args, **kwargs)
    return call


_METHODS: dict[Any, Any] = {
    _DEVICE_OF: _device,
    torch.Tensor.is_cuda.__get__: _is_cuda_tensor,
    _IS_CPU: _is_cpu_tensor,
    torch.Tensor.get_device: _get_device,
    torch.Tensor.type: _type,
    torch.Tensor.to: _to,
    torch.Tensor.cuda: _cuda,
    torch.Tensor.cpu: _cpu,
    torch.Tensor.pin_memory: _pin_memory,
    torch.Tensor.is_pinned: _is_pinned,
    torch.Tensor.tolist: _host_read(torch.Tensor.tolist),
    torch.Tensor.numpy: _host_read(torch.Tensor.numpy),
}


# -- the torch.cuda and torch.accelerator functions --------------------------------
class _Device:
    """``torch.cuda.device(i)`` / ``torch.accelerator.device_index(i)``: one device."""

    def __init__(self, device: Any = None) -> None:
        _check_index(device)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _not_simulated(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulated(name)
    return call


def _cuda_patches(api: Any) -> dict[str, Any]:
    from fuzz.streams import SimEvent, SimStream

    def stream(s: Any = None) -> Any:
        return api.stream(s)

    def current_stream(device: Any = None) -> Any:
        _check_index(device)
        return api.current_stream()

    def default_stream(device: Any = None) -> Any:
        _check_index(device)
        return api.main

    def set_stream(s: Any) -> None:
        api.set_stream(s)

    def synchronize(device: Any = None) -> None:
        _check_index(device)
        api.synchronize()

    def set_device(device: Any) -> None:
        _check_index(device)

    def get_device_properties(device: Any = None) -> DeviceProperties:
        _check_index(device)
        return SIMULATED_DEVICE

    def get_device_name(device: Any = None) -> str:
        _check_index(device)
        return SIMULATED_DEVICE.name

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        _check_index(device)
        return SIMULATED_DEVICE.major, SIMULATED_DEVICE.minor

    return {
        "Stream": SimStream, "Event": SimEvent, "stream": stream, "StreamContext": stream,
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
        "is_current_stream_capturing": lambda: False, "empty_cache": lambda: None,
        "get_sync_debug_mode": lambda: 0, "set_sync_debug_mode": lambda mode: None,
    }


def _accelerator_patches(api: Any) -> dict[str, Any]:
    cuda = _cuda_patches(api)

    def set_device_index(device: Any) -> None:
        _check_index(device)

    return {
        "current_stream": cuda["current_stream"], "set_stream": cuda["set_stream"],
        "synchronize": cuda["synchronize"], "device_count": lambda: 1,
        "is_available": lambda: True,
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
        "set_device_index": set_device_index, "set_device_idx": set_device_index,
        "device_index": _Device,
    }


def _torch_event(device: Any = None, **kwargs: Any) -> Any:
    """``torch.Event(device, ...)``: the device-generic event, as a simulated one."""
    from fuzz.streams import SimEvent

    _check_index(device)
    return SimEvent(**kwargs)


TORCH_STREAM = torch.Stream
"""torch's own ``Stream``: a session swaps ``_GenericStream`` in for it."""


class _StreamType(type):
    """``isinstance`` and ``issubclass`` against the stand-in ask torch's own ``Stream``."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, TORCH_STREAM)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, TORCH_STREAM)


class _GenericStream(metaclass=_StreamType):
    """``torch.Stream(device, priority=...)``, the device-generic stream: on a
    CUDA device (or the current accelerator, which is CUDA here) a new simulated
    stream; on the CPU, torch's own."""

    def __new__(cls, device: Any = None, *, priority: int = 0, **kwargs: Any) -> Any:
        from fuzz.streams import SimStream

        if device is not None and torch.device(device).type == "cpu":
            return TORCH_STREAM(device, priority=priority, **kwargs)
        _check_index(device)
        return SimStream(priority=priority)


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
        if _is_cuda(device):
            _check_index(device)
            device = "cpu"
        return TORCH_GENERATOR(device)


_KEEP = frozenset({"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
                   "cast", "lru_cache", "classproperty", "NewType", "Any", "Callable",
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
            out[name] = _not_simulated(f"{module.__name__}.{name}")
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
    return {name: _not_simulated(f"torch.cuda.graphs.{name}")
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
    memory = Memory(api.host_read)
    cuda = _cuda_patches(api)
    cuda.update(_unsimulated(torch.cuda, frozenset(cuda)))
    cuda["_sleep"] = _not_simulated("torch.cuda._sleep")
    accel = _accelerator_patches(api)
    accel.update(_unsimulated(torch.accelerator, frozenset(accel)))
    with contextlib.ExitStack() as stack:
        _running.append(simulation)
        stack.callback(_running.pop)
        stack.enter_context(_default_device_kept())
        stack.enter_context(_patched(torch.cuda, cuda))
        stack.enter_context(_patched(torch.accelerator, accel))
        stack.enter_context(_patched(torch.cuda.graphs, _cuda_graphs()))
        stack.enter_context(_patched(torch.cuda.nvtx, _nvtx_patches()))
        stack.enter_context(_patched(torch, {"Event": _torch_event, "Stream": _GenericStream,
                                             "Generator": _Generator}))
        stack.enter_context(_DeviceMode(memory))
        yield memory
