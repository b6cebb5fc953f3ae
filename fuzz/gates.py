"""Gates: hold a CUDA stream until the host, or another stream, opens it.

A spin (``torch.cuda._sleep``) only makes an interleaving likely: the held
stream resumes after a fixed time, whatever the host has queued meanwhile. A
gate is a one-warp kernel polling a flag in host-mapped pinned memory, so the
held stream resumes exactly when the flag is set: by the host
(``Gate.release``) or by a copy queued on another stream (``Gate.release_after``),
which orders the held stream after that stream's work up to that point.

Every gate is bounded (a wall-clock bound via ``%globaltimer``, or a polling
bound where Triton lacks the timer): a gate nobody opens — say the opening
stream itself waits on the held one — times out instead of hanging the run,
and reports that it did. The kernel is PTX loaded through the driver API
(``streamfuzz.fuzz._gate_ptx``: no compile to wait for), else Triton's
(``streamfuzz.fuzz._gate_kernel``);
``Gates.create`` raises ``GateUnavailable`` where neither passes its
self-test, and callers fall back to spins.

One thing opens every gate late: under CUDA's lazy module loading (the
default), a kernel's first launch in a process waits for every running
kernel, so a gate held across it runs out its bound. Measured on an H200:
the first ``torch.cuda._sleep`` queued behind a held gate timed it out. Ranks
therefore launch the harness's kernels once at start, and the driver re-runs
a clean example whose gate timed out.

A host sync opens the gates it would wait for. ``stream.synchronize()``,
``event.synchronize()``, ``torch.cuda.synchronize()``, ``.item()``,
``.tolist()`` and blocking copies to the host all report themselves to
``torch.cuda._gpu_trace`` before they block; the pool follows which gates
each stream's and event's work waits behind (holds, ``release_after``, event
record and wait, which ``wait_stream`` is) and opens, from the host, those
the sync would wait for. That keeps the gate's meaning: a gate delays its
stream until a later point of the program, and a program that waits for the
stream now cannot reach that point before the stream's work is done, so no
interleaving it can have is lost; without this the host would wait out the
bound, and the example would run twice. Gates the sync does not wait for
stay closed.

The program can make a gate's opener wait for the gate too: a stream that
is to open a gate waits (``wait_event``, ``wait_stream``, a collective's
handle) on work behind it, directly or through events recorded behind it;
or the host, which opens gates too, polls ``query()`` in a loop. Either
would hold until the bound, so each opens the gate at that moment: the
interleaving stays forced up to the point where the program itself orders
the two streams. A single poll that says "not done" keeps its gates (the
path for work still in flight is forced); the second in a row of the same
event or stream opens them. A wait the trace does not see (another process,
a driver call of one's own) still runs to the bound, which is then counted
and reported (``gate-timeout``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from streamfuzz.fuzz import env
from streamfuzz.fuzz.dispatch_mode import unobserved
from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.frames import user_code

DEFAULT_BOUND_MS = 200.0
KINDS = ("wait", "ptx", "triton", "triton-polls")
"""The gates, in the order they are tried: the driver's stream wait
(``streamfuzz.fuzz._gate_wait``: nothing runs on the GPU while held), then the kernels."""
KINDS_ENV = env.GATES
"""Where set (``ptx,triton``), the kinds to try instead: a benchmark compares them."""
_SLOTS = 1024
_RELEASED, _TIMED_OUT = 1, 2
# Polling host memory takes about a microsecond a load over PCIe; generous on purpose.
_POLLS_PER_MS = 2_000
# The timed kernel's last resort, should its timer stop: no poll takes under 50 ns.
_MAX_POLLS_PER_MS = 20_000


class GateUnavailable(FuzzError, RuntimeError):
    """No gates here (no GPU, or no kernel passed the self-test); use spins."""


class _Ptr:
    """What Triton needs to pass a raw device address as an ``int32*`` argument."""

    dtype = torch.int32

    def __init__(self, address: int) -> None:
        self._address = address

    def data_ptr(self) -> int:
        return self._address


class _Waits:
    """Which gates the work queued so far on each stream, and each recorded
    event, waits behind: what a host sync on it would wait for.

    Pure bookkeeping on stream and event handles (ints), so it is tested
    without a GPU. A gate opened by ``release_after`` still waits for what
    the opening stream waited behind when the opening copy was queued.
    """

    def __init__(self) -> None:
        self._streams: dict[int, set[Any]] = {}
        self._events: dict[int, set[Any]] = {}
        self._after: dict[Any, frozenset[Any]] = {}
        self._held: list[Any] = []

    def hold(self, gate: Any, stream: int) -> None:
        self._streams.setdefault(stream, set()).add(gate)
        self._held.append(gate)

    def opened(self, gate: Any) -> None:
        """Opened from the host: it waits for nothing any more."""
        self._after.pop(gate, None)

    def opened_after(self, gate: Any, stream: int) -> None:
        self._after[gate] = frozenset(self._streams.get(stream, ()))

    def record(self, event: int, stream: int) -> None:
        self._events[event] = set(self._streams.get(stream, ()))

    def wait(self, stream: int, event: int) -> list[Any]:
        """``stream`` waits for ``event``: the closed gates that stream is to
        open and now waits behind, which it could never open (see ``Gates``)."""
        got = self._events.get(event)
        if not got:
            return []
        self._streams.setdefault(stream, set()).update(got)
        return [g for g in self._closed(got) if g.opener == stream]

    def forget(self, event: int) -> None:
        self._events.pop(event, None)

    def for_stream(self, stream: int) -> list[Any]:
        return self._closed(self._streams.get(stream, ()))

    def for_event(self, event: int) -> list[Any]:
        return self._closed(self._events.get(event, ()))

    def for_device(self) -> list[Any]:
        return [g for g in self._held if not g.opened]

    def _closed(self, gates: Iterable[Any]) -> list[Any]:
        """The gates not yet opened among ``gates`` and those their openers wait behind."""
        out, seen, todo = [], set(), list(gates)
        while todo:
            g = todo.pop()
            if g in seen:
                continue
            seen.add(g)
            if not g.opened:
                out.append(g)
            else:
                todo.extend(self._after.get(g, ()))
        return out

    def clear(self) -> None:
        self._streams.clear()
        self._events.clear()
        self._after.clear()
        self._held.clear()


class Gate:
    """One held stream. Open it once, from the host or from a stream."""

    def __init__(self, pool: Gates, slot: int, stream: Any, opener: int | None = None) -> None:
        self._pool = pool
        self.slot = slot
        self.stream = stream
        self.opener = opener
        """The handle of the stream that is to open it (None: the host)."""
        self.opened = False
        self.opened_early = ""
        """What opened it before its point, where the program waited for it first."""

    def release(self) -> None:
        """Open now, from the host: the held stream resumes within microseconds."""
        with unobserved():
            self._pool._flags[self.slot, 0] = 1
        self.opened = True
        with self._pool._lock:
            self._pool._waits.opened(self)

    def release_after(self, stream: Any) -> None:
        """Open when ``stream`` reaches this point: a 4-byte copy queued on it
        (nothing, where the program's own wait opened it already)."""
        if self.opened:
            return
        with self._pool._lock:
            self._pool._waits.opened_after(self, stream.cuda_stream)
        with torch.cuda.stream(stream), unobserved():
            self._pool._flag_views[self.slot].copy_(self._pool._one, non_blocking=True)
        self.opened = True

    @property
    def timed_out(self) -> bool:
        """Read after the gate's stream has been synchronized."""
        return self._pool.timed_out(self.slot)


class Gates:
    """A pool of gate slots for one device; ``reset`` after every synchronize."""

    def __init__(self, device: torch.device, kernel: Any, kind: str, bound_ms: float) -> None:
        self.device = device
        self.kind = kind
        self._kernel = kernel
        timed = kind != "triton-polls"
        self._bound: tuple[int, ...] = ((int(bound_ms * 1e6), int(bound_ms * _MAX_POLLS_PER_MS))
                                        if timed else (int(bound_ms * _POLLS_PER_MS),))
        # Each slot is 16 bytes: [flag, status, pad, pad]. Aligned slots keep one
        # compiled specialization for every slot.
        self._slots = torch.zeros((_SLOTS, 4), dtype=torch.int32, pin_memory=True)
        self._flag_views = [self._slots[i, 0:1] for i in range(_SLOTS)]
        self._base = self._slots.data_ptr()
        self._one = torch.ones(1, dtype=torch.int32, device=device)
        self._next = 0
        self._init_waits()
        try:
            import numpy as np  # noqa: F401 - host writes through numpy cost ~0.2 us

            self._flags: np.ndarray | torch.Tensor = self._slots.numpy()
        except (ImportError, RuntimeError):
            self._flags = self._slots

    def _init_waits(self) -> None:
        self._waits = _Waits()
        self._lock = threading.RLock()
        self.opened_by_sync = 0
        """Gates a host sync opened (see the module docstring), since the pool was made."""
        self.opened_by_wait = 0
        """Gates their own opening stream's wait opened (see the module docstring)."""
        self.opened_by_poll = 0
        """Gates a host polling in a loop opened (see the module docstring)."""
        self._polled: tuple[str, int] | None = None
        self.hooked = False
        """Whether host syncs open gates here (the trace callbacks are installed)."""

    @classmethod
    def create(cls, device: torch.device, bound_ms: float = DEFAULT_BOUND_MS,
               kinds: Iterable[str] | None = None) -> Gates:
        """Load the first kind of ``kinds`` that proves a gate holds and opens; else raise."""
        if device.type != "cuda" or not torch.cuda.is_available():
            raise GateUnavailable("gates need a CUDA device")
        if kinds is None:
            kinds = _kinds_from_env()
        errors: list[str] = []
        for kind, kernel in _kernels(device, frozenset(kinds), errors):
            try:
                gates = cls(device, kernel, kind, bound_ms)
                gates._self_test()
                gates.hooked = _hook(gates)
                return gates
            except Exception as exc:  # a compile or launch error: try the next one
                errors.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
        raise GateUnavailable("; ".join(errors))

    def hold(self, stream: Any, opener: Any = None) -> Gate | None:
        """Hold ``stream`` from now on, to be opened by ``opener`` (a stream,
        or None: the host); None when every slot of this example is used."""
        slot = self._slot()
        if slot is None:
            return None
        gate = Gate(self, slot, stream, opener.cuda_stream if opener is not None else None)
        with self._lock:
            self._waits.hold(gate, stream.cuda_stream)
        if self.kind in ("wait", "ptx"):
            self._kernel.launch(stream.cuda_stream, self._base + 16 * slot, *self._bound)
        else:
            with torch.cuda.stream(stream):
                self._kernel[(1,)](_Ptr(self._base + 16 * slot), *self._bound, num_warps=1)
        return gate

    def hold_for(self, stream: Any, cycles: int) -> bool:
        """Hold ``stream`` for as long as ``cycles`` GPU cycles take, running
        nothing (a spin's delay, leaving the GPU to other work and other
        processes); False where this kind cannot, or every slot is used: spin.

        Not a gate the program's waits open: a host sync waits it out, as it
        would a spin."""
        slot = self._slot() if self.kind == "wait" else None
        if slot is None:
            return False
        self._kernel.launch_for(stream.cuda_stream, self._base + 16 * slot,
                                cycles / self._kernel.cycles_per_s)
        return True

    def _slot(self) -> int | None:
        """The next free slot of this example, taken; None when all are used."""
        if self._next >= _SLOTS:
            return None
        self._next += 1
        return self._next - 1

    @property
    def used(self) -> int:
        """Slots handed out since the last ``reset``."""
        return self._next

    def timed_out(self, slot: int) -> bool:
        """Whether the gate in ``slot`` ran out its bound; read after a synchronize."""
        return int(self._flags[slot, 1]) == _TIMED_OUT

    def finish_example(self) -> bool:
        """After the example's final synchronize: whether any gate ran out its
        bound (its interleaving was not forced); then the slots are free again."""
        timed_out = any(self.timed_out(slot) for slot in range(self._next))
        self.reset()
        return timed_out

    def reset(self) -> None:
        """Clear the used slots; only once every gate's stream has been synchronized."""
        if self._next:
            if self.kind == "wait":
                self._kernel.clear()
            with unobserved():
                self._slots[: self._next].zero_()
            self._next = 0
        with self._lock:
            self._waits.clear()
            self._polled = None

    # -- trace callbacks: a host sync opens the gates it would wait for ----------
    def _on_sync(self, which: str, *handle: int) -> None:
        with self._lock:
            due = getattr(self._waits, which)(*handle)
            for g in due:
                g.release()
            self.opened_by_sync += len(due)

    def _on_record(self, event: int, stream: int) -> None:
        with self._lock:
            self._waits.record(event, stream)

    def _on_wait(self, event: int, stream: int) -> None:
        with self._lock:
            due = self._waits.wait(stream, event)
            for g in due:
                g.opened_early = "a wait of its opening stream"
                g.release()
            self.opened_by_wait += len(due)

    def _on_poll(self, which: str, handle: int) -> None:
        """A poll that said "not done" of work behind closed gates: a second
        one in a row is a host waiting in a loop, which the gates' openers
        (later in the program) cannot reach, so they open now. One poll alone
        keeps the gates: the path for work still in flight is forced."""
        with self._lock:
            due = getattr(self._waits, which)(handle)
            if not due:
                return
            key = (which, handle)
            if self._polled != key:
                self._polled = key
                return
            self._polled = None
            for g in due:
                g.opened_early = "the host polling it in a loop"
                g.release()
            self.opened_by_poll += len(due)

    def _on_event_deleted(self, event: int) -> None:
        with self._lock:
            self._waits.forget(event)

    def _first_gate(self, stream: Any) -> Gate:
        g = self.hold(stream)
        assert g is not None  # a fresh or reset pool has every slot free
        return g

    def _self_test(self) -> None:
        main = torch.cuda.current_stream(self.device)
        other = torch.cuda.Stream(self.device)
        # Compile and run once, opened by the host.
        g = self._first_gate(main)
        g.release()
        torch.cuda.synchronize(self.device)
        if g.timed_out:
            raise GateUnavailable("a gate opened by the host reported a timeout")
        self.reset()
        # It must hold: work queued behind it stays queued until it is opened.
        g = self._first_gate(main)
        behind = torch.cuda.Event()
        behind.record(main)
        time.sleep(0.005)
        held = not behind.query()
        # Opened from another stream, in that stream's order.
        g.release_after(other)
        torch.cuda.synchronize(self.device)
        timed_out = g.timed_out
        self.reset()
        if not held:
            raise GateUnavailable("a gate did not hold its stream")
        if timed_out:
            raise GateUnavailable("a gate opened from a stream reported a timeout")


def _kinds_from_env() -> tuple[str, ...]:
    text = env.text(KINDS_ENV).strip()
    if not text:
        return KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise GateUnavailable(f"{KINDS_ENV}={text!r}: no gate kind {unknown[0]!r} "
                              f"(choose from {', '.join(KINDS)})")
    return kinds


def _kernels(device: torch.device, kinds: frozenset[str],
             errors: list[str]) -> Iterable[tuple[str, Any]]:
    """The gates to try, best first: the driver's stream wait (no kernel at
    all), the PTX kernel (no compile to speak of), then Triton's timed one and
    its polling one (where Triton lacks the timer). Each one that cannot even
    load says why in ``errors``."""
    if "wait" in kinds:
        try:
            from streamfuzz.fuzz import _gate_wait

            with torch.cuda.device(device):
                torch.empty(1, device=device)  # the device's context, current on this thread
                wait = _gate_wait.StreamWaitGate(torch.cuda.current_device(), _TIMED_OUT)
        except Exception as exc:  # no such driver entry point
            errors.append(f"wait: {type(exc).__name__}: {str(exc)[:200]}")
        else:
            yield "wait", wait
    ptx = None
    if "ptx" in kinds:
        try:
            from streamfuzz.fuzz import _gate_ptx

            with torch.cuda.device(device):
                torch.empty(1, device=device)  # the device's context, current on this thread
                ptx = _gate_ptx.load(torch.cuda.current_device())
        except Exception as exc:  # no libcuda symbol, or the driver refused the PTX
            errors.append(f"ptx: {type(exc).__name__}: {str(exc)[:200]}")
    if ptx is not None:
        yield "ptx", ptx
    if not kinds & {"triton", "triton-polls"}:
        return
    try:
        from streamfuzz.fuzz import _gate_kernel as k
    except ImportError as exc:
        errors.append(f"triton: not importable ({exc})")
        return
    if k._now is not None and "triton" in kinds:
        yield "triton", k.gate_timed
    if "triton-polls" in kinds:
        yield "triton-polls", k.gate_polls


_POOLS: list[weakref.ref[Gates]] = []
"""The live pools (a rank has one). A plain list: every traced event record
and wait of the process comes through ``_each``, where a ``WeakSet``'s
iteration guard cost more than the pool's own work."""
_HOOKED = False


def _each(method: str, *args: Any) -> None:
    """A trace callback, for each pool that has held a gate since its last
    reset: every record, wait and deletion of the process comes through here,
    and a pool with no gate held has nothing to follow (its bookkeeping is empty)."""
    for ref in _POOLS:
        pool = ref()
        if pool is not None and pool._next:
            getattr(pool, method)(*args)


_OWN = str(Path(__file__).resolve().parent) + os.sep
"""streamfuzz's own files (the lifetime checker wraps ``query`` too)."""


def _polling(method: Any, which: str, handle: str) -> Any:
    """``query`` of an event or a stream: a "not done" from the program's own
    code (not the harness's polls) is told to every pool (``Gates._on_poll``)."""

    def query(self: Any) -> bool:
        done = method(self)
        if not done and _POOLS:
            caller: FrameType | None = sys._getframe(1)
            while caller is not None and caller.f_code.co_name == "query" \
                    and caller.f_code.co_filename.startswith(_OWN):
                caller = caller.f_back  # another of the harness's wrappers of query
            if caller is not None and user_code(caller.f_code.co_filename):
                _each("_on_poll", which, getattr(self, handle))
        return done
    query.__name__ = query.__qualname__ = "query"
    return query


def _hook(pool: Gates) -> bool:
    """Forward the trace's sync, event record/wait and event deletion callbacks
    to every live pool (registered once per process); False where the trace
    is missing, and host syncs then wait out the bound as before."""
    global _HOOKED, _POOLS
    if not _HOOKED:
        try:
            from torch.cuda import _gpu_trace as trace

            trace.register_callback_for_event_record(lambda e, s: _each("_on_record", e, s))
            trace.register_callback_for_event_wait(lambda e, s: _each("_on_wait", e, s))
            trace.register_callback_for_event_deletion(lambda e: _each("_on_event_deleted", e))
            trace.register_callback_for_stream_synchronization(
                lambda s: _each("_on_sync", "for_stream", s))
            trace.register_callback_for_event_synchronization(
                lambda e: _each("_on_sync", "for_event", e))
            trace.register_callback_for_device_synchronization(
                lambda: _each("_on_sync", "for_device"))
            torch._C._activate_gpu_trace()
            # Patched on purpose: a host that polls in a loop opens its gates.
            torch.cuda.Event.query = _polling(  # type: ignore[method-assign]
                torch.cuda.Event.query, "for_event", "cuda_event")
            torch.cuda.Stream.query = _polling(  # type: ignore[method-assign]
                torch.cuda.Stream.query, "for_stream", "cuda_stream")
        except Exception:  # no usable trace in this torch: gates work as before
            return False
        _HOOKED = True
    # A new list, never changed in place: a callback may be iterating the old one.
    _POOLS = [*(r for r in _POOLS if r() is not None and r() is not pool), weakref.ref(pool)]
    return True
