"""The gate kernels (Triton). Imported only where Triton and a GPU are present.

One program, one warp: it polls a flag in host-mapped pinned memory with
volatile loads (each one goes to memory, never to a cached copy) until the flag
is set, or the bound runs out, then writes 1 (released) or 2 (timed out) into
the word after the flag, so the host can tell which.
"""

import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import globaltimer as _now
except ImportError:  # an old or non-CUDA Triton: only the polling bound is left
    _now = None


@triton.jit
def gate_timed(slot_ptr, max_ns):  # noqa: ANN001 - Triton reads annotations as types
    start = _now()
    flag = tl.load(slot_ptr, volatile=True)
    waited = _now() - start
    while (flag == 0) & (waited < max_ns):
        flag = tl.load(slot_ptr, volatile=True)
        waited = _now() - start
    tl.store(slot_ptr + 1, tl.where(flag != 0, 1, 2))


@triton.jit
def gate_polls(slot_ptr, max_polls):  # noqa: ANN001
    flag = tl.load(slot_ptr, volatile=True)
    polls = 0
    while (flag == 0) & (polls < max_polls):
        flag = tl.load(slot_ptr, volatile=True)
        polls += 1
    tl.store(slot_ptr + 1, tl.where(flag != 0, 1, 2))
