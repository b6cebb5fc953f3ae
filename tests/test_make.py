"""The two commands as a new user meets them: ``make`` bootstraps offline on a
node whose python3 is itself a virtualenv, and ``make fuzz`` fails when the
tool crashed (a traceback is not "failures found").

A copy of the project is bootstrapped from a parent virtualenv that holds
torch and the test tools the way a GPU node's does (there through pip; here
through a path file onto this environment's packages), with pip's index off.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, checkout_outputs

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(cwd, *args, env=None, timeout=900):
    return subprocess.run(["make", "--no-print-directory", *args], cwd=cwd,
                          env=env or _offline_env(), capture_output=True, text=True,
                          timeout=timeout)


def _offline_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return dict(env, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory):
    """A copy of the project bootstrapped from a parent venv, offline."""
    base = tmp_path_factory.mktemp("node")
    parent = base / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", parent], check=True)
    site = subprocess.run([parent / "bin" / "python", "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # The parent "has" what this interpreter sees (wherever that comes from, a
    # GPU node's own venv included), but not this checkout of the project.
    seen = [p for p in sys.path if p and Path(p).is_dir() and Path(p).resolve() != ROOT]
    Path(site, "node_packages.pth").write_text("\n".join(seen) + "\n")
    repo = base / "repo"
    shutil.copytree(ROOT, repo, ignore=checkout_outputs)
    out = _make(repo, ".venv/.ready", f"PYTHON={parent / 'bin' / 'python3'}")
    return repo, out


def test_bootstrap_reuses_a_parent_venv_offline(bootstrapped):
    repo, out = bootstrapped
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reuses the torch and packages of" in out.stdout
    assert "installing what" not in out.stdout  # nothing was missing: nothing fetched
    probe = subprocess.run(
        [repo / ".venv" / "bin" / "python", "-c",
         "import torch, hypothesis, pytest, xdist, numpy, matplotlib, streamfuzz.fuzz as f; "
         "print(f.__file__)"],
        cwd="/", capture_output=True, text=True, env=_offline_env())
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()).is_relative_to(repo)


def test_make_fuzz_passes_on_findings_and_fails_on_a_crash(bootstrapped):
    repo, boot = bootstrapped
    assert boot.returncode == 0, boot.stdout + boot.stderr
    before = {p: (p.read_bytes(), p.stat().st_mode) for p in (repo / "corpus").rglob("*.json")}
    ok = _make(repo, "fuzz", "BUDGET=20", "EXAMPLES=40")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "streamfuzz on " in ok.stdout  # cpu here, cuda on a GPU node
    # Committed entries found again are left as they are: content and mode.
    assert {p: (p.read_bytes(), p.stat().st_mode) for p in before} == before
    # The same command when streamfuzz cannot start (a broken package install).
    shadow = repo / "shadow" / "hypothesis"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    env = dict(_offline_env(), PYTHONPATH=str(shadow.parent))
    crash = _make(repo, "fuzz", "BUDGET=20", "EXAMPLES=40", env=env)
    assert crash.returncode != 0, crash.stdout + crash.stderr
    assert "streamfuzz: crashed" in crash.stderr
