"""``scan --harness``: state the flagged call needs from the rest of the package.

Each small package's harness must run as written and reach the stream work:
it flags the bug and passes the fix (where the state is missing the harness
fails in setup, or passes with no stream work done). Where the work is a
CUDA driver call through ctypes, it skips and says so.
"""

from __future__ import annotations

import pytest

from tests.test_scan_harness import _flags_bug_passes_fix, _rule_run

# Vocabulary ids looked up in the batch's request ids: the two must hold the same keys.
_TIED = '''
import torch


class Masker:
    def __init__(self):
        self.copy_stream = torch.cuda.Stream()
        self.stride = 4

    def apply(self, logits: torch.Tensor, batch, req_ids: list[str]):
        index = {r: i for i, r in enumerate(batch.req_ids)}
        rows = [index[r] * self.stride + p for r in req_ids for p in range(self.stride)]
        WAIT
        with torch.cuda.stream(self.copy_stream):
            picked = logits[torch.tensor(rows, device="cuda") % logits.shape[0]] * 2
        KEEP
        return picked
'''
_TIED_WAIT = ("self.copy_stream.wait_stream(torch.cuda.current_stream())",
              "torch.cuda.current_stream().wait_stream(self.copy_stream)")

# A plan per batch size that __init__ makes (never called by the harness): the function
# reads the one for its rows.
_PLANS = '''
import torch


def load_routes():
    return {}


def make_queue():
    return None


class Layer:
    def __init__(self, sizes, kernel):
        self.side = torch.cuda.Stream()
        self.routes = load_routes()
        self.jobs = make_queue()
        self.plans: dict[int, tuple] = {}
        for b in sizes:
            name = "fused" if b > 8 else "plain"
            if name == "plain":
                self.plans[b] = (name,)
                continue
            self.plans[b] = name, kernel(b)

    def run(self, x: torch.Tensor):
        b = x.shape[0]
        plan = self.plans[b]
        if plan[0] != "plain" or self.routes.get(b, "front") != "front":
            raise ValueError("a fused plan needs its kernel")
        WAIT
        with torch.cuda.stream(self.side):
            y = x * 2
        KEEP
        return y

    def drain(self):
        return self.jobs.get()
'''
_PLANS_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
               "x.record_stream(self.side); torch.cuda.current_stream().wait_stream(self.side)")

# The allocator the pool builds is a class of the same file: the harness builds it, and
# the transport it registers memory with answers as the allocator checks (0: done).
_POOL = '''
import threading

import torch


class Allocator:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free = [(0, capacity)]
        self.tensor = None

    def prepare(self, device, transport):
        if self.tensor is not None:
            return
        tensor = torch.empty(self.capacity, dtype=torch.uint8, device=device)
        ret = transport.register(tensor)
        if ret != 0:
            raise RuntimeError(f"register returned {ret}")
        self.tensor = tensor

    def allocate(self, nbytes):
        offset, available = self.free[0]
        if nbytes > available:
            return None
        self.free[0] = (offset + nbytes, available - nbytes)
        return offset, nbytes

    def view(self, offset, nbytes, shape, dtype):
        return self.tensor.narrow(0, offset, nbytes).view(dtype).view(shape)


class Pool:
    def __init__(self, capacity: int, transport):
        self._transport = transport
        self._allocator = Allocator(capacity)
        self._lock = threading.Lock()

    def stage(self, tensors: list[torch.Tensor]):
        allocator = self._allocator
        staged = []
        with self._lock:
            allocator.prepare(tensors[0].device, self._transport)
            if allocator.tensor is None:
                return None
            for t in tensors:
                region = allocator.allocate(t.nbytes)
                if region is None:
                    return None
                staged.append(allocator.view(region[0], t.nbytes, tuple(t.shape), t.dtype))
        stream = torch.cuda.Stream()
        WAIT
        with torch.cuda.stream(stream):
            for dst, src in zip(staged, tensors):
                dst.copy_(src, non_blocking=True)
        stream.synchronize()
        return staged
'''
_POOL_WAIT = ("stream.wait_stream(torch.cuda.current_stream())", "")

_RULES = {
    "a lookup's keys are the keys of the list it looks in": (
        {"mod.py": _TIED}, "mod.py", "def apply", _TIED_WAIT),
    "a collaborator of the file is built for real, its transport answers as checked": (
        {"mod.py": _POOL}, "mod.py", "def stage", _POOL_WAIT),
}


@pytest.mark.parametrize("rule", list(_RULES))
def test_the_state_a_call_needs_is_set_up_the_bug_flagged_the_fix_passes(tmp_path, rule):
    good = _flags_bug_passes_fix(tmp_path, *_RULES[rule])
    assert "1 passed" in good.stdout, good.stdout[-3000:]


def test_a_dict_the_class_fills_by_key_holds_the_entry_the_function_reads(tmp_path):
    body, bad = _rule_run(tmp_path, "buggy", {"mod.py": _PLANS}, "mod.py", "def run",
                          _PLANS_WAIT, fixed=False)
    assert "obj.plans = {n: ('plain',)}" in body, body
    assert "obj.routes = {}" in body and "obj.jobs = {}" not in body, body  # a queue's get()
    assert bad.returncode == 1 and "StreamfuzzError" in bad.stdout, bad.stdout[-3000:]
    _, good = _rule_run(tmp_path, "fixed", {"mod.py": _PLANS}, "mod.py", "def run",
                        _PLANS_WAIT, fixed=True)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:]


# The package's own Triton stand-in leaves the plain function; a stood-in predicate
# gives the flag torch needs as a bool.
_KERNEL = '''
import torch

from no_such_platform_module import is_pinning_available

from apkg.tritonish import jit

PIN = is_pinning_available()


@jit
def scale_kernel(x_ptr, n):
    pass


class Scaler:
    def __init__(self):
        self.side = torch.cuda.Stream()

    def run(self, x: torch.Tensor):
        host = torch.tensor([1.0], pin_memory=PIN)
        WAIT
        with torch.cuda.stream(self.side):
            scale_kernel[(x.shape[0],)](x, x.shape[0])
        KEEP
        return host
'''
_TRITONISH = '''
def jit(fn=None, **kwargs):
    """Where the compiler is not installed: the function itself."""
    return fn if fn is not None else (lambda f: f)
'''
_KERNEL_WAIT = ("self.side.wait_stream(torch.cuda.current_stream())",
                "x.record_stream(self.side)")


def test_a_jit_kernel_without_its_compiler_launches_as_a_kernel_reading_its_tensors(tmp_path):
    files = {"mod.py": _KERNEL, "tritonish.py": _TRITONISH}
    _, bad = _rule_run(tmp_path, "buggy", files, "mod.py", "def run", _KERNEL_WAIT,
                       fixed=False)
    assert bad.returncode == 1 and "StreamfuzzError" in bad.stdout, bad.stdout[-3000:]
    assert "scale_kernel" in bad.stdout, bad.stdout[-3000:]
    _, good = _rule_run(tmp_path, "fixed", files, "mod.py", "def run", _KERNEL_WAIT,
                        fixed=True)
    assert good.returncode == 0 and "1 passed" in good.stdout, good.stdout[-3000:]


# The stream work is a backend's, and every backend the worker may hold copies through a
# CUDA driver entry called with ctypes: nothing a CPU run can do.
_WORKER = '''
import torch

from apkg.backends import DmaBackend, DiskBackend


class Worker:
    def __init__(self):
        self._backend = None
        self.meta = None
        self.load_stream = torch.cuda.Stream()

    def init_dma(self):
        self._backend = DmaBackend()

    def init_disk(self):
        self._backend = DiskBackend()

    def start_load(self):
        meta = self.meta
        if meta is not None and meta.blocks:
            backend = self._backend
            backend.launch_copy(meta.blocks, is_store=False)
'''
_BACKENDS = '''
import queue

import torch

from apkg.memops import copy_blocks


class DmaBackend:
    def __init__(self):
        self.queue = queue.SimpleQueue()
        self.stream = torch.cuda.Stream()

    def launch_copy(self, blocks, is_store):
        self.queue.put((blocks, is_store))

    def loop(self):
        blocks, _ = self.queue.get()
        copy_blocks(blocks, self.stream)


class DiskBackend(DmaBackend):
    pass
'''
_MEMOPS = '''
import ctypes


def copy_blocks(blocks, stream):
    fn = ctypes.CDLL("libcuda.so.1").cuGetProcAddress
    entry = fn(b"cuMemcpyBatchAsync")
    entry(blocks, stream.cuda_stream)
'''


def test_work_only_a_ctypes_driver_call_does_skips_saying_what_it_needs(tmp_path):
    files = {"worker.py": _WORKER, "backends.py": _BACKENDS, "memops.py": _MEMOPS}
    body, r = _rule_run(tmp_path, "worker", files, "worker.py", "def start_load", ("", ""),
                        fixed=False)
    assert "@pytest.mark.skip(reason=" in body, body
    assert "cuMemcpyBatchAsync" in body and "self._backend.launch_copy()" in body, body
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout[-3000:]
