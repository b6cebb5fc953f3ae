"""megatron-core 0.16.1, rank 2 of its scan after the rules of issue 49's second
reading: ``NCCLCopyService.run`` (resharding/copy_services/nccl_copy_service.py
l.110).

The copy stream copies each same-rank send into its receive buffer with no wait
for the current stream. ``execute_reshard_plan`` (resharding/execution.py) makes
both on the current stream just before ``run()``: the send is
``src_param.data[op.my_slice].contiguous()``, a fresh copy wherever the slice is
not contiguous, and the receive buffer is ``torch.empty_like(...)``. Driven as
that function drives it, with a slice across the parameter's rows: flagged (the
copy stream reads the contiguous copy, last written on the current stream). The
fixed twin, the copy stream waiting for the current one before the local
copies, is clean.

Hand edits: the service is built without ``__init__`` (which asks
``torch.distributed`` for the rank): the four attributes it sets, on one rank;
the plan is one local send and its receive, as the planner makes for a slice
that stays on its rank. No remote op, so no process group is needed.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/resharding/copy_services/nccl_copy_service.py"
FIX = ("        if local_sends or local_recvs:\n",
       "        if local_sends or local_recvs:\n"
       "            self._copy_stream.wait_stream(torch.cuda.current_stream())\n")


def _reshard(loaded):
    module = loaded.module
    service = module.NCCLCopyService.__new__(module.NCCLCopyService)
    service.rank, service.world_size = 0, 1
    service.send_ops, service.recv_ops = [], []
    service._copy_stream = torch.cuda.Stream()
    src_param = torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8)
    dst_param = torch.zeros(8, 8, device="cuda")
    my_slice = (slice(None), slice(2, 6))  # columns: not contiguous
    src_view = src_param.data[my_slice].contiguous()  # execute_reshard_plan's send
    service.submit_send_with_id(0, src_view, 0)
    recv_buffer = torch.empty_like(dst_param.data[my_slice].contiguous())
    service.submit_recv_with_id(0, recv_buffer, 0)
    service.run()
    dst_param.data[my_slice].copy_(recv_buffer)  # the write-back after run()
    return dst_param.sum()


def test_r2_local_copy_as_execute_reshard_plan_drives_it_flagged():
    found = _kit.findings(_reshard, _kit.release(REL, FILE))
    assert any("race" in f for f in found), found


def test_r2_fixed_twin_clean():
    assert _kit.findings(_reshard, _kit.twin(REL, FILE, *FIX)) == []
