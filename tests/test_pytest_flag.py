"""``pytest --streamfuzz``: a user's plain test file, unchanged, under the checker."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

PLAIN = Path(__file__).with_name("plain_suite.py")


def _pytest(tmp_path: Path, *args: str, files: dict[str, str] | None = None
            ) -> tuple[subprocess.CompletedProcess[str], dict[str, tuple[str, str]]]:
    """Run pytest on ``files`` (default: the plain suite) in ``tmp_path``; each
    test's outcome (passed, failure, skipped) and its message."""
    for name, text in (files or {"test_plain.py": PLAIN.read_text()}).items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMFUZZ_CHECK")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--junitxml", "out.xml", "-o", "addopts=", *args],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    outcomes = {}
    for case in ET.parse(tmp_path / "out.xml").iter("testcase"):
        verdict, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                verdict, message = child.tag, child.get("message", "")
        outcomes[case.get("name")] = (verdict, message)
    return r, outcomes


def _verdicts_as_labelled(outcomes: dict[str, tuple[str, str]]) -> None:
    for name, (verdict, message) in outcomes.items():
        if name.startswith("test_bug_"):
            assert verdict == "failure" and "StreamfuzzError" in message, (name, message)
        elif name.startswith("test_unsimulated_"):
            assert verdict == "skipped" and message.startswith("not simulated: "), (name, message)
        else:
            assert verdict == "passed", (name, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="without a GPU, they skip plainly")
def test_without_the_flag_the_gpu_tests_skip(tmp_path):
    r, outcomes = _pytest(tmp_path)
    assert r.returncode == 1  # the unittest-style test asserts CUDA is there
    assert sum(v == "skipped" for v, _ in outcomes.values()) == 8
    assert "streamfuzz" not in r.stdout.split("short test summary")[0].split("==")[-1]


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_the_flag_fails_exactly_the_buggy_tests_of_a_plain_file(tmp_path, workers):
    r, outcomes = _pytest(tmp_path, "--streamfuzz", "--streamfuzz-device", "cpu", *workers)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(outcomes) == 9
    _verdicts_as_labelled(outcomes)
    assert ("8 test(s) ran under the checker (--streamfuzz-device cpu): 5 clean, 3 failed "
            "with a finding, 0 failed otherwise; 1 skipped as not simulated") in r.stdout
    assert "not simulated: torch.cuda.CUDAGraph" in r.stdout


_CHILD = '''
import multiprocessing as mp
import pytest
import torch

def work(wait):
    side = torch.cuda.Stream()
    x = torch.arange(10, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x + 1
    if wait:
        torch.cuda.current_stream().wait_stream(side)
    x.fill_(0)

@pytest.mark.parametrize("wait", [False, True], ids=["bug", "ok"])
def test_child(wait):
    p = mp.get_context("spawn").Process(target=work, args=(wait,))
    p.start()
    p.join()
    assert p.exitcode == 0
'''


def test_a_finding_in_a_process_the_test_starts_fails_that_test(tmp_path):
    r, outcomes = _pytest(tmp_path, "--streamfuzz", "--streamfuzz-device", "cpu",
                          files={"test_child.py": _CHILD})
    assert outcomes["test_child[bug]"][0] == "failure", r.stdout
    assert "started by the test" in r.stdout
    assert outcomes["test_child[ok]"] == ("passed", ""), r.stdout


_OWN_BLOCKS = '''
import pytest
import torch
import streamfuzz

KEEP = []

def racy():
    """One race: main reads what the side stream writes, unordered (nothing is freed)."""
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)
    KEEP.append((x, side))
    return x.sum()

@pytest.mark.streamfuzz(oracles="lifetime")
def test_marker_takes_precedence():
    racy()  # a race, which the marker's oracle does not report

def test_own_block_inside():
    with streamfuzz.checked(collect=True) as check:
        racy()
    assert [f.kind for f in check.findings] == ["race"]

def test_after_own_block_the_test_is_still_checked():
    with streamfuzz.checked(collect=True):
        pass
    racy()
'''


def test_a_tests_own_marker_or_block_takes_precedence(tmp_path):
    r, outcomes = _pytest(tmp_path, "--streamfuzz", "--streamfuzz-device", "cpu",
                          files={"test_own.py": _OWN_BLOCKS})
    assert outcomes["test_marker_takes_precedence"] == ("passed", ""), r.stdout
    assert outcomes["test_own_block_inside"] == ("passed", ""), r.stdout
    verdict, message = outcomes["test_after_own_block_the_test_is_still_checked"]
    assert verdict == "failure" and "race" in message, r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_the_flag_on_cuda_without_a_gpu_is_one_usage_line(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--streamfuzz", "--streamfuzz-device", "cuda"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 4
    assert "--streamfuzz: device='cuda' needs a CUDA GPU" in r.stderr
