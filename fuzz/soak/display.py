"""What a campaign tells its user: lines on its stream, each also in
``soak.log`` with the time, and a status line on a terminal."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TextIO

from streamfuzz.fuzz.status_line import StatusLine


class Display:
    """The stream, ``soak.log`` (open until ``close``) and the status line."""

    def __init__(self, stream: TextIO, log_path: Path) -> None:
        self.stream = stream
        self.status = StatusLine(stream, every_s=0.25, width=200)
        self._log = open(log_path, "a", buffering=1)

    def say(self, text: str) -> None:
        """A line on the stream, and in the log with the time."""
        print(text, file=self.stream, flush=True)
        if not self._log.closed:
            self._log.write(time.strftime("%Y-%m-%dT%H:%M:%SZ ", time.gmtime()) + text + "\n")

    def log(self, line: str) -> None:
        """A line in the log only (a sample, which carries its own time)."""
        self._log.write(line + "\n")

    def close(self) -> None:
        self._log.close()


def hms(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def gist(message: str, width: int = 160) -> str:
    """A finding's first line, cut at a word: the frames below it are in the
    corpus entry and the report, and a cut mid-frame read as garbage."""
    first = message.split("\n", 1)[0]
    if len(first) <= width:
        return first
    return first[:width].rsplit(" ", 1)[0] + " ..."


def kinds_text(kinds: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "0"
