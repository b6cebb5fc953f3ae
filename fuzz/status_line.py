"""One status line, redrawn in place on a terminal.

A pipe or a log reads lines, not redraws: where the stream is not a
terminal nothing is drawn, and the caller says what matters as a line of
its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

_ERASE = "\r\033[K"


class StatusLine:
    """A line drawn at most every ``every_s`` (cut at ``width``): a redraw per
    example would cost more than a fast example."""

    def __init__(self, stream: TextIO, every_s: float, width: int | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._every_s = every_s
        self._width = width
        self.last = 0.0
        """When the line was last drawn (monotonic seconds)."""

    def draw(self, text: Callable[[], str]) -> None:
        """Redraw with ``text()`` where due; ``text`` is not called otherwise."""
        now = time.monotonic()
        if not self.tty or now - self.last < self._every_s:
            return
        self.last = now
        line = text()
        self.stream.write(_ERASE + (line[:self._width] if self._width else line))
        self.stream.flush()

    def clear(self) -> None:
        """Erase the line, before a line of text or at the end."""
        if self.tty:
            self.stream.write(_ERASE)
            self.stream.flush()
