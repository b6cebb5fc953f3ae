"""megatron-core 0.16.1, rank 8 of its scan after the rules of issue 49's second
reading: ``LinearWithGradAccumulationAndAsyncCommunication.backward``
(tensor_parallel/layers.py l.544), ``unwaited-collective``.

With ``allreduce_dgrad`` the input gradient's all-reduce is launched with
``async_op=True`` (l.544) and its handle is waited at l.624 (``if
ctx.allreduce_dgrad: handle.wait()``), after the weight gradient, before the
gradient is returned. The scan loses the wait because the same name
``handle`` is bound to the sequence-parallel reduce-scatter in a branch the
code asserts exclusive (``assert not ctx.allreduce_dgrad`` under ``if
ctx.sequence_parallel``). Driven as ``ColumnParallelLinear`` drives it
(``linear_with_grad_accumulation_and_async_allreduce`` with ``allreduce_dgrad``,
then the backward, then the layer below reading the input gradient on the
current stream): clean. With the wait at l.624 removed: flagged (the layer
below reads the gradient unordered with the all-reduce's write), so the wait is
what orders it.

Hand edits: ``torch.distributed.all_reduce`` is described as NCCL runs it: on a
stream of its own that first waits for the issuing stream, its work ended by
an event, and the handle's ``wait()`` making the current stream wait for that
event; ``async_op=False`` waits at once. No process group is initialized, so
the layer's ``tp_group`` is ``None``, as the release passes it then.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/tensor_parallel/layers.py"
NO_WAIT = ("        if ctx.allreduce_dgrad:\n            handle.wait()\n", "")
DEV = torch.device("cuda", 0)


class _Nccl:
    """``torch.distributed``'s all-reduce on a stream of its own, as NCCL runs it."""

    def __init__(self):
        self.stream = torch.cuda.Stream()
        self.ReduceOp = torch.distributed.ReduceOp

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            _kit.kernel([tensor], [tensor], "all_reduce")
        done = torch.cuda.Event()
        done.record(self.stream)
        work = _kit.Obj(wait=lambda: torch.cuda.current_stream().wait_event(done))
        if not async_op:
            work.wait()
            return None
        return work


class _TorchWithNccl:
    def __init__(self, torch_module, nccl):
        self._torch = torch_module
        self.distributed = nccl

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _backward(loaded):
    module = loaded.module
    module.torch = _TorchWithNccl(module.torch, _Nccl())
    x = torch.randn(4, 8, device=DEV, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(6, 8, device=DEV))
    out = module.linear_with_grad_accumulation_and_async_allreduce(
        x, weight, None, gradient_accumulation_fusion=False, allreduce_dgrad=True,
        sequence_parallel=False)
    out.sum().backward()
    return x.grad.mul(2.0)  # the layer below reads the input gradient


def test_r8_dgrad_all_reduce_as_column_parallel_linear_drives_it_clean():
    assert _kit.findings(_backward, _kit.release(REL, FILE)) == []


def test_r8_without_the_wait_at_l624_flagged():
    found = _kit.findings(_backward, _kit.twin(REL, FILE, *NO_WAIT))
    assert any("all_reduce" in f and "aten.mul" in f for f in found), found
