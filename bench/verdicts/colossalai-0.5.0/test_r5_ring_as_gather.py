"""colossalai 0.5.0, rank 5: ``_ring_as_gather.communicate_step``
(shardformer/layer/_operation.py l.442).

``communicate_step`` returns the ``batch_isend_irecv`` requests, and
``_ring_as_gather`` waits for each before it swaps the buffers, sends again and
computes on what it received: the requests are handed on, and waited for.
Driven as ``_LinearWithGatherForwardReduceScatterBackward.forward`` drives it
with ``ring=True`` (``F.linear`` over each received shard of a ring of four,
the input made on the current stream, the output read there): clean. The
same function without its in-loop wait for the requests is flagged: the
linear reads a shard the receive may still be writing.

Hand edits: ``torch.distributed`` is described: a ``batch_isend_irecv`` makes
one NCCL stream wait for the calling stream, runs one kernel there reading
the sends and writing the receives, and its requests' ``wait`` makes the
caller's current stream wait for that kernel, as ProcessGroupNCCL orders
them; the group is the ranks 0..3, this process rank 1.
"""

import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/shardformer/layer/_operation.py"
UNWAITED = ("    for i in range(group_size - 2):\n"
            "        for handle in handles:\n"
            "            handle.wait()\n",
            "    for i in range(group_size - 2):\n")
B, S, H = 2, 4, 8


def _linear_forward(loaded, kept):
    module = loaded.module
    module.dist = _kit.Obj(
        get_world_size=lambda group=None: 4, get_rank=lambda group=None: 1,
        get_process_group_ranks=lambda group: [0, 1, 2, 3],
        P2POp=_kit.p2p_op, isend="isend", irecv="irecv",
        batch_isend_irecv=_kit.batch_isend_irecv(torch.cuda.Stream()))
    x = torch.full((B, S, H), 1.0, device="cuda", requires_grad=True)
    weight = torch.full((H, H), 0.5, device="cuda", requires_grad=True)
    bias = torch.zeros(H, device="cuda", requires_grad=True)
    out = module._LinearWithGatherForwardReduceScatterBackward.apply(
        x, weight, bias, None, False, 1, True)
    kept.append(out)  # autograd keeps the gathered input for backward
    return out.sum()  # the next layer reads the output on the current stream


def test_r5_as_the_ring_linear_drives_it_clean():
    assert _kit.findings(_linear_forward, _kit.release(REL, FILE), []) == []


def test_r5_without_the_in_loop_wait_flagged():
    found = _kit.findings(_linear_forward, _kit.twin(REL, FILE, *UNWAITED), [])
    assert any("race" in f and "nccl_send_recv" in f for f in found), found
