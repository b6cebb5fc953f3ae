"""``python -m streamfuzz check``: a plain program, unchanged, as one checked region."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

PROGRAM = Path(__file__).with_name("checked_program.py")
ROOT = Path(__file__).resolve().parents[1]


def _check(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFUZZ_CHECK")}
    return subprocess.run([sys.executable, "-m", "streamfuzz", "check", *args],
                          capture_output=True, text=True, timeout=240, cwd=cwd or ROOT,
                          env=env)


def test_a_buggy_program_exits_1_with_its_finding_at_its_own_line():
    r = _check("--device", "cpu", str(PROGRAM))
    assert r.returncode == 1, r.stderr
    assert "1 finding(s) on cpu" in r.stderr
    assert "lifetime: a tensor int64[8] made by aten.arange was freed while stream side" in r.stderr
    assert "checked_program.py:19 step" in r.stderr  # the side stream's read
    assert "runpy" not in r.stderr  # the program's frames, not the runner's


def test_the_fixed_program_is_clean_and_exits_0():
    r = _check("--device", "cpu", str(PROGRAM), "--fixed")
    assert r.returncode == 0, r.stderr
    assert "clean (lifetime, race judged on cpu; 1 process)" in r.stderr


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_finding_in_a_child_process_is_reported_by_the_parent(method):
    r = _check("--device", "cpu", str(PROGRAM), "--only-child", "--child", method)
    assert r.returncode == 1, r.stderr
    assert "child exit 0" in r.stdout
    assert "[child process" in r.stderr and "lifetime: a tensor int64[8]" in r.stderr
    fixed = _check("--device", "cpu", str(PROGRAM), "--fixed", "--only-child", "--child", method)
    assert fixed.returncode == 0, fixed.stderr
    assert "clean" in fixed.stderr


def test_the_programs_own_failure_status_wins():
    r = _check("--device", "cpu", str(PROGRAM), "--exit", "3")
    assert r.returncode == 3
    assert "1 finding(s)" in r.stderr


def test_a_module_runs_as_python_dash_m(tmp_path):
    (tmp_path / "mymod.py").write_text(PROGRAM.read_text())
    r = _check("--device", "cpu", "-m", "mymod", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "mymod.py:19 step" in r.stderr


def test_only_the_chosen_oracle_reports():
    r = _check("--device", "cpu", "--oracle", "race", str(PROGRAM))
    assert r.returncode == 0, r.stderr
    assert "clean (race judged on cpu" in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--device", "cpu", "no_such_program.py"], "no such file 'no_such_program.py'"),
    (["--device", "cpu"], "check needs a program"),
    (["--device", "cpu", "-m", "no_such_module_here"], "no such module"),
    (["--device", "cpu", "--oracle", "", str(PROGRAM)], "no oracle given"),
    (["--device", "cpu", "--oracle", "reuse", str(PROGRAM)], "unknown oracle(s) reuse"),
] + ([(["--device", "cuda", str(PROGRAM)], "needs a CUDA GPU")]
     if not torch.cuda.is_available() else []))
def test_bad_input_is_one_line_and_exit_2_before_the_program_runs(args, says):
    r = _check(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("fixed", [False, True], ids=["bug", "fixed"])
def test_torchrun_workers_are_checked_and_a_receivers_race_is_reported(fixed):
    ranks = str(PROGRAM.with_name("checked_ranks.py"))
    r = _check("--device", "cpu", "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", ranks, *(["--fixed"] if fixed else []))
    assert "3 processes" in r.stderr, r.stderr
    if fixed:
        assert r.returncode == 0 and "clean" in r.stderr, r.stderr
    else:
        assert r.returncode == 1, r.stderr
        assert "] race: read-after-write race" in r.stderr
        assert "side's write (c10d.broadcast_)" in r.stderr
        assert r.stderr.count("[child process") == 1  # the receiver; the root only reads
