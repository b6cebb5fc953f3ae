"""megatron-core 0.16.1, rank 3 of its scan after the rules of issue 49's second
reading: ``NVSHMEMCopyService.run`` (resharding/copy_services/nvshmem_copy_service.py
l.149).

rank 2's shape on the NVSHMEM backend: ``submit_send_with_id`` keeps a
same-rank send out of the NVSHMEM schedule, and ``run()`` copies it into its
receive buffer on ``self._local_copy_stream`` with no wait for the current
stream. ``execute_reshard_plan`` (resharding/execution.py) makes both on the
current stream just before ``run()``: the send is
``src_param.data[op.my_slice].contiguous()``, a fresh copy wherever the slice
is not contiguous, and the receive buffer is ``torch.empty_like(...)``. Driven
by the release's own ``execute_reshard_plan``, with a slice across the
parameter's columns: flagged (the copy stream reads the contiguous copy, last
written on the current stream). The fixed twin, the copy stream waiting for
the current one before the local copies, is clean.

Hand edits: the service is built without ``__init__`` (which asks
``torch.distributed`` for the rank and builds a ``RemoteCopyService`` that needs
NVSHMEM): rank 0, already initialized, its remote service holding no request
(the plan is one send and its receive on the same rank, so ``run()`` never
reaches NVSHMEM); ``execute_reshard_plan``'s ``dist.barrier()`` is a no-op, as
on one rank.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/resharding/copy_services/nvshmem_copy_service.py"
DRIVER = "megatron/core/resharding/execution.py"
FIX = ("        if self._local_send_ops or self._local_recv_ops:\n",
       "        if self._local_send_ops or self._local_recv_ops:\n"
       "            self._local_copy_stream.wait_stream(torch.cuda.current_stream())\n")


class _Model(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)


def _reshard(loaded):
    module = loaded.module
    service = module.NVSHMEMCopyService.__new__(module.NVSHMEMCopyService)
    service.rank, service._initialized = 0, True
    service._remote = _kit.Obj(send_requests=[], receive_requests=[])
    service._local_send_ops, service._local_recv_ops = {}, {}
    service._local_copy_stream = torch.cuda.Stream()
    execution = _kit.release(REL, DRIVER).module
    execution.dist = _kit.Obj(barrier=lambda: None)
    dev = torch.device("cuda", 0)
    src = _Model(torch.arange(64, dtype=torch.float32, device=dev).reshape(8, 8))
    dst = _Model(torch.zeros(8, 8, device=dev))
    my_slice = (slice(None), slice(2, 6))  # columns: not contiguous
    op = _kit.Obj(param_name="weight", peer_rank=0, my_slice=my_slice, task_id=7)
    plan = _kit.Obj(send_ops=[op], recv_ops=[op])
    execution.execute_reshard_plan(plan, src, dst, service)
    return dst.weight.detach().sum()


def test_r3_local_copy_as_execute_reshard_plan_drives_it_flagged():
    found = _kit.findings(_reshard, _kit.release(REL, FILE))
    assert any("_local_copy_stream reads it" in f and "aten.clone" in f for f in found), found


def test_r3_fixed_twin_clean():
    assert _kit.findings(_reshard, _kit.twin(REL, FILE, *FIX)) == []
