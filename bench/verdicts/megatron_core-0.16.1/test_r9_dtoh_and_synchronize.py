"""megatron-core 0.16.1, rank 9 of its scan after the rules of issue 49's second
reading: ``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``
(transformer/moe/token_dispatcher.py l.880).

At its device-to-host point the dispatcher copies the split sizes and token
counts that ``preprocess`` just computed on the current stream to the host, on
``cuda_dtoh_stream``. The wait is conditional: ``on_side_stream =
torch.cuda.current_stream() != self.cuda_dtoh_stream``, then ``if
on_side_stream: self.cuda_dtoh_stream.wait_stream(torch.cuda.current_stream())``.
Where the guard is false the current stream is the copy stream itself, so
there is no second stream to order: the wait holds on every path. Driven as
``MoELayer`` drives the dispatcher (``dispatch_preprocess``, ``token_dispatch``,
``dispatch_postprocess``, expert parallel over two ranks, so the splits are
device tensors): clean on the default stream, and clean with the copy stream
current (the guard's false branch). With the wait removed: flagged (the copy
stream reads the splits unordered with the current stream's writes), so the
guarded wait is what orders it.

"Clean" on the default stream is clean but for one thing the checker counts
and the code does not do: ``maybe_move_tensor_to_cpu(..., as_numpy=True)``
makes a numpy view of each split copy right after its non-blocking copy
(moe_utils.py l.1096), and the checker takes ``Tensor.numpy`` for a host read
(it cannot see reads through the view). No value is read there: the splits are
read by the all-to-all after ``d2h_event.synchronize()`` at its sync point. The
two clean tests assert that those views are the only findings.

Hand edits: no process group is initialized: the groups are small objects with
a size and a rank, and ``utils``' ``get_pg_size``/``get_pg_rank`` ask them (the
release answers 1 and 0 without ``torch.distributed``). The token-count
all-gather over the TP x EP group returns this rank's counts twice (the other
rank routes alike), on the current stream as the synchronous gather leaves
them; the all-to-all is described by what it reads and writes, its output
sized by the host split sizes it is given. The config is an object with the
fields the dispatcher reads.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/transformer/moe/token_dispatcher.py"
NO_WAIT = ("                if on_side_stream:\n"
           "                    self.cuda_dtoh_stream.wait_stream(torch.cuda.current_stream())\n",
           "")
DEV = torch.device("cuda", 0)
TOKENS, HIDDEN, EXPERTS, TOPK = 8, 4, 4, 2


def _group(size):
    return _kit.Obj(size=lambda: size, rank=lambda: 0)


def _all_to_all(group, input, output_split_sizes=None, input_split_sizes=None):
    out = torch.empty(int(sum(output_split_sizes)), *input.shape[1:], dtype=input.dtype,
                      device=input.device)
    _kit.kernel([input], [out], "all_to_all")
    return out


def _dispatcher(module):
    module.utils = _kit.Obj(get_pg_size=lambda g: g.size(), get_pg_rank=lambda g: g.rank())
    module.gather_from_sequence_parallel_region = lambda t, group=None, **kw: torch.cat([t, t])
    module.all_to_all = _all_to_all
    config = _kit.Obj(num_moe_experts=EXPERTS, moe_permute_fusion=False,
                      moe_pad_expert_input_to_capacity=False, cuda_graph_impl="none",
                      cuda_graph_scope=[], moe_expert_capacity_factor=None,
                      moe_router_padding_for_quantization=False, moe_router_topk=TOPK)
    pgs = _kit.Obj(ep=_group(2), expt_tp=_group(1), tp_ep=_group(2))
    return module.MoEAlltoAllTokenDispatcher(num_local_experts=2, local_expert_indices=[0, 1],
                                             config=config, pg_collection=pgs)


def _dispatch(loaded, on_copy_stream=False):
    dispatcher = _dispatcher(loaded.module)
    stream = dispatcher.cuda_dtoh_stream if on_copy_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):  # the layer's forward runs on it, the router included
        hidden = torch.randn(TOKENS, HIDDEN, device=DEV)
        routing_map = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool, device=DEV)
        routing_map[:, 0] = True
        routing_map[::2, 3] = True
        probs = torch.rand(TOKENS, EXPERTS, device=DEV)
        tokens, probs = dispatcher.dispatch_preprocess(hidden, routing_map, probs)
        tokens, probs = dispatcher.token_dispatch(tokens, probs)
        tokens, per_expert, probs = dispatcher.dispatch_postprocess(tokens, probs)
        return per_expert.tolist(), tokens.sum()  # the experts' host split sizes, their input


def _but_numpy_views(found):
    """The findings other than the host "reading" a copy's ``.numpy()`` view (l.1096)."""
    return [f for f in found if "the host reads it (Tensor.numpy)" not in f
            or "moe_utils.py:1096 maybe_move_tensor_to_cpu" not in f]


def test_r9_dispatch_as_moe_layer_drives_it_clean():
    found = _kit.findings(_dispatch, _kit.release(REL, FILE))
    assert found and _but_numpy_views(found) == [], found


def test_r9_with_the_copy_stream_current_clean():
    found = _kit.findings(_dispatch, _kit.release(REL, FILE), on_copy_stream=True)
    assert found and _but_numpy_views(found) == [], found


def test_r9_without_the_guarded_wait_flagged():
    found = _kit.findings(_dispatch, _kit.twin(REL, FILE, *NO_WAIT))
    assert any("read-after-write" in f and "cuda_dtoh_stream reads it" in f for f in found), found
