"""The pointer-reuse signal (CUDA ranks only): the oracle of PyTorch's own
``record_stream`` test, applied to a whole handler.

While the handler runs, a dispatch mode notes every CUDA storage that an op
touches on a stream other than the main stream, with an event recorded on that
stream right after the op. Afterwards, every main-stream allocation the runner
sees is compared with those storages: an allocation that overlaps one whose
event has not completed got a block whose earlier tenant is still in use by
unfinished work on another stream. That is a finding even when the values
happened to come out right: the next run, or the next fill, corrupts them.

A busy block is harmless where the main stream is ordered after the work
that uses it (it waited for that stream's event, or the host synchronized
with it): whatever main does with the new tenant runs after the old
tenant's last use. Where the lifetime oracle runs beside it, its clocks say
so, and such a reuse is no finding; alone, the watch judges by time only.

What it sees: every op of the handler call (arguments flattened, so index
tensors inside lists count); allocations made by ops on the main stream during
the call, and the runner's own main-stream allocations (batch tensors, churn).
What it does not see: allocations made outside the call by code other than the
runner, work queued on other streams outside the call, and reuse after the
other stream's work has finished (that is harmless). A block protected by
``record_stream`` is never handed out early by the allocator, so it never
triggers; blocks allocated on another stream live in that stream's pool and
never reach main.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from streamfuzz.fuzz import stages
from streamfuzz.fuzz.dispatch_mode import RECORD_STREAM, DispatchMode, current_stream_handle, run_op
from streamfuzz.fuzz.oracles.lifetime_messages import internal_error
from streamfuzz.fuzz.tensors import tensors_in
from streamfuzz.fuzz.verdict import Failure

_MAKES_BLOCKS: dict[Any, bool] = {}
"""Per op overload: may its results be new blocks (not views, not in place)?
Read from the schema once, not at every op."""


def _makes_blocks(func: Any) -> bool:
    made = _MAKES_BLOCKS.get(func)
    if made is None:
        made = _MAKES_BLOCKS[func] = all(r.alias_info is None for r in func._schema.returns)
    return made


class ReuseWatch:
    """One example's watch on one rank; ``findings`` are built here, on the rank."""

    def __init__(self, main: Any, rank: int) -> None:
        self.main = main
        self.rank = rank
        self.step: int | None = None
        # (start, end, event, step, op name, stream handle, its clock at the use)
        # of storages used off main.
        self._used: list[tuple[int, int, Any, int | None, str, int, int]] = []
        self.findings: list[Failure] = []
        self._seen: set[tuple[int | None, int]] = set()
        self._main_handle = main.cuda_stream
        self._streams: dict[int, Any] = {}
        """Stream objects by raw handle: an op's stream is read as a handle."""
        self._shared: Any = None
        self._broken = False
        """A bug of the watch's own was met: one finding says so, and it watches no more."""

    def share(self, mode: Any) -> None:
        """Watch from ``mode`` (the lifetime oracle's, which has a ``reuse``
        slot) instead of a mode of its own: one trip into Python per op for both."""
        self._shared = mode

    def call(self) -> contextlib.AbstractContextManager:
        """What to run the handler call under."""
        if self._shared is not None:
            return _Shared(self._shared, self)
        return _Mode(self)

    def check(self, t: torch.Tensor, what: str) -> None:
        """``t`` was just allocated on the main stream: did it get a busy block?"""
        if not self._used or self._broken or not t.is_cuda:
            return
        try:
            self._check(t, what)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        # Raised into the runner or the handler, it would read as the target's crash.
        self._broken = True
        self.findings.append(internal_error("reuse", exc, self.rank, self.step))

    def _check(self, t: torch.Tensor, what: str) -> None:
        s = t.untyped_storage()
        start = s.data_ptr()
        end = start + max(1, s.nbytes())
        live = []
        for entry in self._used:
            lo, hi, event, step, op, stream, tick = entry
            if event.query():
                continue  # that stream's use is over: reusing the block is safe
            live.append(entry)
            if lo < end and start < hi and (step, lo) not in self._seen \
                    and not self._main_after(stream, tick):
                self._seen.add((step, lo))
                self.findings.append(Failure(
                    "reuse", f"step {self.step}: a main-stream allocation ({what}) got the "
                             f"block at {start:#x} while {op} of step {step}, queued on "
                             f"another stream, still used its earlier tenant (freed "
                             f"without record_stream on that stream)", self.rank, self.step))
        self._used = live

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """One op of the handler call, just issued on the current stream."""
        if self._broken:
            return
        stages.enter(stages.REUSE)
        try:
            self._observe(func, args, kwargs, out)
        except Exception as exc:
            self._failed(exc)
        finally:
            stages.leave()

    def _observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        handle = current_stream_handle(self.main.device)
        if handle == self._main_handle:
            if not self._used or not _makes_blocks(func):
                return  # nothing off main to collide with, or a view / in-place result
            for t in tensors_in(out):
                if t.is_cuda:
                    self._check(t, f"output of {func.__name__}")
            return
        used = [t for t in tensors_in(args) if t.is_cuda]
        if kwargs:
            used += [t for t in tensors_in(list(kwargs.values())) if t.is_cuda]
        if used:
            self._note(func.__name__, used, self._stream(handle))

    def _stream(self, handle: int) -> Any:
        s = self._streams.get(handle)
        if s is None:
            s = self._streams[handle] = torch.cuda.current_stream(self.main.device)
        return s

    def _note(self, op: str, tensors: list[torch.Tensor], stream: Any) -> None:
        event = torch.cuda.Event()
        event.record(stream)
        handle = stream.cuda_stream
        model = self._model()
        tick = model.clocks.get(handle, {}).get(handle, 0) if model is not None else 0
        for t in tensors:
            s = t.untyped_storage()
            lo = s.data_ptr()
            self._used.append((lo, lo + max(1, s.nbytes()), event, self.step, op, handle, tick))

    def _model(self) -> Any:
        """The lifetime oracle's model, where it runs beside the watch (``share``)."""
        checker = getattr(self._shared, "checker", None)
        return checker.model if checker is not None else None

    def _main_after(self, stream: int, tick: int) -> bool:
        """Whether work main queues from now on runs after ``stream``'s use at
        ``tick``: main waited for it, or the host synchronized with it."""
        model = self._model()
        if model is None or not tick:
            return False
        seen = max(model.clocks.get(self._main_handle, {}).get(stream, 0),
                   model.host.get(stream, 0))
        return seen >= tick


class _Shared:
    """The handler call watched from another mode's ``reuse`` slot."""

    __slots__ = ("mode", "watch")

    def __init__(self, mode: Any, watch: ReuseWatch) -> None:
        self.mode, self.watch = mode, watch

    def __enter__(self) -> None:
        self.mode.reuse = self.watch

    def __exit__(self, *exc: object) -> None:
        self.mode.reuse = None


class _Mode(DispatchMode):
    def __init__(self, watch: ReuseWatch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = run_op(func, args, kwargs)
        if func is not RECORD_STREAM:
            self.watch.observe(func, args, kwargs, out)
        return out
