"""``scan --harness`` where a collaborator's result, a flag or a stream context decides
whether the function's stream work runs at all.

Each package has one shape of SGLang's pipeline-parallel scheduler mixin: a
process group's send whose result the code extends a list with, a paired
send/recv whose result a nested helper looks up, a flag the finding's branch
needs (``if not self.group.is_last:``), a stream context the host class makes
of the mixin's stream, and an argument annotated with a package class whose
name holds ``Tensor``; and from LMCache's and torchrec's connectors and pipelines, a
generator drawn a layer at a time, ``self._device``, a kept ``torch.cuda.stream``
maker and keys read from ``**kwargs``. The harness must run as written, flag the buggy form and
pass the fixed one (they differ only in the ordering the finding is about);
before these rules each failed in its setup or passed without the stream work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_scan_harness import _flags_bug_passes_fix

_ORDER = ("self.side.wait_stream(torch.cuda.current_stream())",
          "torch.cuda.current_stream().wait_stream(self.side)")

_EXTENDED = '''
import torch


class Stage:
    def __init__(self, group):
        self.group = group
        self.side = torch.cuda.Stream()

    def _send_dict(self, tensor_dict):
        works = []
        WAIT
        with torch.cuda.stream(self.side):
            works.extend(self.group.send_tensor_dict(tensor_dict=tensor_dict))
        KEEP
        return works

    def step(self, x: torch.Tensor):
        out = x * 2
        return self._send_dict({"out": out})
'''

_LOOKED_UP = '''
import torch


class Stage:
    def __init__(self, group):
        self.group = group
        self.side = torch.cuda.Stream()

    def step(self, x: torch.Tensor):
        got = None

        def _handle(recv):
            nonlocal got
            if recv.get("skip"):
                return
            got = recv["out"]

        out = x * 2
        WAIT
        with torch.cuda.stream(self.side):
            recv = self.group.send_recv_tensor_dict(send_tensor_dict={"out": out})
        KEEP
        _handle(recv)
        return got
'''

_BRANCH = '''
import torch


class Stage:
    def __init__(self, group):
        self.group = group
        self.side = torch.cuda.Stream()

    def step(self, x: torch.Tensor):
        out = x * 2
        if not self.group.is_last:
            WAIT
            with torch.cuda.stream(self.side):
                sent = out + 1
            KEEP
            return sent
        return out
'''

_MIXIN = '''
import torch


class SendMixin:
    def step(self, x: torch.Tensor):
        out = x * 2
        WAIT
        with self.side_ctx:
            sent = out + 1
            done = torch.cuda.Event()
            done.record()
        KEEP
        return sent, done
'''

_HOST = '''
import torch

from apkg.mixin import SendMixin


class Host(SendMixin):
    def __init__(self):
        self.side = torch.cuda.Stream()
        self.side_ctx = torch.cuda.stream(self.side)
'''

_PROXY = '''
from typing import Optional

import torch


class ProxyTensors:
    def __init__(self, tensors):
        self.tensors = tensors


class Stage:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def step(self, outputs: Optional[ProxyTensors]):
        if outputs:
            staged = [v * 2 for v in dict(outputs.tensors).values()]
            WAIT
            with torch.cuda.stream(self.side):
                sent = [s + 1 for s in staged]
            KEEP
            return sent
        return None
'''

_GENERATOR = '''
import torch


class Loader:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def layers(self, x: torch.Tensor, num_layers: int = 2):
        out = x * 2
        for i in range(num_layers):
            WAIT
            with torch.cuda.stream(self.side):
                got = out + i
            KEEP
            yield got
'''

_DEVICE_CONTEXT = '''
import torch


class Pipe:
    def __init__(self, device):
        self._device = device
        self._memcpy_stream = torch.cuda.Stream()
        self._stream_context = (torch.get_device_module(self._device).stream
                                if self._device.type == "cuda" else torch.cuda.stream)

    def copy(self, batch: torch.Tensor):
        staged = batch * 2
        WAIT
        with self._stream_context(self._memcpy_stream):
            moved = staged.to(self._device, torch.float64, non_blocking=True)
        KEEP
        return moved
'''

_KWARGS = '''
import torch


class Connector:
    def __init__(self):
        self.store_stream = torch.cuda.Stream()

    def from_gpu(self, dst: torch.Tensor, **kwargs):
        if "slot_mapping" not in kwargs:
            raise ValueError("'slot_mapping' should be provided in kwargs.")
        slot_mapping: torch.Tensor = kwargs["slot_mapping"]
        index = slot_mapping * 2
        WAIT
        with torch.cuda.stream(self.store_stream):
            dst.copy_(index)
        KEEP
'''

_RULES = {
    # name: (files, the harnessed file, a line inside the function, the fix's two lines)
    "a group's send whose result the code extends a list with gives a list, reading its tensors":
        ({"mod.py": _EXTENDED}, "mod.py", "out = x * 2", _ORDER),
    "a send/recv whose result a nested helper looks up gives a dict like the one it sends":
        ({"mod.py": _LOOKED_UP}, "mod.py", "recv = self.group", _ORDER),
    "a flag the finding's branch tests is set to enter that branch":
        ({"mod.py": _BRANCH}, "mod.py", "sent = out + 1", _ORDER),
    "a stream context the host class makes of the object's stream enters that stream":
        ({"mixin.py": _MIXIN, "host.py": _HOST}, "mixin.py", "sent = out + 1", _ORDER),
    "an argument annotated with a package class named ...Tensors is that object":
        ({"mod.py": _PROXY}, "mod.py", "sent = [s + 1", _ORDER),
    "a generator is drawn to its end, as its callers draw it a step at a time":
        ({"mod.py": _GENERATOR}, "mod.py", "got = out + i", _ORDER),
    "self._device is a device; a kept stream-context maker enters the stream it is given":
        ({"mod.py": _DEVICE_CONTEXT}, "mod.py", "staged = batch * 2", ("self._memcpy_stream"
         ".wait_stream(torch.cuda.current_stream())", "torch.cuda.current_stream()"
         ".wait_stream(self._memcpy_stream)")),
    "the keys the function reads of its **kwargs are passed":
        ({"mod.py": _KWARGS}, "mod.py", "index = slot_mapping * 2",
         ("self.store_stream.wait_stream(torch.cuda.current_stream())",
          "torch.cuda.current_stream().wait_stream(self.store_stream)")),
}


@pytest.mark.parametrize("rule", list(_RULES))
def test_each_result_rule_runs_as_written_flags_the_bug_and_passes_the_fix(tmp_path: Path,
                                                                           rule: str) -> None:
    _flags_bug_passes_fix(tmp_path, *_RULES[rule])
