"""Where an example's time goes: seconds per stage, summed in each process.

A stage entered inside another pauses it, so each process's stages add up to
its wall time from ``enable`` on, and a bar chart can stack them. Off unless
enabled: a hot path then calls a function that does nothing. ``python -m streamfuzz
bench`` enables them in its own process and, through ``ENV``, in the ranks it
starts, and reads the ranks' sums from their stats replies.

A stage left by an exception is never left: ``restart`` puts the stack back
at its base, and the top loops call it at every example.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

from streamfuzz.fuzz import env

ENV = env.STAGES
"""Set to 1 in a rank's environment to enable its counters from the start."""

# Driver stages.
HYPOTHESIS = "hypothesis"
"""Generating and shrinking: the driver's time in a campaign outside its test body."""
DRIVER = "driver"
"""The test body's own bookkeeping (labels, progress, verdicts)."""
MESSAGES = "messages"
"""Pickling, sending and unpickling the driver<->rank messages (either side)."""
WAITING = "waiting"
"""The driver blocked until every rank has answered."""
VALUE = "value"
"""The value oracle: the comparison in the driver, the output copies on a rank."""

# Rank stages.
IDLE = "idle"
"""A rank waiting for its next message."""
RUNNER = "runner"
"""A rank's example outside every stage below: the runner, the target, the ops."""
SIMULATION = "simulation"
"""CUDA on CPU's own work per call and per op (--device cpu)."""
COLLECTIVES = "collectives"
"""Collectives on simulated streams: private copies, gloo, waiting for peers."""
LIFETIME = "lifetime"
REUSE = "reuse"
HOST_WAIT = "host wait"
"""The host blocked on the GPU: the runner's final synchronize."""
GPU = "gpu"
"""Device time, not host time (outside the stack): from an event recorded on
the main stream as an example starts to the last of its streams' work."""

_totals: dict[str, float] = {}
_stack: list[str] = []
_mark = 0.0
enabled = False


def _enter(name: str) -> None:
    global _mark
    now = perf_counter()
    if _stack:
        top = _stack[-1]
        _totals[top] = _totals.get(top, 0.0) + now - _mark
    _stack.append(name)
    _mark = now


def _leave() -> None:
    global _mark
    if len(_stack) > 1:  # the base is never left
        now = perf_counter()
        top = _stack.pop()
        _totals[top] = _totals.get(top, 0.0) + now - _mark
        _mark = now


def _off(*_: object) -> None:
    return None


enter: Callable[[str], None] = _off
"""``enter(stage)``: pause the current stage and start ``stage``."""
leave: Callable[[], None] = _off
"""End the current stage and resume the one it paused."""


def restart(base: str) -> None:
    """Close every open stage and carry on in ``base`` (an unbalanced stack,
    left by an exception, ends here)."""
    global _mark
    if not enabled:
        return
    now = perf_counter()
    if _stack:
        top = _stack[-1]
        _totals[top] = _totals.get(top, 0.0) + now - _mark
    _stack[:] = [base]
    _mark = now


def add(name: str, seconds: float) -> None:
    """Count ``seconds`` under ``name`` outside the stack (device time)."""
    if enabled:
        _totals[name] = _totals.get(name, 0.0) + seconds


def enable(base: str) -> None:
    """Start counting in ``base``."""
    global enabled, enter, leave, _mark
    enabled, enter, leave = True, _enter, _leave
    _stack[:] = [base]
    _mark = perf_counter()


def disable() -> None:
    """Stop counting (the sums so far stay)."""
    global enabled, enter, leave
    restart(_stack[0] if _stack else IDLE)
    enabled, enter, leave = False, _off, _off


def totals() -> dict[str, float]:
    """Seconds per stage so far, the open stages counted up to now."""
    out = dict(_totals)
    if enabled and _stack:
        top = _stack[-1]
        out[top] = out.get(top, 0.0) + perf_counter() - _mark
    return {k: v for k, v in out.items() if v}


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The seconds per stage between two ``totals``."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def from_env() -> None:
    """Count from now when ``ENV`` says so: at import, and again as a rank
    starts (a forked one imported this module in another process, earlier)."""
    if env.text(ENV) == "1":
        _totals.clear()
        enable(IDLE)


from_env()
