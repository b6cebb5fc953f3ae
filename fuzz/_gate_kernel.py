"""The gate kernels (Triton). Imported only where Triton and a GPU are present.

One program, one warp: it polls a flag in host-mapped pinned memory with
volatile loads (each one goes to memory, never to a cached copy) until the flag
is set, or the bound runs out, then writes 1 (released) or 2 (timed out) into
the word after the flag, so the host can tell which.

The wall-clock bound adds up the steps of ``%globaltimer`` between polls and
counts only plausible ones (a poll takes about a microsecond): the driver may
re-synchronize that timer with the host clock, and a jump must neither end a
gate early nor keep it forever. A polling bound stays as the last resort
should the timer stop advancing.
"""

import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import globaltimer as _now
except ImportError:  # an old or non-CUDA Triton: only the polling bound is left
    _now = None

_MAX_STEP_NS = tl.constexpr(1_000_000)


@triton.jit
def gate_timed(slot_ptr, max_ns, max_polls):  # noqa: ANN001 - Triton reads annotations as types
    last = _now()
    waited = last - last
    polls = 0
    flag = tl.load(slot_ptr, volatile=True)
    while (flag == 0) & (waited < max_ns) & (polls < max_polls):
        flag = tl.load(slot_ptr, volatile=True)
        now = _now()
        step = now - last
        waited += tl.where((step > 0) & (step < _MAX_STEP_NS), step, 0)
        last = now
        polls += 1
    tl.store(slot_ptr + 1, tl.where(flag != 0, 1, 2))


@triton.jit
def gate_polls(slot_ptr, max_polls):  # noqa: ANN001
    flag = tl.load(slot_ptr, volatile=True)
    polls = 0
    while (flag == 0) & (polls < max_polls):
        flag = tl.load(slot_ptr, volatile=True)
        polls += 1
    tl.store(slot_ptr + 1, tl.where(flag != 0, 1, 2))
