"""``scan --harness`` where what the function needs is read beyond its own body.

Each package has one shape a real engine's function has: a stood-in kernel
whose outputs the code unpacks, an argument whose attributes only its callees
read, a dataclass argument, a list whose items a loop uses. The harness must
run as written, flag the buggy form and pass the fixed one (the two differ
only in the ordering the finding is about); before these rules each failed in
its setup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_scan_harness import _flags_bug_passes_fix

_UNPACKED = '''
import torch
from no_such_lookup_ext import slot_lookup


class Gather:
    def __init__(self, n):
        self.side = torch.cuda.Stream()
        self.table = torch.zeros(n, device="cuda")

    def gather(self, idx: torch.Tensor):
        hit, pos = slot_lookup(self.table, idx)
        rows = hit.to(torch.float32) + pos + slot_lookup(idx)[1]
        WAIT
        with torch.cuda.stream(self.side):
            self.table.add_(rows)
        KEEP
'''
_UNPACKED_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                  "rows.record_stream(self.side); "
                  "torch.cuda.current_stream().wait_stream(self.side)")

_CALLEES = '''
from dataclasses import dataclass

import torch

from apkg.kernels import scale_rows


@dataclass
class State:
    rows: torch.Tensor
    pending: torch.Tensor | None = None
    weight: float = 2.0


class Mixer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.side = torch.cuda.Stream()

    def _reduce(self, state):
        assert isinstance(state, State) and state.weight == 2.0
        return state.rows + state.pending

    def step(self, state: State):
        merged = self._reduce(state)
        out = scale_rows(self.cfg, merged)
        WAIT
        with torch.cuda.stream(self.side):
            y = out * 2
        KEEP
        return y
'''
_CALLEE_FILE = '''
def scale_rows(cfg, x):
    return x * cfg.factor + cfg.bias
'''
_CALLEES_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                 "out.record_stream(self.side); y.record_stream(torch.cuda.current_stream()); "
                 "torch.cuda.current_stream().wait_stream(self.side)")

_LOOPED = '''
import torch


class Scatterer:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def scatter(self, item):
        for layer in item.materialize:
            raise RuntimeError(f"{layer} was not set up before the step")
        WAIT
        with torch.cuda.stream(self.side):
            for sc in item.scatters:
                param = getattr(sc.layer, sc.param_name)
                dst = param.data.as_strided(sc.shape, sc.stride, sc.offset)
                dst.copy_(item.results[sc.src])
        KEEP
'''
_LOOPED_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                "item.results.record_stream(self.side); "
                "torch.cuda.current_stream().wait_stream(self.side)")

_RULES = {
    # name: (files, the harnessed file, a line inside the function, the fix's two lines)
    "a stood-in kernel's unpacked or indexed outputs are tensors": (
        {"mod.py": _UNPACKED}, "mod.py", "def gather", _UNPACKED_WAIT),
    "what callees in any file read, a dataclass built as the package defines it": (
        {"mod.py": _CALLEES, "kernels.py": _CALLEE_FILE}, "mod.py", "def step",
        _CALLEES_WAIT),
    "a list whose items the loop reads gets items, a getattr's name and a view's geometry": (
        {"mod.py": _LOOPED}, "mod.py", "def scatter", _LOOPED_WAIT),
}


@pytest.mark.parametrize("rule", list(_RULES))
def test_each_read_rule_runs_as_written_flags_the_bug_and_passes_the_fix(tmp_path: Path,
                                                                         rule: str) -> None:
    _flags_bug_passes_fix(tmp_path, *_RULES[rule])
