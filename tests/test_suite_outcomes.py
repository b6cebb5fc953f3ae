"""How ``pytest --streamfuzz`` reports a test of a real suite that the checker
cannot run: skipped as ``not simulated: <call>``, never failed.

Each case is a pattern met in a released package's own test suite
(docs/measured.md, "Test suites nobody here wrote").
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed

from tests.helpers import ROOT

# A released library's test that its device-copy helper compiles as one graph.
_COMPILES = '''
import torch

def send(x):
    return x.to("cpu") + 1

def test_send_compiles():
    compiled = torch.compile(send, fullgraph=True, backend="eager")
    assert compiled(torch.zeros(1)).item() == 1
'''


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           str(tmp_path / "test_user.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_fullgraph_compile_is_skipped_as_not_simulated(tmp_path):
    plain = _pytest(tmp_path, _COMPILES)
    assert plain.returncode == 0, plain.stdout[-2000:]
    res = _pytest(tmp_path, _COMPILES, "--streamfuzz", "--streamfuzz-device", "cpu")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "1 skipped" in res.stdout
    assert "not simulated: torch.compile(fullgraph=True)" in res.stdout
    assert "0 failed otherwise; 1 skipped as not simulated" in res.stdout


# A released library's fixture for its GPU tests: an NCCL group of one rank.
_NCCL = '''
import pytest
import torch
import torch.distributed as dist

@pytest.fixture
def nccl_group():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_nccl(nccl_group):
    assert dist.get_world_size() == 1
'''


@pytest.mark.skipif(torch.distributed.is_nccl_available(), reason="checks a torch without NCCL")
def test_an_nccl_group_on_a_cpu_build_is_skipped_as_not_simulated(tmp_path):
    res = _pytest(tmp_path, _NCCL, "--streamfuzz", "--streamfuzz-device", "cpu")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "1 skipped" in res.stdout and "error" not in res.stdout.splitlines()[-1]
    assert "not simulated: the NCCL backend" in res.stdout
