"""A gate without a kernel: the driver's stream-memory wait on the gate's flag.

A gate kernel keeps a warp running for as long as its stream is held, so the
GPU counts as busy, and another process sharing it (another world) waits for
its time slice. ``cuStreamWaitValue32`` holds the stream in the GPU's front
end instead: nothing runs while it waits, and the flag is the same slot of
host-mapped pinned memory the kernels poll, so ``Gate.release`` and
``Gate.release_after`` open it unchanged.

The wait itself has no bound, so the bound is the host's: a watchdog thread
opens a gate nobody opened within it and marks it timed out, exactly as the
kernels' own timer does. Every call that waits for a held stream (a
synchronize, a blocking copy, a collective's wait) releases the GIL in torch,
so the watchdog runs while the program waits.
"""

from __future__ import annotations

import ctypes
import heapq
import threading
import time

from streamfuzz.fuzz._gate_ptx import check as _check

_CLOCK_RATE_KHZ = 13
"""CU_DEVICE_ATTRIBUTE_CLOCK_RATE: the SM clock a spin's cycles are counted in."""
_WAIT_GEQ = 0x0
"""CU_STREAM_WAIT_VALUE_GEQ: go on once the flag is 1 (opened) or more."""
_INVALID_CONTEXT = 201


class StreamWaitGate:
    """``launch`` queues one held point on a raw stream handle, as the PTX
    kernel's does; the watchdog opens it after ``max_ns``."""

    def __init__(self, device: int, timed_out: int) -> None:
        cuda = ctypes.CDLL("libcuda.so.1")
        wait = None
        for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
            wait = getattr(cuda, name, None)
            if wait is not None:
                break
        if wait is None:
            raise RuntimeError("this driver has no cuStreamWaitValue32")
        wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        self._wait = wait
        self._cuda = cuda
        handle, self._context = ctypes.c_int(), ctypes.c_void_p()
        _check(cuda, cuda.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
        _check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self._context), handle),
               "cuDevicePrimaryCtxRetain")
        clock = ctypes.c_int()
        _check(cuda, cuda.cuDeviceGetAttribute(ctypes.byref(clock), _CLOCK_RATE_KHZ, handle),
               "cuDeviceGetAttribute")
        self.cycles_per_s = clock.value * 1e3
        self._watchdog = _Watchdog(timed_out)

    def launch(self, stream: int, slot_address: int, max_ns: int, max_polls: int) -> None:
        del max_polls  # the watchdog's clock is the host's
        self._hold(stream, slot_address, max_ns / 1e9, timed=False)

    def launch_for(self, stream: int, slot_address: int, seconds: float) -> None:
        """Hold the stream for ``seconds`` from now, then let it go: a spin
        that runs nothing. Its end is no timeout."""
        self._hold(stream, slot_address, seconds, timed=True)

    def _hold(self, stream: int, slot_address: int, seconds: float, timed: bool) -> None:
        result = self._wait(stream, slot_address, 1, _WAIT_GEQ)
        if result == _INVALID_CONTEXT:  # a thread's first CUDA call
            _check(self._cuda, self._cuda.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            result = self._wait(stream, slot_address, 1, _WAIT_GEQ)
        _check(self._cuda, result, "cuStreamWaitValue32")
        self._watchdog.add(slot_address, time.monotonic() + seconds, timed=timed)

    def clear(self) -> None:
        """Forget the held points: their slots are about to be zeroed for reuse."""
        self._watchdog.clear()


class _Watchdog:
    """Opens, at its deadline, each held point whose flag is still 0; for a
    gate it writes the timed-out status first, so a reader after the
    synchronize sees it (a timed hold's end is its purpose, not a timeout)."""

    def __init__(self, timed_out: int) -> None:
        self._timed_out = timed_out
        self._due: list[tuple[float, int, bool]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, slot_address: int, deadline: float, timed: bool = False) -> None:
        with self._cond:
            heapq.heappush(self._due, (deadline, slot_address, timed))
            if self._due[0][1] == slot_address:  # the first due now: wake the thread
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="streamfuzz-gate-bound",
                                                daemon=True)
                self._thread.start()

    def clear(self) -> None:
        with self._cond:
            self._due.clear()

    def _run(self) -> None:
        with self._cond:
            while True:
                if not self._due:
                    self._cond.wait()
                    continue
                deadline, address, timed = self._due[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._due)
                flag = ctypes.c_int32.from_address(address)
                if flag.value == 0:
                    if not timed:
                        ctypes.c_int32.from_address(address + 4).value = self._timed_out
                    flag.value = 1

