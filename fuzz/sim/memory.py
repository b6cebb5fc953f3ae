"""Memory on CUDA on CPU: which CPU storages stand for device memory, and the
tensor calls that make, move or ask about it.

CPU tensors stand for device memory and for pinned and pageable host memory
alike; ``Memory`` remembers which is which. A torch-function mode
(``DeviceMode``) rewrites every ``cuda`` device to ``cpu`` before torch parses
the arguments, says what kind of memory each call makes, and answers the
tensor methods that ask or change a tensor's device as CUDA would.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from itertools import compress
from typing import Any, cast

import torch
import torch.utils._device as _default_device
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.sim.device import DEVICE, check_index, is_cuda
from streamfuzz.fuzz.tensors import DEVICE as DEVICE_KIND
from streamfuzz.fuzz.tensors import PAGEABLE, PINNED, tensors_in

_expired = torch.UntypedStorage._expired
"""``StorageWeakRef.expired`` on its ``cdata``, without two Python calls: asked at every op."""
_DEVICE_OF = torch.Tensor.device.__get__
_IS_CPU = cast(Any, torch.Tensor.is_cpu).__get__  # the descriptor's getter: typed as a bool

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

    @property
    def making(self) -> str | None:
        """The kind of the storages the current call creates, when the call
        says: per thread, since another thread (a DataLoader's pin thread)
        makes host tensors while this one copies to the device."""
        return getattr(self._local, "making", None)

    @making.setter
    def making(self, kind: str | None) -> None:
        self._local.making = kind

    def __init__(self, host_read: Any = None, resized: Any = None) -> None:
        self._kinds: dict[int, tuple[Any, str]] = {}
        self._local = threading.local()
        self._since_sweep = 0
        self.host_read = host_read or (lambda t, op: None)
        """Told when the host reads host memory with no aten op (``tolist``, ``numpy``)."""
        self.on_resize = resized or (lambda storage, before: None)
        """Told after ``UntypedStorage.resize_`` (the storage, its bytes before):
        its block freed and another allocated (``resizes_seen``)."""
        self.counts = DeviceBytes()
        """The device memory held, as ``torch.cuda.memory_allocated`` counts it."""

    def kind(self, t: torch.Tensor) -> str:
        return self.key_kind(t)[1]

    def key_kind(self, t: torch.Tensor) -> tuple[int | None, str]:
        """The storage's key (None where it has none) and what it stands for."""
        key = storage_key(t)
        if key is None:
            return None, PAGEABLE
        return key, self.key_kind_of(key)

    def key_kind_of(self, key: int) -> str:
        """What the storage of key ``key`` (``storage._cdata``) stands for."""
        entry = self._kinds.get(key)
        if entry is None or _expired(entry[0].cdata):
            return PAGEABLE
        return entry[1]

    def is_device(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self.kind(t) == DEVICE_KIND

    def mark(self, t: torch.Tensor, kind: str) -> None:
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)
        self._kinds[storage._cdata] = (ref, kind)
        if kind == DEVICE_KIND:
            self.counts.allocated(storage._cdata, ref, storage.nbytes())
        self._since_sweep += 1
        if self._since_sweep > 4096:
            self._since_sweep = 0
            self._kinds = {k: v for k, v in self._kinds.items() if not _expired(v[0].cdata)}

    def resized(self, storage: torch.UntypedStorage, before: int) -> None:
        """``storage.resize_`` ran: count its new size, and tell ``on_resize``."""
        key = storage._cdata
        if self.key_kind_of(key) == DEVICE_KIND:
            self.counts.allocated(key, self._kinds[key][0], storage.nbytes())
        self.on_resize(storage, before)

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


_BLOCK = 512
"""The caching allocator's rounding: ``memory_allocated`` counts whole blocks."""
_SEGMENT = 2 << 20
"""What it reserves at least at a time (``memory_reserved``)."""


def _blocks(nbytes: int) -> int:
    return -(-nbytes // _BLOCK) * _BLOCK


def _segments(nbytes: int) -> int:
    return -(-nbytes // _SEGMENT) * _SEGMENT


class DeviceBytes:
    """Device memory held, as the caching allocator's statistics count it:
    each live device storage's size rounded up to a block. A storage's free
    is seen when it is next counted (its weak reference has expired), so
    ``current`` sweeps first; a new high sweeps too, so that a peak counts
    only live storages."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[Any, int]] = {}
        """Per live device storage (key): its weak reference and counted bytes."""
        self._weak: dict[int, int] = {}
        """The same keys' weak references as the raw handles a sweep tests."""
        self._total = 0
        """Their bytes, and those of storages freed since the last sweep."""
        self.peak = 0
        self.cached = 0
        """The most held since the allocator's cache was last emptied: what it reserves."""
        self.cached_peak = 0

    def allocated(self, key: int, ref: Any, nbytes: int) -> None:
        """Storage ``key`` holds ``nbytes`` now (made, or resized)."""
        size = _blocks(nbytes)
        old = self._held.get(key)
        self._total += size - (old[1] if old is not None else 0)
        self._held[key] = (ref, size)
        self._weak[key] = ref.cdata
        if self._total > self.peak or self._total > self.cached:
            self._new_high()

    def _new_high(self) -> None:
        self.current()
        self.peak = max(self.peak, self._total)
        self.cached = max(self.cached, self._total)
        self.cached_peak = max(self.cached_peak, self.cached)

    def current(self) -> int:
        """The bytes live device storages hold now."""
        weak = self._weak
        for k in list(compress(weak, map(_expired, weak.values()))):
            del weak[k]
            self._total -= self._held.pop(k)[1]
        return self._total

    def reserved(self) -> int:
        return _segments(self.cached)

    def reserved_peak(self) -> int:
        return _segments(self.cached_peak)

    def reset_peaks(self) -> None:
        self.peak = self.current()
        self.cached_peak = self.cached

    def empty_cache(self) -> None:
        self.cached = self.current()


class DeviceMode(TorchFunctionMode):
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
            if "device" in kwargs and is_cuda(kwargs["device"]):
                kwargs = dict(kwargs, device="cpu")
                making = DEVICE_KIND
            if kwargs.get("pin_memory"):
                kwargs = dict(kwargs, pin_memory=False)
                making = PINNED
        if (_default_device.CURRENT_DEVICE is not None and making is None and special is None
                and kwargs.get("device") is None and is_cuda(_default_device.CURRENT_DEVICE)
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


def _torch_device(memory: Memory, *args: Any, **kwargs: Any) -> torch.device:
    """``torch.device(i)``: an index alone names a device of the accelerator,
    which is CUDA here (a CPU-only torch raises, having none)."""
    if len(args) == 1 and not kwargs:
        args = (_index(args[0]),)
    return torch.device(*args, **kwargs)


def _index(device: Any) -> Any:
    return torch.device("cuda", device) if isinstance(device, int) and not isinstance(
        device, bool) else device


def _parse_to(memory: Memory, *args: Any, **kwargs: Any) -> Any:
    """``Module.to``'s parse of its arguments: the device as given (``device=
    "cuda"`` too, an index, or a device tensor's), which the module then
    passes to each tensor's ``to``."""
    if "device" in kwargs:
        kwargs["device"] = _index(kwargs["device"])
    if args:
        args = (_index(args[0]), *args[1:])
    parsed = torch._C._nn._parse_to(*args, **kwargs)
    if args and isinstance(args[0], torch.Tensor) and memory.is_device(args[0]):
        return (DEVICE, *parsed[1:])
    return parsed


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
    given, rest = args, list(args)
    target = kwargs.get("device")
    where: str | int | None = "device" if target is not None else None
    if target is None and rest:
        first = rest[0]
        if isinstance(first, (str, torch.device)) or (isinstance(first, int)
                                                       and not isinstance(first, bool)):
            target, where = first, 0
        elif isinstance(first, torch.Tensor):
            target = DEVICE if memory.is_device(first) else _DEVICE_OF(first)
            rest[0] = first.dtype
    if target is None:
        return torch.Tensor.to(t, *rest, **kwargs)
    to_device = is_cuda(target)
    if not to_device and torch.device(target).type != "cpu":
        return torch.Tensor.to(t, *given, **kwargs)
    if where == "device":
        kwargs["device"] = "cpu"
    elif where == 0:
        rest[0] = "cpu"
    else:
        rest.insert(0, "cpu")
    on_device = memory.is_device(t)
    if to_device == on_device:
        return torch.Tensor.to(t, *rest, **kwargs)
    kwargs["copy"] = True
    if to_device:
        kind = DEVICE_KIND
    else:
        # torch pins the output of a non-blocking device-to-host copy.
        kind = PINNED if kwargs.get("non_blocking") or (len(rest) > 2 and rest[2]) else PAGEABLE
    return _making(memory, kind, torch.Tensor.to, t, *rest, **kwargs)


def _cuda(memory: Memory, t: torch.Tensor, device: Any = None, non_blocking: bool = False,
          **kwargs: Any) -> torch.Tensor:
    check_index(device)
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
    torch.device: _torch_device,
    torch._C._nn._parse_to: _parse_to,
    _DEVICE_OF: _device,
    cast(Any, torch.Tensor.is_cuda).__get__: _is_cuda_tensor,
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




@contextlib.contextmanager
def resizes_seen(memory: Memory) -> Iterator[None]:
    """``UntypedStorage.resize_`` tells ``memory`` (``Memory.resized``) for the
    length of a session. No op or mode sees it, yet it frees the storage's
    block and allocates another: memory-saving code (FSDP's unshard and
    reshard, activation stashing) frees memory this way, keeping the tensor."""
    resize = torch.UntypedStorage.resize_
    own = torch.UntypedStorage.__dict__.get("resize_")  # an enclosing session's

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        before = storage.nbytes()
        out = resize(storage, size)
        memory.resized(storage, before)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        if own is None:
            del torch.UntypedStorage.resize_
        else:
            torch.UntypedStorage.resize_ = own  # type: ignore[method-assign]
