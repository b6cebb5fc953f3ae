"""``scan --harness`` on a small package: the written file runs as written.

The package has what broke harnesses on real engines: a ``@dataclass`` in the
function's file, a callee in another file that does the stream work, a
duck-typed argument, a ``stream`` parameter every caller passes its current
stream, and a bug that only a second call shows (the previous call's read of a
persistent buffer on another stream, not waited for by the next call's write).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_COPIES = '''
import torch


def stage(dst, src, side):
    """The copy the step needs, on the stream it is given."""
    with torch.cuda.stream(side):
        dst.copy_(src, non_blocking=True)
'''

_STEP = '''
from dataclasses import dataclass

import torch

from enginepkg.copies import stage


@dataclass
class StepConfig:
    scale: float = 2.0


class Stepper:
    def __init__(self, n):
        self.copy_stream = torch.cuda.Stream()
        self.out_stream = torch.cuda.Stream()
        self.done = torch.cuda.Event()
        self.staging = torch.zeros(n, device="cuda")
        self.total = torch.zeros(n, device="cuda")
        self.config = StepConfig()

    def step(self, batch, stream):
        self.copy_stream.wait_stream(stream)
        stage(self.staging, batch.tokens, self.copy_stream)
        batch.tokens.record_stream(self.copy_stream)
        self.done.record(self.copy_stream)
        with torch.cuda.stream(self.out_stream):
            self.out_stream.wait_event(self.done)
            self.total.add_(self.staging)
'''
# The fix: the next call's copy waits for the previous call's read of the staging buffer.
_STEP_FIXED = _STEP.replace(
    "        self.copy_stream.wait_stream(stream)\n",
    "        self.copy_stream.wait_stream(stream)\n"
    "        self.copy_stream.wait_stream(self.out_stream)\n")

_RUNNER = '''
import torch

from enginepkg.step import Stepper


def run(stepper, batches):
    for batch in batches:
        stepper.step(batch, torch.cuda.current_stream())
'''


def _package(tmp_path: Path, step: str, name: str) -> Path:
    root = tmp_path / name / "enginepkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "copies.py").write_text(textwrap.dedent(_COPIES))
    (root / "step.py").write_text(textwrap.dedent(step))
    (root / "runner.py").write_text(textwrap.dedent(_RUNNER))
    return root


def _write_and_run(tmp_path: Path, step: str, name: str) -> tuple[str, subprocess.CompletedProcess]:
    root = _package(tmp_path, step, name)
    line = next(i for i, t in enumerate(textwrap.dedent(step).splitlines(), 1)
                if "def step(" in t)
    out = tmp_path / f"test_{name}.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    w = subprocess.run([sys.executable, "-m", "streamfuzz", "scan", str(root), "--harness",
                        f"enginepkg/step.py:{line}", "--out", str(out)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(out), "--streamfuzz-device", "cpu"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    return out.read_text(), r


def test_the_harness_runs_as_written_flags_the_bug_and_passes_the_fix(tmp_path):
    body, bad = _write_and_run(tmp_path, _STEP, "buggy")
    assert "streamfuzz.fuzz" not in body  # public names only
    assert "'stream': torch.cuda.current_stream()" in body
    assert "for _step in range(2):" in body
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "StreamfuzzError" in bad.stdout, bad.stdout
    assert "staging" in bad.stdout or "total" in bad.stdout, bad.stdout
    _, good = _write_and_run(tmp_path, _STEP_FIXED, "fixed")
    assert good.returncode == 0, good.stdout + good.stderr


def test_the_loader_runs_a_dataclass_and_the_packages_callee_for_real(tmp_path):
    from streamfuzz.standins import load

    root = _package(tmp_path, _STEP, "pkg")
    loaded = load(str(root), "enginepkg/step.py")
    assert loaded.module.StepConfig().scale == 2.0  # the dataclass ran
    assert "enginepkg.copies" in loaded.loaded
    assert loaded.module.stage.__code__.co_filename.endswith("enginepkg/copies.py")
    assert not [s for s in loaded.stood_in if s.startswith("enginepkg")]


def test_the_loader_stands_in_what_does_not_import(tmp_path):
    from streamfuzz.standins import load

    root = tmp_path / "p"
    root.mkdir()
    (root / "m.py").write_text("import no_such_engine_mod\nfrom .no_such_sibling import f\n"
                               "from no_such_engine_mod.x import deco\n\n@deco\n"
                               "def g():\n    return 3\n")
    loaded = load(str(root), "m.py")
    assert loaded.module.g() == 3
    assert "no_such_engine_mod" in loaded.stood_in


def test_the_old_import_name_warns_and_still_loads(tmp_path):
    sys.modules.pop("streamfuzz.fuzz.targets.standins", None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from streamfuzz.fuzz.targets import standins
    assert any(issubclass(w.category, DeprecationWarning) for w in seen)
    from streamfuzz.standins import load

    assert standins.load is load


@pytest.mark.parametrize("name", ["fuzz/scan/harness.py", "fuzz/scan/standins.py"])
def test_the_scan_no_longer_imports_upward_into_targets(name):
    assert "fuzz.targets" not in (ROOT / name).read_text()


def test_an_rdma_write_modelled_on_the_host_is_the_callers_mistake_not_a_crash():
    import torch

    import streamfuzz

    with streamfuzz.checked(device="cpu"):
        t = torch.zeros(8, device="cuda")
        h = torch.zeros(8).pin_memory()
        with streamfuzz.opaque(writes=[h], stream="host", label="host fill"):
            pass  # host memory: the host may touch it
        with pytest.raises(streamfuzz.BadInput, match="stream='host' with device memory"):
            with streamfuzz.opaque(writes=[t], stream="host", label="rdma write"):
                pass
