"""Helpers that several test modules share: the project's root, ``python -m streamfuzz``
in a fresh process, and small fixtures of data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from streamfuzz.fuzz.draft.scenario import Scenario, Step

ROOT = Path(__file__).resolve().parent.parent

_CACHES = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                 ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                                 ".wheels", ".suites*")


def checkout_outputs(folder: str, names: list[str]) -> set[str]:
    """What a copy of the checkout leaves out (``shutil.copytree``'s ``ignore``):
    caches anywhere; what the commands write (``make soak``'s ``soak/``,
    ``reports/``, ``wheels/``) only at the top, where a package may share the name."""
    skip = set(_CACHES(folder, names))
    if Path(folder) == ROOT:
        skip |= {"reports", "soak", "wheels"} & set(names)
    return skip


def env_with_path(*dirs: Path | str) -> dict[str, str]:
    """This process's environment with ``PYTHONPATH`` set to ``dirs`` (the project's
    root where none is given), so a fresh process imports this checkout's code."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, dirs or (ROOT,))))


def fuzz_cli(*args: object, cwd: Path | str = ROOT, env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m streamfuzz ARGS`` in a fresh process, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "streamfuzz", *map(str, args)], cwd=cwd,
                          env=env_with_path() if env is None else env, capture_output=True,
                          text=True, timeout=timeout)


def parent_pid(pid: int) -> int:
    """The parent of process ``pid``, read from ``/proc``."""
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def one_step(world: int = 2) -> Scenario:
    """A draft-broadcast scenario of one step whose two requests both finish."""
    step = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(1, 1),
                num_rejected=(0, 0))
    return Scenario(world_size=world, max_num_reqs=3, num_spec_steps=2, steps=(step,))
