"""colossalai 0.5.0, rank 1: ``ShardedModelV2._reduce_scatter_handler``
(legacy/zero/sharded_model/sharded_model_v2.py l.362).

With ``fp32_reduce_scatter`` the comm stream casts the gradient's clone
(made on the current stream by the backward hook) and ``grad.data = ...``
drops the clone's storage with that cast queued, no ``record_stream``. The
block goes back to the current stream's pool, and the handler's last line
makes the current stream wait for the comm stream before any later work of
the current stream can reuse it. Driven as the backward pass drives it (the
post-backward hook for two parameters in turn, each gradient made on the
current stream, then the bucket flushed on the comm stream and joined, as
``_post_backward_operations`` does): clean. The same handler without its
join (the current stream waiting for the comm stream) is flagged: the next
gradient, made on the current stream, reuses the clone's block while the
cast may still read it.

Hand edits: the model is built without ``__init__`` (which shards a module
over process groups): the attributes the hook and the handler read, two
ranks; a parameter's ``colo_attr`` holds what ``_save_grad`` reads and
writes. The bucketer is the release's own ``ReduceScatterBucketer``; its
``dist._reduce_scatter_base`` is one kernel on the comm stream, reading the
bucket and writing the output shard, as NCCL's synchronous call orders it.
The post-backward flush is those two lines of ``_post_backward_operations``.
The model outlives the checked block, as the engine keeps it and the saved
gradients (views of the bucket's output shard) for the optimizer.
"""

import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/legacy/zero/sharded_model/sharded_model_v2.py"
UNJOINED = ("                self._reduce_scatter_callback(param, grad)\n"
            "        torch.cuda.current_stream().wait_stream(self.comm_stream)\n",
            "                self._reduce_scatter_callback(param, grad)\n")


def _param(saved):
    attr = _kit.Obj(is_replicated=True, offload_grad=False,
                    saved_grad=_kit.Obj(is_null=lambda: True, trans_state=lambda state: None),
                    grad_payload_reset=saved.append)
    return _kit.Obj(dtype=torch.float32, colo_attr=attr)


def _backward(loaded, kept):
    module = loaded.module
    reducer = module.ReduceScatterBucketer(1)
    bucketing = reducer.reduce_scatter_async.__wrapped__.__globals__
    bucketing["dist"] = _kit.Obj(_reduce_scatter_base=lambda out, inp, group: _kit.kernel(
        [inp], [out], "reduce_scatter"))
    model = module.ShardedModelV2.__new__(module.ShardedModelV2)
    model.__dict__.update(
        _require_backward_grad_sync=True, comm_stream=torch.cuda.Stream(), world_size=2,
        fp32_reduce_scatter=True, gradient_predivide_factor=2.0, gradient_postdivide_factor=1.0,
        reduce_scatter_process_group=_kit.Obj(size=lambda: 2), reducer=reducer,
        overflow_counter=0, reuse_fp16_shard=False)
    saved = []  # what _save_grad keeps: views of the bucket's output shard
    for step in range(2):  # autograd calls the hook once a parameter's gradient is made
        grad = torch.full((64,), float(step + 1), dtype=torch.float16, device="cuda")
        model._grad_post_backward_hook(_param(saved), grad)
    with torch.cuda.stream(model.comm_stream):  # _post_backward_operations
        model.reducer.flush()
    torch.cuda.current_stream().wait_stream(model.comm_stream)
    kept.append((model, saved))  # the model and its saved gradients outlive the step
    return sum(g.sum() for g in saved)


def test_r1_as_the_backward_hooks_drive_it_clean():
    assert _kit.findings(_backward, _kit.release(REL, FILE), []) == []


def test_r1_without_the_handlers_join_flagged():
    found = _kit.findings(_backward, _kit.twin(REL, FILE, *UNJOINED), [])
    assert any("aten.clone was freed while stream comm_stream" in f for f in found), found
