"""``checked()``: one block of user code run under the lifetime oracle.

The engine already has everything a block needs: simulated streams and the
lifetime checker on CPU, the CUDA adapter on a GPU. This module only picks
one, runs the block under it, and turns the oracle's findings into one
exception whose message is the oracle's own text (the fuzzer prints the same).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from streamfuzz import _group, _record
from streamfuzz._explain import hide_own_lines
from streamfuzz.fuzz.errors import CheckArgumentError, FuzzError, NestedCheckError
from streamfuzz.fuzz.verdict import Failure

hide_own_lines()  # before any block can fail inside a Hypothesis test

DEVICES = ("cpu", "cuda", "auto")
"""``cpu`` simulates CUDA streams (no GPU needed); ``cuda`` uses real streams;
``auto`` is ``cuda`` where a GPU is present, else ``cpu``."""

ORACLES = ("lifetime", "race")
"""What a block can report: a storage freed while another stream may still use
it (``lifetime``), unordered accesses from two streams or a stream and the host
(``race``); both are the lifetime oracle's findings."""

MAX_PENDING_POLLS = 64
"""The most polls a block may be told to answer "not done" (``pending_polls``)."""

_default_device = "auto"  # the one default; the pytest plugin sets it from --streamfuzz-device
_active: Check | None = None
_whole: _Whole | None = None
"""The process-wide simulation, while a whole process runs under the checker."""


class StreamfuzzError(FuzzError):
    """A checked block broke a stream rule; ``findings`` says how, one ``Failure`` each.
    Under ``streamfuzz.fuzz.errors.FuzzError``, the root of what streamfuzz raises."""

    __module__ = "streamfuzz"  # as users import it

    def __init__(self, findings: list[Failure], device: str) -> None:
        self.findings = findings
        self.device = device
        head = (f"streamfuzz: {len(findings)} finding(s) in a checked block "
                f"(device {device})")
        super().__init__("\n".join([head] + [f"{f.kind}: {f.message}" for f in findings]))


def _valid_oracles(oracles: Any) -> tuple[str, ...]:
    """``None`` (all), one name, or names."""
    if oracles is None:
        return ORACLES
    try:
        chosen = (oracles,) if isinstance(oracles, str) else tuple(oracles)
    except TypeError:
        raise CheckArgumentError(f"oracles must be a name or a list of names from "
                                 f"{', '.join(ORACLES)}, not {oracles!r}") from None
    if chosen in ((), ("",)):  # an unset setting in config code: it would judge nothing
        raise CheckArgumentError(f"no oracle given, so nothing would judge the block and any "
                                 f"code would pass; name one or more of {', '.join(ORACLES)}, "
                                 f"or leave oracles out for all")
    unknown = sorted({o if isinstance(o, str) else repr(o) for o in chosen if o not in ORACLES})
    if unknown:
        raise CheckArgumentError(f"unknown oracle(s) {', '.join(unknown)}; "
                                 f"choose from {', '.join(ORACLES)}")
    return chosen


def _set_default_device(device: str) -> None:
    global _default_device
    _default_device = _valid_device(device)


def _valid_device(device: str) -> str:
    if not isinstance(device, str) or device not in DEVICES:
        raise CheckArgumentError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    return device


def _resolve(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckArgumentError("device='cuda' needs a CUDA GPU and none is visible; "
                         "use 'cpu' (simulated streams) or 'auto'")
    return device


class Check:
    """A checked block (see ``checked``). After it, ``findings`` holds what it found."""

    __module__ = "streamfuzz"

    def __init__(self, device: str | None = None, oracles: Iterable[str] | None = None,
                 collect: bool = False, pending_polls: int = 0) -> None:
        self.requested = _valid_device(device) if device is not None else None
        if isinstance(pending_polls, bool) or not isinstance(pending_polls, int) or not (
                0 <= pending_polls <= MAX_PENDING_POLLS):
            raise CheckArgumentError(f"pending_polls must be an integer in "
                                     f"0..{MAX_PENDING_POLLS}, not {pending_polls!r}")
        self.pending_polls = pending_polls
        self.oracles = _valid_oracles(oracles)
        if not isinstance(collect, bool):
            raise CheckArgumentError(f"collect must be True or False, not {collect!r}")
        self.collect = collect
        self.device: str | None = None
        self.findings: list[Failure] = []
        self._stack: contextlib.ExitStack | None = None
        self._checker: Any = None
        # Where a free first seen at the block's end is reported when no user
        # frame is on the stack there (the plugin's block ends inside pytest).
        self._end_frames: tuple[tuple[str, int, str], ...] = ()
        self._implicit = False
        """A block ``pytest --streamfuzz`` put around a whole test: a block the
        test opens itself takes precedence, and pauses this one meanwhile."""
        self._paused: Check | None = None

    def name(self, what: torch.Tensor | torch.Stream, name: str) -> None:
        """Call a tensor's storage, or a stream, ``name`` in findings (as the
        fuzzer names ``idx_mapping``). A stream is otherwise named after the
        variable or attribute it was assigned to where it was made."""
        if self._checker is None:
            return
        if isinstance(what, torch.Tensor):
            self._checker.name(what, name)
        else:
            self._checker.name_stream(what, name)

    def __enter__(self) -> Check:
        global _active
        if _active is not None and _active._implicit and _active._checker is not None:
            self._paused = _active
            _active._checker.detach()
            _active = None
        if _active is not None:
            raise NestedCheckError("streamfuzz.checked() blocks do not nest: end the outer "
                                   "block first, or check the whole code in one block")
        self.device = _resolve(self.requested or _default_device)
        self.findings = []
        if _whole is None:  # a whole program or suite makes its own groups
            _group.ensure()
        stack = contextlib.ExitStack()
        try:
            self._checker = stack.enter_context(
                _session(self.device, bool(self.oracles), self.pending_polls))
        except BaseException:
            stack.close()
            self._resume()
            raise
        self._stack = stack
        _active = self
        return self

    def _resume(self) -> None:
        """The implicit block this one paused goes on."""
        global _active
        paused, self._paused = self._paused, None
        if paused is not None and paused._checker is not None:
            paused._checker.attach()
            _active = paused

    def abandon(self) -> None:
        """End the block without judging it (a forked child's copy of its
        parent's block: the parent judges it)."""
        global _active
        if _active is self:
            _active = None
        checker, stack = self._checker, self._stack
        self._checker = self._stack = None
        if checker is not None:
            checker.detach()
        if stack is not None:
            stack.close()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        __tracebackhide__ = True  # pytest: the finding is the user's, not this frame's
        global _active
        _active = None
        checker, stack = self._checker, self._stack
        self._checker = self._stack = None
        try:
            found = []
            if checker is not None:
                from streamfuzz.fuzz.oracles.lifetime import frames_here

                checker.poll(frames_here() or self._end_frames)
                found = checker.finish()
                _record.note([s for s in checker.model.sites if s[0] in self.oracles])
        finally:
            if stack is not None:
                stack.close()
            self._resume()
        keep = set(self.oracles) | {"crash"}  # an oracle's own failure is always shown
        self.findings = [f for f in found if f.kind in keep]
        if not self.findings or self.collect:
            return
        error = StreamfuzzError(self.findings, self.device or "?")
        if exc is not None:
            # The block failed on its own; the findings may be why, so they ride along.
            if hasattr(exc, "add_note"):
                exc.add_note(str(error))
            return
        raise error


def checked(device: str | None = None, oracles: Iterable[str] | None = None,
            collect: bool = False, pending_polls: int = 0) -> Check:
    """Check the stream code run inside the ``with`` block.

    ``device``: ``cpu``, ``cuda`` or ``auto`` (default: ``--streamfuzz-device``
    under pytest, else ``auto``). ``oracles``: which of ``ORACLES`` to report
    (default: all). ``collect``: keep findings in ``.findings`` instead of
    raising ``StreamfuzzError`` at the block's end. ``pending_polls``: on
    ``cpu``, how many of the block's polls of unfinished work answer "not
    done", so that the path for work still in flight runs (draw it with
    Hypothesis); on ``cuda`` the GPU answers.
    """
    return Check(device, oracles, collect, pending_polls)


@contextlib.contextmanager
def _session(device: str, check: bool, pending_polls: int = 0) -> Iterator[Any]:
    """Streams for the block and, when ``check``, the lifetime checker watching them."""
    if device == "cuda":
        from streamfuzz.fuzz.oracles.lifetime_cuda import CudaLifetimeChecker
        from streamfuzz.fuzz.streams import CudaStreams

        streams = CudaStreams(torch.device("cuda", torch.cuda.current_device()))
        checker = None
        if check:
            checker = CudaLifetimeChecker(streams, group_rank=_group.rank()).attach()
        try:
            with streams.session():  # notes the streams the block makes, for names
                yield checker
        finally:
            if checker is not None:
                checker.detach()
        return
    from streamfuzz.fuzz.oracles.lifetime import LifetimeChecker
    from streamfuzz.fuzz.sim.cuda_on_cpu import Simulation
    from streamfuzz.fuzz.streams import SimStreams

    # Under a whole process's simulation (already open, its tensors made at import
    # or in fixtures already device memory) a block only attaches its checker.
    shared = _whole.sim if _whole is not None else None
    sim = shared if shared is not None else SimStreams(Simulation(
        'under streamfuzz.checked(device="cpu")',
        'run the block under checked(device="cuda") on a GPU'))
    on_cpu = LifetimeChecker(sim, group_rank=_group.rank()).attach() if check else None
    sim.hold_polls(pending_polls)
    try:
        with contextlib.nullcontext() if shared is not None else sim.session():
            yield on_cpu
    finally:
        sim.hold_polls(0)
        if on_cpu is not None:
            on_cpu.detach()


class _Whole:
    """A whole process under the checker (``pytest --streamfuzz``, ``streamfuzz
    check``): on ``cpu`` one simulation from start to end, so that code run
    before any block (imports, module level, fixtures) already sees CUDA and
    its tensors are device memory; blocks then only attach their checker."""

    def __init__(self, device: str, where: str, on_gpu: str) -> None:
        self.device = device
        self.sim: Any = None
        self._stack = contextlib.ExitStack()
        if device == "cpu":
            from streamfuzz.fuzz.sim.cuda_on_cpu import Simulation
            from streamfuzz.fuzz.streams import SimStreams

            self.sim = SimStreams(Simulation(where, on_gpu))
            self._stack.enter_context(self.sim.session())

    def close(self) -> None:
        self._stack.close()


def begin_whole(device: str, where: str, on_gpu: str) -> str:
    """Run the rest of this process under the checker on ``device`` (resolved
    here, and returned); blocks then share its simulation. Once per process."""
    global _whole, _default_device
    if _whole is not None:
        return _whole.device
    resolved = _resolve(_valid_device(device))
    _default_device = resolved
    _whole = _Whole(resolved, where, on_gpu)
    return resolved


def end_whole() -> None:
    """End what ``begin_whole`` began (the simulation's patches come off)."""
    global _whole
    whole, _whole = _whole, None
    if whole is not None:
        whole.close()


def whole_device() -> str | None:
    """The device the whole process runs under the checker on, or None."""
    return _whole.device if _whole is not None else None
