"""Which collective a hung rank waits in, and the user's lines that called it.

A rank stuck in an unmatched collective sits in C code (a gloo or NCCL wait),
or in the harness waiting for the simulated sends to be matched: its Python
stack names neither the collective nor the user's line that called it. So,
on the rank, each ``torch.distributed`` collective is wrapped once: it notes
its name, the user's frames and whether it returned, for the example running
now. A daemon thread writes the notes beside the rank's stack dump (at most
once a second, and only when they changed); the driver reads them when it
declares a hang (``waits_in``). Nothing here imports torch until ``install``.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

_NAMES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor",
          "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
          "all_to_all_single", "send", "recv", "isend", "irecv", "barrier",
          "broadcast_object_list", "all_gather_object", "batch_isend_irecv")
"""The ``torch.distributed`` calls that wait for a peer (or hand back work that does)."""

_KEEP = 16
"""Notes kept per example: the last collectives called are the ones that matter."""

_DEPTH = 40
"""Frames kept per call, innermost first: enough to pass the harness's and torch's own."""

CALLING, RETURNED, PENDING = "waiting in", "returned from", "issued (async)"

UserFrames = Callable[[Iterable[traceback.FrameSummary]], list[str]]


def notes_path(stacks: str | Path) -> Path:
    """Where a rank whose stacks go to ``stacks`` writes its notes."""
    return Path(f"{stacks}.collectives")


class _Notes:
    def __init__(self, path: Path, user_frames: UserFrames) -> None:
        self.path, self.user_frames = path, user_frames
        self.lock = threading.Lock()
        self.entries: list[list[Any]] = []
        self.version = self.written = 0
        threading.Thread(target=self._write_loop, daemon=True, name="collective-notes").start()

    def call(self, fn: Callable[..., Any], name: str, *args: Any, **kwargs: Any) -> Any:
        # The raw frames only: which are the user's is worked out when the notes
        # are written (once a second), not on every collective of every example.
        stack: list[tuple[str, int, str]] = []
        frame: FrameType | None = sys._getframe(2)  # the caller of the wrapper
        while frame is not None and len(stack) < _DEPTH:
            stack.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
            frame = frame.f_back
        entry: list[Any] = [CALLING, name, stack]
        with self.lock:
            self.entries = self.entries[-(_KEEP - 1):] + [entry]
            self.version += 1
        out = None
        try:
            out = fn(*args, **kwargs)
        finally:
            with self.lock:  # a call that hands back work returns before its peers match it
                entry[0] = PENDING if out is not None else RETURNED
                self.version += 1
        return out

    def new_example(self) -> None:
        with self.lock:
            if self.entries:
                self.entries = []
                self.version += 1

    def _callers(self, stack: list[tuple[str, int, str]]) -> str:
        frames = self.user_frames(traceback.FrameSummary(f, n, fn, lookup_line=False)
                                  for f, n, fn in stack)
        return " <- ".join(frames[:4]) or "(no frame of yours)"

    def _write_loop(self) -> None:
        while True:
            time.sleep(1.0)
            with self.lock:
                if self.version == self.written:
                    continue
                version = self.version
                entries = [list(e) for e in self.entries]
            text = "".join(f"{status}\t{name}\t{self._callers(stack)}\n"
                           for status, name, stack in entries)
            tmp = self.path.with_name(self.path.name + ".tmp")
            try:
                tmp.write_text(text)
                os.replace(tmp, self.path)
            except OSError:
                return  # the run's log folder is gone: nobody will read the notes
            self.written = version


_NOTES: _Notes | None = None


def install(stacks: str | None, user_frames: UserFrames) -> None:
    """Wrap this process's collectives; notes go beside ``stacks`` (None: nowhere)."""
    global _NOTES
    if stacks is None or _NOTES is not None:
        return
    import torch.distributed as dist

    _NOTES = _Notes(notes_path(stacks), user_frames)
    for name in _NAMES:
        fn = getattr(dist, name, None)
        if fn is not None:
            setattr(dist, name, _noted(_NOTES, fn, name))


def _noted(notes: _Notes, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return notes.call(fn, name, *args, **kwargs)

    return call


def new_example() -> None:
    """Forget the last example's collectives."""
    if _NOTES is not None:
        _NOTES.new_example()


def waits_in(stacks: str | Path) -> str:
    """From a stuck rank's notes: the collective it waits in (a call that never
    returned, else the last one it called) and the user's frames that called it."""
    try:
        lines = notes_path(stacks).read_text().splitlines()
    except OSError:
        return ""
    entries = [ln.split("\t") for ln in lines if ln.count("\t") == 2]
    if not entries:
        return ""
    waiting = [e for e in entries if e[0] == CALLING]
    state, name, frames = (waiting or entries)[-1]
    if waiting:
        return f"waits in {name}, called at: {frames}"
    return (f"waits for a peer to match a collective: its last was {name} ({state}), "
            f"called at: {frames}; did every rank call it?")
