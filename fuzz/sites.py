"""Where code is, as a report shows it: a path a reader can open, and the line's text.

A report is read on another machine than the one that wrote it (a corpus
entry, a CI log), so a path is never absolute where a shorter one names the
same file: relative to the project or the current directory, else to the
import root it was loaded from (``vllm/v1/worker/gpu_model_runner.py`` for a
file in site-packages), which is what tells two files of one name apart.
"""

from __future__ import annotations

import linecache
import os
import sys
from functools import lru_cache
from pathlib import Path

from streamfuzz.fuzz import ROOT


@lru_cache(maxsize=4096)
def display_path(path: str) -> str:
    """``path`` relative to the installed packages' root it lives in, else the
    project, the current directory or another import root; else its last
    three parts."""
    if not os.path.isabs(path):
        return path
    roots = [p.rstrip(os.sep) for p in sys.path if p and os.path.isabs(p)]
    installed = [p for p in roots if os.path.basename(p) in ("site-packages", "dist-packages")]
    for group in (installed, [ROOT, os.getcwd()], roots):
        inside = [r for r in group if path.startswith(r + os.sep)]
        if inside:
            return os.path.relpath(path, max(inside, key=len))
    return os.path.join(*Path(path).parts[-3:])  # never absolute: reports travel


def source_line(path: str, line: int) -> str:
    """The text of line ``line`` of ``path`` (stripped), or "" where it cannot be read."""
    return linecache.getline(path, line).strip()
