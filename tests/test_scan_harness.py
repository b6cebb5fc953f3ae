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
    import importlib

    import streamfuzz.fuzz.targets as targets

    # Another test in this process may have imported it: the module runs (and
    # warns) only when neither sys.modules nor its package holds it.
    sys.modules.pop("streamfuzz.fuzz.targets.standins", None)
    vars(targets).pop("standins", None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        standins = importlib.import_module("streamfuzz.fuzz.targets.standins")
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


# One package per rule of the harness writer and loader, in the shape a real engine's
# file has it: the harness must run as written, flag the buggy form and pass the fixed
# one. Each (buggy, fixed) pair differs only in the ordering the finding is about.
_NPU = '''
import torch


class Offloader:
    def __init__(self, n):
        self.copy_stream = torch.npu.Stream()
        self.out = torch.zeros(n, device="npu")

    def offload(self, k):
        kv = k * 2
        WAIT
        with torch.npu.stream(self.copy_stream):
            self.out.copy_(kv, non_blocking=True)
        KEEP
'''
_NPU_WAIT = ("self.copy_stream.wait_stream(torch.npu.current_stream())",
             "kv.record_stream(self.copy_stream)")

_KERNEL = '''
import torch
from no_such_kernels_ext import copy_rows


class Mover:
    def __init__(self, n):
        self.side = torch.cuda.Stream()
        self.dst = torch.zeros(n, device="cuda")

    def move(self, k: torch.Tensor):
        src = k + 1
        WAIT
        with torch.cuda.stream(self.side):
            copy_rows(src, self.dst)
        KEEP
'''
_KERNEL_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                "src.record_stream(self.side)")

_GLOBAL_HELPERS = '''
import torch

PLATFORM = open("/no/such/platform/file").read()


def side_stream():
    if PLATFORM.startswith("rocm"):
        return None
    return torch.cuda.Stream()
'''
_GLOBAL = '''
import torch

from apkg.helpers import side_stream


def work(k: torch.Tensor) -> torch.Tensor:
    s = side_stream()
    WAIT
    with torch.cuda.stream(s):
        y = k * 2
    KEEP
    return y
'''
_GLOBAL_WAIT = ("s.wait_stream(torch.cuda.current_stream())",
                "k.record_stream(s); y.record_stream(torch.cuda.current_stream()); "
                "torch.cuda.current_stream().wait_stream(s)")

_ATTRS = '''
import torch


class Cache:
    def __init__(self, pool, cfg):
        self.start_layer = cfg.start_layer
        self.store_dtype = cfg.dtype
        self.device = pool.device
        self.width = cfg.width
        self.copy_stream = torch.cuda.Stream()
        self._events = [torch.cuda.Event() for _ in range(2)]

    def in_range(self, layer):
        return layer.layer_id >= self.start_layer

    def offload(self, k, layer):
        idx = layer.layer_id - self.start_layer
        start, done = self._events
        buf = torch.empty((k.shape[0], self.width), dtype=self.store_dtype, device=self.device)
        WAIT
        with torch.cuda.stream(self.copy_stream):
            buf.copy_(k.unsqueeze(1).expand(-1, self.width))
            done.record()
        KEEP
        return idx
'''
_ATTRS_WAIT = ("start.record(); self.copy_stream.wait_event(start)",
               "buf.record_stream(self.copy_stream); k.record_stream(self.copy_stream)")

_NUMPY = '''
import numpy as np
import torch


class Masker:
    def __init__(self):
        self.copy_stream = torch.cuda.Stream()

    def apply(self, logits: torch.Tensor, bitmask: np.ndarray):
        with torch.cuda.stream(self.copy_stream):
            mask = torch.from_numpy(bitmask).to("cuda", non_blocking=True)
        WAIT
        logits.add_(mask.sum())
        KEEP
'''
_NUMPY_WAIT = ("torch.cuda.current_stream().wait_stream(self.copy_stream)",
               "mask.record_stream(torch.cuda.current_stream())")

_CLOSURE = '''
import torch


class Mixer:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def run(self, x: torch.Tensor):
        main = torch.cuda.current_stream()

        def shared(event):
            WAIT
            with torch.cuda.stream(self.side):
                rows = x * 2
            KEEP
            return rows

        return shared(None)
'''
_CLOSURE_WAIT = ("self.side.wait_stream(main)",
                 "x.record_stream(self.side); rows.record_stream(main); "
                 "main.wait_stream(self.side)")

_POOL = '''
import torch


class Buffer:
    def __init__(self, size):
        self._pool = torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def write_tensor(self, handle, tensor, stream):
        src = tensor.contiguous()
        nbytes = src.numel() * src.element_size()
        dst = self._pool[handle.offset: handle.offset + nbytes]
        with torch.cuda.stream(stream):
            dst.copy_(src.view(torch.uint8), non_blocking=True)
        KEEP
        return nbytes

    def write_all(self, handle, tensors, stream):
        WAIT
        for t in tensors:
            self.write_tensor(handle, t, stream)
'''
_POOL_WAIT = ("stream.wait_stream(torch.cuda.current_stream())",
              "src.record_stream(stream)")

_BOUND = '''
import torch
from no_such_ioring_ext import make_ring


class Client:
    def __init__(self, entries):
        self.entries = entries
        self.ring = make_ring(entries)
        self.stream = torch.cuda.Stream()

    def check(self, offsets):
        if len(offsets) > self.entries:
            raise ValueError("too many reads for the ring")

    def batch_read(self, offsets: list[int], tensors: list[torch.Tensor]):
        self.check(offsets)
        done = self.ring.submit().wait(min_results=len(offsets))
        WAIT
        with torch.cuda.stream(self.stream):
            for t in tensors:
                t.add_(1)
        KEEP
        return [r for r in done]
'''
_BOUND_WAIT = ("self.stream.wait_stream(torch.cuda.current_stream())",
               "torch.cuda.current_stream().wait_stream(self.stream)")

_RING = '''
import torch


class Ring:
    def __init__(self, depth):
        self.depth = depth
        self.stream = torch.cuda.Stream()
        self.read_done: list = []

    def start(self):
        self.read_done = [torch.cuda.Event() for _ in range(self.depth)]

    def process(self, item, x):
        assert x.dim() == 2
        WAIT
        with torch.cuda.stream(self.stream):
            y = x * 2
        self.read_done[item.slot].record(self.stream)
        KEEP
        return y.shape[0]
'''
_RING_WAIT = ("self.stream.wait_stream(torch.cuda.current_stream())",
              "x.record_stream(self.stream)")

_RULES = {
    # name: (files, the harnessed file, a line inside the function, the fix's two lines)
    "a platform's device module is torch.cuda": ({"mod.py": _NPU}, "mod.py", "def offload",
                                                 _NPU_WAIT),
    "a stood-in extension kernel reads its tensors": ({"mod.py": _KERNEL}, "mod.py",
                                                      "def move", _KERNEL_WAIT),
    "a skipped top-level line's global is stood in": (
        {"mod.py": _GLOBAL, "helpers.py": _GLOBAL_HELPERS}, "mod.py", "def work",
        _GLOBAL_WAIT),
    "attributes typed by the class's use of them": ({"mod.py": _ATTRS}, "mod.py",
                                                   "def offload", _ATTRS_WAIT),
    "a NumPy annotation is a host array": ({"mod.py": _NUMPY}, "mod.py", "def apply",
                                           _NUMPY_WAIT),
    "a closure runs through its enclosing function": ({"mod.py": _CLOSURE}, "mod.py",
                                                      "rows = x * 2", _CLOSURE_WAIT),
    "a bound is a capacity, a method's handle gives results": (
        {"mod.py": _BOUND}, "mod.py", "def batch_read", _BOUND_WAIT),
    "a list the class fills later is indexed by a slot, a stated rank is kept": (
        {"mod.py": _RING}, "mod.py", "def process", _RING_WAIT),
    "a byte pool keeps its dtype, a stream is made once": ({"mod.py": _POOL}, "mod.py",
                                                           "def write_tensor", _POOL_WAIT),
}


def _rule_run(tmp_path: Path, name: str, files: dict[str, str], target: str, marker: str,
              fix: tuple[str, str], fixed: bool) -> tuple[str, subprocess.CompletedProcess]:
    root = tmp_path / name / "apkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    for path, text in files.items():
        text = textwrap.dedent(text)
        for word, line in zip(("WAIT", "KEEP"), fix):
            indent = next((t[:len(t) - len(t.lstrip())] for t in text.splitlines()
                           if t.strip() == word), None)
            if indent is None:
                continue
            text = text.replace(f"{indent}{word}\n",
                                "".join(f"{indent}{x.strip()}\n" for x in line.split(";"))
                                if fixed else "")
        (root / path).write_text(text)
    line = next(i for i, t in enumerate((root / target).read_text().splitlines(), 1)
                if marker in t)
    out = tmp_path / name / "test_harness.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    w = subprocess.run([sys.executable, "-m", "streamfuzz", "scan", str(root), "--harness",
                        f"apkg/{target}:{line}", "--out", str(out)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        str(out), "--streamfuzz-device", "cpu"], cwd=tmp_path / name, env=env,
                       capture_output=True, text=True, timeout=300)
    return out.read_text(), r


def _flags_bug_passes_fix(tmp_path: Path, files: dict[str, str], target: str, marker: str,
                          fix: tuple[str, str]) -> subprocess.CompletedProcess:
    """The harness of the buggy form fails with a streamfuzz finding, the fixed form's
    passes; the fixed run, for what a caller checks of it besides."""
    _, bad = _rule_run(tmp_path, "buggy", files, target, marker, fix, fixed=False)
    assert bad.returncode == 1 and "StreamfuzzError" in bad.stdout, bad.stdout[-3000:]
    _, good = _rule_run(tmp_path, "fixed", files, target, marker, fix, fixed=True)
    assert good.returncode == 0, good.stdout[-3000:]
    return good


@pytest.mark.parametrize("rule", list(_RULES))
def test_each_harness_rule_runs_as_written_flags_the_bug_and_passes_the_fix(tmp_path, rule):
    _flags_bug_passes_fix(tmp_path, *_RULES[rule])
