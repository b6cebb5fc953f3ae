"""The gate kernel as PTX, loaded and launched through the CUDA driver API.

The same kernel as ``streamfuzz.fuzz._gate_kernel`` (one thread polls the flag with
volatile loads until it is set or the bound runs out, then writes 1 or 2 into
the word after it), without Triton: the driver turns PTX into the device's
code in milliseconds, where Triton's first compile in a process (its cache
key, the kernel, a launcher built with the C compiler) took most of a second
of every CUDA rank's start, and a launch is one ``cuLaunchKernel`` call.

Loaded into the device's primary context, torch's, once torch has made it
current (after the first CUDA tensor). A thread that has not touched CUDA yet
has no current context; a launch from one makes the primary context current.
"""

from __future__ import annotations

import ctypes
from typing import Any

_PTX = rb"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry streamfuzz_gate(.param .u64 slot, .param .u64 max_ns, .param .u64 max_polls)
{
    .reg .pred %p<8>;
    .reg .b32 %flag, %status;
    .reg .b64 %ptr, %bound, %limit, %last, %now, %step, %waited, %polls;

    ld.param.u64 %ptr, [slot];
    ld.param.u64 %bound, [max_ns];
    ld.param.u64 %limit, [max_polls];
    mov.u64 %last, %globaltimer;
    mov.u64 %waited, 0;
    mov.u64 %polls, 0;
    ld.volatile.u32 %flag, [%ptr];
POLL:
    setp.ne.u32 %p1, %flag, 0;
    @%p1 bra DONE;
    setp.ge.u64 %p2, %waited, %bound;
    @%p2 bra DONE;
    setp.ge.u64 %p3, %polls, %limit;
    @%p3 bra DONE;
    ld.volatile.u32 %flag, [%ptr];
    mov.u64 %now, %globaltimer;
    sub.s64 %step, %now, %last;
    mov.u64 %last, %now;
    // Only plausible steps count: the timer may be re-synchronized with the host's clock.
    setp.gt.s64 %p4, %step, 0;
    setp.lt.s64 %p5, %step, 1000000;
    and.pred %p6, %p4, %p5;
    @%p6 add.s64 %waited, %waited, %step;
    add.s64 %polls, %polls, 1;
    bra POLL;
DONE:
    setp.ne.u32 %p7, %flag, 0;
    selp.u32 %status, 1, 2, %p7;
    st.volatile.u32 [%ptr+4], %status;
    ret;
}
"""
_NAME = b"streamfuzz_gate"
_INVALID_CONTEXT = 201


class PtxGate:
    """The loaded kernel; ``launch`` queues one gate on a raw stream handle."""

    def __init__(self, device: int) -> None:
        cuda = ctypes.CDLL("libcuda.so.1")
        self._launch = cuda.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 6, ctypes.c_uint,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        module, self._function = ctypes.c_void_p(), ctypes.c_void_p()
        log = ctypes.create_string_buffer(4096)
        # JIT options: CU_JIT_ERROR_LOG_BUFFER (5) and its size (6), so a refusal says why.
        opts = (ctypes.c_int * 2)(5, 6)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p).value, 4096)
        check(cuda, cuda.cuModuleLoadDataEx(ctypes.byref(module), ctypes.c_char_p(_PTX), 2,
                                             opts, vals), "cuModuleLoadDataEx", log.value)
        check(cuda, cuda.cuModuleGetFunction(ctypes.byref(self._function), module, _NAME),
               "cuModuleGetFunction")
        self._cuda = cuda
        self._module = module  # never unloaded: one per process, as long as the pool
        handle, self._context = ctypes.c_int(), ctypes.c_void_p()
        check(cuda, cuda.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
        check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self._context), handle),
               "cuDevicePrimaryCtxRetain")

    def launch(self, stream: int, slot_address: int, max_ns: int, max_polls: int) -> None:
        values = (ctypes.c_uint64 * 3)(slot_address, max_ns, max_polls)
        params = (ctypes.c_void_p * 3)(*(ctypes.addressof(values) + 8 * i for i in range(3)))
        result = self._launch(self._function, 1, 1, 1, 1, 1, 1, 0, stream, params, None)
        if result == _INVALID_CONTEXT:  # a thread's first CUDA call
            check(self._cuda, self._cuda.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            result = self._launch(self._function, 1, 1, 1, 1, 1, 1, 0, stream, params, None)
        check(self._cuda, result, "cuLaunchKernel")


def check(cuda: Any, result: int, call: str, log: bytes = b"") -> None:
    """Raise, naming the driver's error, where a driver call returned one."""
    if result:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(result, ctypes.byref(name))
        detail = f": {log.decode(errors='replace').strip()}" if log.strip() else ""
        raise RuntimeError(f"{call} failed with {(name.value or b'?').decode()} ({result}){detail}")


def load(device: int) -> PtxGate:
    """The kernel, loaded into the current CUDA context (``device``'s primary
    one); raises where the driver refuses it."""
    return PtxGate(device)
