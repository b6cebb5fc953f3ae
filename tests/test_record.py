"""A checked run's record, and ``scan --record`` marking each finding with it.

A package of three stream functions: one buggy (a side stream reads an
index that main frees with no ``record_stream``), its fixed twin, and a copy
of the buggy one that nothing calls. A plain test file (or a program and its
child process) calls the first two under the checker; the scan then marks
the first flagged, the second clean and the third not reached.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from streamfuzz._record import VERSION, Finding, Function, Record, Site

_STEP = '''
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    idx = torch.arange(n).to("cuda", non_blocking=True)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        rows = table[idx]
{keep}    del idx
    main.wait_stream(side)
    return rows
'''
STEPS = ("import torch\n\n\n"
         + "def gather_buggy(table, n):" + _STEP.format(keep="")
         + "\n\ndef gather_fixed(table, n):" + _STEP.format(keep="    idx.record_stream(side)\n")
         + "\n\ndef gather_never_called(table, n):" + _STEP.format(keep=""))
TESTS = '''
import torch
from mypkg.steps import gather_buggy, gather_fixed


def test_buggy():
    assert gather_buggy(torch.arange(64, device="cuda").view(16, 4), 4).shape == (4, 4)


def test_fixed():
    assert gather_fixed(torch.arange(64, device="cuda").view(16, 4), 4).shape == (4, 4)
'''
PROGRAM = '''
import multiprocessing as mp
import torch
from mypkg.steps import gather_buggy, gather_fixed


def child():
    gather_buggy(torch.arange(64, device="cuda").view(16, 4), 4)


if __name__ == "__main__":
    gather_fixed(torch.arange(64, device="cuda").view(16, 4), 4)
    p = mp.get_context("spawn").Process(target=child)
    p.start()
    p.join()
'''
EXPECTED = {"gather_buggy": "flagged", "gather_fixed": "clean",
            "gather_never_called": "not reached"}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STREAMFUZZ_CHECK")}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = _env()
    env["PYTHONPATH"] = str(cwd) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def _package(root: Path) -> Path:
    pkg = root / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "steps.py").write_text(STEPS)
    return pkg


def _marks(cwd: Path, scanned: str, record: str) -> tuple[dict[str, set[str]], dict]:
    """Each scanned function's marks, and the JSON report's ``record``."""
    r = _run(cwd, "-m", "streamfuzz", "scan", scanned, "--record", record, "--json", "out.json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((cwd / "out.json").read_text())
    marks: dict[str, set[str]] = {}
    for f in report["findings"]:
        marks.setdefault(f["function"], set()).add(f["run"]["mark"])
    assert report["record"]["summary"] in r.stdout
    return marks, report["record"]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_pytest_runs_record_marks_the_scan_flagged_clean_not_reached(tmp_path, workers):
    _package(tmp_path)
    (tmp_path / "test_steps.py").write_text(TESTS)
    r = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             "--streamfuzz", "--streamfuzz-device", "cpu", "--streamfuzz-record", "r.json",
             *workers, "test_steps.py")
    assert r.returncode == 1, r.stdout + r.stderr  # test_buggy fails with its finding
    assert "record written to r.json" in r.stdout
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["version"] == VERSION and record["processes"] == (2 if workers else 1)
    marks, summary = _marks(tmp_path, "mypkg", "r.json")
    assert marks == {name: {mark} for name, mark in EXPECTED.items()}, marks
    assert summary["counts"] == {"flagged": 2, "clean": 1, "not reached": 2}
    assert "--harness mypkg/steps.py:" in summary["summary"]


def test_a_check_runs_record_takes_in_its_child_process(tmp_path):
    """The buggy function runs only in the child: its finding comes back
    with the child's part of the record."""
    _package(tmp_path)
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = _run(tmp_path, "-m", "streamfuzz", "check", "--device", "cpu", "--record", "c.json",
             "prog.py")
    assert r.returncode == 1, r.stderr
    assert "record written to c.json" in r.stderr
    marks, summary = _marks(tmp_path, "mypkg", "c.json")
    assert marks == {name: {mark} for name, mark in EXPECTED.items()}, marks
    assert summary["processes"] == 2


def _line(text: str) -> int:
    return STEPS.splitlines().index(text) + 1


def _record(path: str) -> Record:
    """A record as a run under an installed copy of ``mypkg`` writes it."""
    buggy, fixed = _line("def gather_buggy(table, n):"), _line("def gather_fixed(table, n):")
    return Record("pytest --streamfuzz", "cpu", 1,
                  (Function(path, "gather_buggy", buggy, 3),
                   Function(path, "gather_fixed", fixed, 3)),
                  (Finding("lifetime", "freed while in use",
                           (Site(path, buggy + 7, "gather_buggy", buggy),)),))


@pytest.mark.parametrize("under, scanned", [("", "mypkg"), ("", "."), ("src", "src/mypkg"),
                                             ("src", ".")])
def test_an_installed_packages_file_is_the_scanned_trees_file(tmp_path, under, scanned):
    """The run imported the installed package; the scan reads its source
    tree: the package itself or the repository's root, in a src/ layout or not."""
    repo = tmp_path / "repo"
    _package(repo / under)
    installed = "/opt/env/lib/python3.11/site-packages/mypkg/steps.py"
    (tmp_path / "r.json").write_text(json.dumps(_record(installed).to_dict()))
    marks, _ = _marks(tmp_path, str(repo / scanned), "r.json")
    assert marks == {name: {mark} for name, mark in EXPECTED.items()}, marks


def test_another_packages_file_of_the_same_name_is_not_the_scanned_one(tmp_path):
    _package(tmp_path)
    (tmp_path / "r.json").write_text(
        json.dumps(_record("/opt/env/site-packages/otherpkg/steps.py").to_dict()))
    marks, _ = _marks(tmp_path, "mypkg", "r.json")
    assert set().union(*marks.values()) == {"not reached"}, marks


def test_a_record_round_trips_and_parts_merge():
    part = _record("/x/mypkg/steps.py")
    assert Record.from_dict(json.loads(json.dumps(part.to_dict()))) == part
    # Another example of the same finding: another size in its first line, the same frames.
    again = replace(part, findings=tuple(replace(f, summary=f.summary + " (int64[9])")
                                         for f in part.findings))
    both = part.merged(again)
    assert both.processes == 2
    assert [f.ops for f in both.functions] == [6, 6]
    assert both.findings == part.findings  # one finding, seen twice, once


@pytest.mark.parametrize("content, says", [
    (None, "no such file"),
    ("{not json", "not a streamfuzz record (not JSON"),
    (json.dumps({"version": 99}), "a record of version 99; this streamfuzz reads version 1"),
    (json.dumps({"version": VERSION}), "not a streamfuzz record (bad or missing"),
])
def test_a_bad_record_is_one_line_and_exit_2(tmp_path, content, says):
    _package(tmp_path)
    if content is not None:
        (tmp_path / "r.json").write_text(content)
    r = _run(tmp_path, "-m", "streamfuzz", "scan", "mypkg", "--record", "r.json")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert says in r.stderr


def test_a_record_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    open('ran', 'w').close()\n")
    (tmp_path / "out").mkdir()
    for bad, says in (("out", "out: is a directory"),
                      ("prog.py/r.json", "prog.py: exists and is not a directory")):
        r = _run(tmp_path, "-m", "streamfuzz", "check", "--device", "cpu", "--record", bad,
                 "prog.py")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"check --record {says}" in r.stderr
    for args in (["--streamfuzz", "--streamfuzz-device", "cpu"], []):
        r = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                 *args, "--streamfuzz-record", "out", "test_x.py")
        assert r.returncode == 4, r.stdout + r.stderr
        assert ("--streamfuzz-record out: is a directory" if args
                else "needs --streamfuzz") in r.stderr
    assert not (tmp_path / "ran").exists()


def test_a_record_in_a_folder_not_made_yet_is_written_there(tmp_path):
    _package(tmp_path)
    (tmp_path / "test_steps.py").write_text(TESTS)
    r = _run(tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             "--streamfuzz", "--streamfuzz-device", "cpu", "--streamfuzz-record",
             "runs/r.json", "test_steps.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert json.loads((tmp_path / "runs" / "r.json").read_text())["version"] == VERSION
