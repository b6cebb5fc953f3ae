"""``journal.json``: the examples in flight, for a killed driver's next start."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Journal:
    """``journal.json``, rewritten at every example the driver dispatches.

    One ``pwrite`` at offset 0 of a file kept open, padded with spaces to the
    file's length: a killed driver has written all of it or none, and what a
    killed process wrote is in the page cache still. Written by the rule of
    reports and corpus entries (a fresh temporary file, fsync, rename, fsync
    of the folder), or even by a plain rename, it took a quarter of a soak
    driver's time: ext4 flushes a file that replaces another. A journal cut
    by the machine's own crash reads as unreadable and is ignored. Each
    example is in flight for two writes; its dict is made once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0
        self._made: list[tuple[Any, dict[str, Any]]] = []

    def write(self, target: str, round_: Any, scenarios: Sequence[Any],
              replays: int = 0) -> None:
        made = [(s, next((d for k, d in self._made if k is s), None) or s.to_dict())
                for s in scenarios]
        self._made = made
        data = json.dumps({"target": target, "round": round_,
                           "scenarios": [d for _, d in made], "replays": replays},
                          separators=(",", ":")).encode()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            self._size = os.fstat(self._fd).st_size
        os.pwrite(self._fd, data.ljust(self._size), 0)
        self._size = max(self._size, len(data))

    def remove(self) -> None:
        """No example in flight: the next start has nothing to replay."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._made = None, []
        _unlink(self.path)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

