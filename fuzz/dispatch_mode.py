"""The base of the harness's dispatch modes: one that does not import Dynamo.

``TorchDispatchMode`` wraps a subclass's ``__torch_dispatch__`` so that
``torch.compile`` skips it, and that wrapper imports ``torch._dynamo`` on the
first op: the largest part of a rank's cold start (3.9-6.0 s of 8-12 s,
measured on an H200 node). The harness never compiles, so its modes opt out
through the class hook torch documents for it. A target whose handler calls
``torch.compile``d code runs it under these modes too; should Dynamo then
trace into a mode, set the hook back (return True) for that run.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C._distributed_c10d import BroadcastOptions, ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode


class DispatchMode(TorchDispatchMode):
    """A ``TorchDispatchMode`` that never runs under ``torch.compile``."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


RECORD_STREAM = torch.ops.aten.record_stream.default
"""The op the simulation's and the oracles' modes each handle apart (it moves
no data: it tells the allocator about a stream), looked up once: each op is
compared with it."""


BROADCAST = torch.ops.c10d.broadcast_.default


def run_op(func: Any, args: tuple, kwargs: dict) -> Any:
    """An op, run from inside a mode's ``__torch_dispatch__``, as the op itself would run.

    A broadcast in its usual form (every argument positional, the default
    timeout) goes straight to its process group, as ``dist.broadcast`` does:
    the op's generic call converts every argument and result through its
    schema and, for an op taking a process group, walks them looking for fake
    script objects, which costs more than the broadcast itself. Its result is
    what the op returns (the tensors, the boxed work). CPU tensors only (gloo,
    the simulation): NCCL's process group hands a blocking broadcast's work
    back as None, which the op's schema cannot return. Any other op runs its
    kernel lookup directly (``OpOverload.__call__`` is a Python frame around it).
    """
    if func is BROADCAST and not kwargs and 4 <= len(args) <= 6 and (
            len(args) < 6 or args[5] == -1) and args[0] and not args[0][0].is_cuda:
        opts = BroadcastOptions()
        opts.rootRank, opts.rootTensor = args[2], args[3]
        if len(args) > 4:
            opts.asyncOp = args[4]
        work = ProcessGroup.unbox(args[1]).broadcast(args[0], opts)
        return args[0], work.boxed()
    return func._op(*args, **kwargs)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(device: torch.device) -> int:
    """The current CUDA stream's ``cudaStream_t`` on ``device``, as the ops a
    mode sees are issued on it: read as a raw handle where torch offers one,
    so no ``Stream`` object is made per op."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device.index if device.index is not None
                           else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def unobserved() -> torch._C._DisableTorchDispatch:
    """The harness's own ops (a gate opened, a checker classifying a tensor),
    hidden from every dispatch mode: they are no access by the code under test."""
    return torch._C._DisableTorchDispatch()


class _Nothing(DispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return run_op(func, args, kwargs or {})


def warm(device: torch.device) -> None:
    """Enter a mode once, paying now whatever the first entry costs (a torch
    without the hook still imports Dynamo here, before the first example)."""
    with _Nothing():
        torch.zeros(1, device=device).add_(1)
