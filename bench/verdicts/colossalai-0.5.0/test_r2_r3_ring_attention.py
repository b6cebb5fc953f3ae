"""colossalai 0.5.0, ranks 2 and 3: ``RingAttention.forward``'s
``_local_ring_forward`` and ``_other_ring_forward`` (shardformer/layer/attn.py
l.776 and l.849).

The ring's steps alternate between the current stream and ``sp_stream``:
step ``i`` runs flash attention on ``sp_streams[i % 2]`` and then rescales the
running ``out`` and ``softmax_lse`` there, reading what step ``i - 1`` wrote on
the other stream. The only wait at a step's start is the KV receive's
(``local_kv_comms[(i + 1) % 2].wait()``), and that receive was issued on the
same stream two steps before (step 0's prefetch, for step 1), so nothing of
step ``i - 1``, on the other stream, is ordered before step ``i``'s reads. (The scan's own
words name ``block_softmax_lse``, a list slot each step rebinds to a fresh
tensor; the unordered tensors are the running ``out`` and ``softmax_lse``.)

Driven as ``RingAttention.attention`` drives it on one rank of a ring of four
(causal batches; rank 2's view of a single ring for rank 2, and ranks 1 and 2
of a 2x2 double ring, ``inner_ring_size=2``, for rank 3): flagged, a race on
the running output between the two streams. The fixed twin, each step's
stream waiting for the other before its attention (which gives up the
overlap of a rescale with the next attention), is clean in the ring: no race,
and nothing freed in it while the other stream may use it. What the
twin still shows on the double ring is the ring's ``softmax_lse``, made on
``sp_stream`` by the last rescale, read on the current stream for
``save_for_backward`` and freed once ``forward`` returns; the release shows it
too, and the next forward's ``sp_stream`` first waits for a receive issued on
the current stream after that read, so it is left out of this verdict.

Hand edits: flash attention's ``_flash_attn_varlen_forward`` is one kernel
reading q, k, v and the sequence offsets and writing the block output and its
log-sum-exp, made on the current stream; ``_rescale_out_lse`` runs eagerly (the
release compiles it; the same tensors are read and written); the P2P ring is
the release's own ``RingComm`` with ``torch.distributed`` described: a
``batch_isend_irecv`` makes one NCCL stream wait for the calling stream, runs
one kernel there reading the sends and writing the receives, and its requests'
``wait`` makes the caller's current stream wait for that kernel, as
ProcessGroupNCCL orders them. Groups are rank lists; the mesh answers them;
the double ring's log line is dropped (its handler is stood in).
"""

import re
import sys

import pytest
import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/shardformer/layer/attn.py"
FIX = ("        def _forward(q, k, v, causal):\n",
       "        def _forward(q, k, v, causal):\n"
       "            for other in sp_streams:\n"
       "                torch.cuda.current_stream().wait_stream(other)\n")
B, H, SQ, D = 1, 2, 16, 8


class _Group:
    def __init__(self, ranks, me):
        self.ranks, self.me = ranks, me


def _dist(me):
    return _kit.Obj(
        get_world_size=lambda group=None: len(group.ranks),
        get_rank=lambda group=None: group.ranks.index(me) if group is not None else me,
        get_global_rank=lambda group, rank: group.ranks[rank],
        P2POp=_kit.p2p_op, isend="isend", irecv="irecv",
        batch_isend_irecv=_kit.batch_isend_irecv(torch.cuda.Stream()), ProcessGroup=_Group)


def _flash_attn_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, **kwargs):
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    _kit.kernel([q, k, v, cu_q, cu_k], [out, lse], "flash_attn_varlen_forward")
    return out, lse, None, torch.empty(2, dtype=torch.int64, device=q.device)


def _attention(loaded, me, inner_ring_size, kept):
    module = loaded.module
    comm = module.RingComm.__init__.__globals__
    comm["dist"] = module.dist = dist = _dist(me)
    module._load_flash_attn = lambda: None
    module.get_dist_logger = lambda: _kit.Obj(info=lambda *args, **kwargs: None)
    module._flash_attn_forward = _flash_attn_forward
    module._rescale_out_lse = module._rescale_out_lse._torchdynamo_orig_callable
    ring = module.RingAttention
    ring.ATTN_DONE = ring.SP_STREAM = ring.HALF_INDICES = ring.CU_SEQLENS = None
    ring.TOTAL_SEQLEN = ring.INNER_RING_GROUP = ring.INTER_RING_GROUP = None
    mesh = _kit.Obj(get_group_along_axis=lambda axis, ranks=None: _Group(
        list(range(4)) if ranks is None else list(ranks), me))
    assert dist.get_world_size(mesh.get_group_along_axis(0)) == 4
    q, k, v = (torch.full((B, H, SQ, D), float(n), dtype=torch.bfloat16, device="cuda",
                          requires_grad=True) for n in range(3))  # training: autograd keeps ctx
    out = ring.attention(q, k, v, 0, module.AttnMaskType.CAUSAL, pg_mesh=mesh,
                         inner_ring_size=inner_ring_size)
    kept.append((ring, out))  # the class keeps its stream; autograd, the output, for backward
    return out.float().sum()  # the next layer reads the output on the current stream


CASES = {"r2-single-ring-rank2": (2, None), "r3-double-ring-rank1": (1, 2),
         "r3-double-ring-rank2": (2, 2)}


@pytest.fixture(autouse=True)
def _flash_attn_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", _kit.Obj(__version__="2.7.4"))


@pytest.mark.parametrize("case", CASES)
def test_r2_r3_as_ring_attention_drives_it_flagged(case):
    found = _kit.findings(_attention, _kit.release(REL, FILE), *CASES[case], [])
    where = "_other_ring_forward" if case.startswith("r3") else "_local_ring_forward"
    assert any("race" in f and where in f for f in found), found


def _freed_in(finding):
    """The function whose line frees a lifetime finding's tensor (its innermost frame)."""
    found = re.search(r"freed \(seen at\):\s+\S+ (\w+)", finding)
    return found.group(1) if found else None


@pytest.mark.parametrize("case", CASES)
def test_r2_r3_fixed_twin_clean(case):
    found = _kit.findings(_attention, _kit.twin(REL, FILE, *FIX), *CASES[case], [])
    # Left: the double ring's softmax_lse, freed as attention() goes on past forward's return
    assert all(_freed_in(f) == "attention" for f in found), found
