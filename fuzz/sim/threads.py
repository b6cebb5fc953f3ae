"""Threads an example starts run under the example's torch modes.

Torch keeps its function- and dispatch-mode stacks per thread, so a thread
that engine code starts (an output-copy thread, a weight loader) would run
its ops outside the simulation and outside every oracle: unseen, and a
clean verdict that means nothing. While an example runs, ``Thread.start``
captures the starting thread's mode stacks and the new thread enters the
same modes before its ``run``. Each thread has its own current stream, as
CUDA's is per thread (``SimStreams`` keeps it per thread too).

Threads should end within the example (join them): the modes they entered
stay with them until their ``run`` returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

_lock = threading.Lock()
_depth = 0
_original_start = threading.Thread.start


def _start(self: threading.Thread) -> None:
    modes = [*_get_current_function_mode_stack(), *_get_current_dispatch_mode_stack()]
    if modes:
        run = self.run

        def run_under_modes() -> None:
            with contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                run()

        self.run = run_under_modes  # type: ignore[method-assign]
    _original_start(self)


@contextlib.contextmanager
def modes_follow_threads() -> Iterator[None]:
    """For the length of an example (nested uses share one patch)."""
    global _depth
    with _lock:
        if _depth == 0:
            threading.Thread.start = _start  # type: ignore[method-assign]
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                threading.Thread.start = _original_start  # type: ignore[method-assign]

