"""bench/spy.py refuses bad input with one line before it starts a campaign."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SPY = Path(__file__).resolve().parent.parent / "bench" / "spy.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_SPY), "--device", "cpu", "--out",
                           str(tmp_path / "out"), *args], capture_output=True, text=True,
                          timeout=120)


def test_missing_py_spy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    got = _run(tmp_path, "--py-spy", str(tmp_path / "no-such-py-spy"))
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        "spy: py-spy not found: pip install py-spy, or give --py-spy PATH"]
    assert not (tmp_path / "out").exists()


def test_zero_seconds_is_refused(tmp_path: Path) -> None:
    got = _run(tmp_path, "--seconds", "0", "--py-spy", sys.executable)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == ["spy: --seconds must be at least 1"]
