"""``scan --harness`` where the function computes with what a stood-in returns.

Each package has one shape a real engine's function has: a stood-in helper's
result used as a number (a grid's tile count) before a stood-in compiler's
kernel launch, a list indexed by an int the harness sets, a queue whose popped
pair the code unpacks, a dict of tensors, an event and a device module. The harness must
run as written, flag the buggy form and pass the fixed one (the two differ only
in the ordering the finding is about); before these rules each failed in its
setup.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_scan_harness import _flags_bug_passes_fix

_COUNTED = '''
import torch
import no_such_kernel_lang as kl


@kl.jit
def _scale_kernel(x, n, BLOCK: kl.constexpr):
    pid = kl.program_id(0)


class Scaler:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def scale(self, x: torch.Tensor, split: int = 2):
        tiles = kl.cdiv(x.shape[0], 16)
        if tiles > 4096:
            raise ValueError("too many tiles")
        y = x * 2
        WAIT
        with torch.cuda.stream(self.side):
            _scale_kernel[(tiles * split, kl.cdiv(8, 4) + 1)](y, x.shape[0], BLOCK=16)
        KEEP
        return y
'''
_COUNTED_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                 "y.record_stream(self.side); "
                 "torch.cuda.current_stream().wait_stream(self.side)")

_WRITTEN = '''
import torch
import no_such_kernel_lang as kl


@kl.jit
def _scale_into_kernel(x, out_ptr, n, BLOCK: kl.constexpr):
    pid = kl.program_id(0)


class Scaler:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def scale_into(self, x: torch.Tensor):
        out = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            _scale_into_kernel[(kl.cdiv(x.shape[0], 16),)](x, out, x.shape[0], BLOCK=16)
            x.record_stream(self.side)
            out.record_stream(self.side)
        WAIT
        return out + 1
'''
_WRITTEN_WAIT = ("torch.cuda.current_stream().wait_stream(self.side)", "")

_INDEXED = '''
from typing import List

import torch


class Relay:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def send(self, next_mb_id: int, mbs: List["Batch"], outputs: torch.Tensor):
        target = mbs[next_mb_id]
        if target is None:
            return None
        staged = outputs * target.scale
        WAIT
        with torch.cuda.stream(self.side):
            sent = staged + 1
        KEEP
        return sent
'''
_INDEXED_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                 "staged.record_stream(self.side); "
                 "sent.record_stream(torch.cuda.current_stream()); "
                 "torch.cuda.current_stream().wait_stream(self.side)")

_QUEUED = '''
from collections import deque
from typing import Tuple

import torch


class Sender:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def send(self, queue: deque[Tuple[torch.Event, torch.Tensor]]):
        ready, payload = queue.popleft()
        torch.cuda.current_stream().wait_event(ready)
        staged = payload.rows.float() * 2
        WAIT
        with torch.cuda.stream(self.side):
            sent = staged + 1
        KEEP
        return sent
'''

_DICTED = '''
from typing import Dict

import torch


class Relay:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def _stage(self, tensor_dict: Dict[str, torch.Tensor]):
        tensor_dict["kind"] = "output"
        return [v * 2 for v in tensor_dict.values() if isinstance(v, torch.Tensor)]

    def send(self, outputs):
        staged = self._stage(dict(outputs.tensors))[0]
        WAIT
        with torch.cuda.stream(self.side):
            sent = staged + 1
        KEEP
        return sent
'''

_HANDED = '''
from typing import Optional

import torch


class Relay:
    def __init__(self, device_module):
        self.device_module = device_module
        self.side = torch.cuda.Stream()

    def _send(self, staged, ready_event: Optional[torch.Event] = None):
        if ready_event is not None:
            self.device_module.current_stream().wait_event(ready_event)
        return staged + 1

    def send(self, outputs: torch.Tensor, ready):
        staged = outputs * 2
        WAIT
        with torch.cuda.stream(self.side):
            sent = self._send(staged, ready_event=ready)
        KEEP
        return sent
'''

_RULES = {
    # name: (files, the harnessed file, a line inside the function, the fix's two lines)
    "a stood-in call's result the code computes with is a number; a stood-in jit launches": (
        {"mod.py": _COUNTED}, "mod.py", "def scale", _COUNTED_WAIT),
    "a stood-in jit kernel writes the tensors it takes as outputs": (
        {"mod.py": _WRITTEN}, "mod.py", "def scale_into", _WRITTEN_WAIT),
    "a list looked up by an int argument gets items for it, each used as the code uses it": (
        {"mod.py": _INDEXED}, "mod.py", "def send", _INDEXED_WAIT),
    "a queue of events is a queue; a method's unpacked results are each used as the code uses it": (
        {"mod.py": _QUEUED}, "mod.py", "def send", _INDEXED_WAIT),
    "what the code copies with dict() or passes as Dict[str, Tensor] is a dict of a tensor": (
        {"mod.py": _DICTED}, "mod.py", "def send", _INDEXED_WAIT),
    "an event passed where Event is annotated; a device module is the device's": (
        {"mod.py": _HANDED}, "mod.py", "def send", _INDEXED_WAIT),
}


@pytest.mark.parametrize("rule", list(_RULES))
def test_each_count_rule_runs_as_written_flags_the_bug_and_passes_the_fix(tmp_path: Path,
                                                                          rule: str) -> None:
    _flags_bug_passes_fix(tmp_path, *_RULES[rule])
