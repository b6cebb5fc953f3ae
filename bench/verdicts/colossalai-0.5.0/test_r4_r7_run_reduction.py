"""colossalai 0.5.0, ranks 4 and 7: ``LowLevelZeroOptimizer._run_reduction``
(zero/low_level/low_level_optim.py l.335 and l.354).

Rank 4 reads ``flat_grads`` as carried from one bucket's reduction (written on
the comm stream) to the next bucket's ``flat_grads /= world_size`` on the
current stream; but each reduction's ``flat_grads`` is a fresh tensor
(``BucketStore.get_flatten_grad`` flattens the bucket anew), and the old one's
block is kept from the current stream's next allocation by
``flat_grads.record_stream(stream)``. Rank 7 reads the comm stream's use of
``flat_grads`` as unordered after its write on the current stream because the
wait sits under ``if self._overlap_communication``; without overlap the
reduction runs on the current stream itself, so no wait is needed.

Driven as the backward pass drives it (three gradients made on the current
stream, the post-accumulate-grad hook ``_add_to_bucket`` for each, a bucket
too small for two so it reduces as it fills, then ``_reduce_grad`` and the
synchronize ``backward`` ends with), ZeRO-1 and ZeRO-2, with and without
overlap: clean. The same function without its comm stream's wait is flagged
(rank 7's ordering); without the ``record_stream``, ZeRO-2 is flagged (rank
4's: the next bucket's flattening reuses the block the comm stream still
reduces).

Hand edits: the optimizer and its stores are built without ``__init__``
(which asks ``torch.distributed`` for ranks): the attributes the reduction
reads, two ranks (the stores' base class, past the loader's import depth, is
stood in: its ``world_size`` and ``local_rank`` are plain attributes);
``get_accelerator()`` (stood in on a CPU-only load) answers with ``torch.cuda``;
``dist.all_reduce`` and ``dist.reduce_scatter_tensor`` are one kernel each on
the stream that calls them, as NCCL's synchronous calls order them.
"""

import pytest
import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/zero/low_level/low_level_optim.py"
NO_WAIT = ("                stream.wait_stream(get_accelerator().current_stream())\n", "")
NO_RECORD = ("                flat_grads.record_stream(stream)\n", "")
SIZE = 64


def _store(module, cls, **attrs):
    store = cls.__new__(cls)
    store.__dict__.update(_world_size=2, _local_rank=0, sizes=[2], torch_pg=None, world_size=2,
                          local_rank=0, **attrs)  # BaseStore's two properties
    return store


def _backward(loaded, partition, overlap, kept):
    module = loaded.module
    module.get_accelerator = lambda: _kit.Obj(current_stream=torch.cuda.current_stream,
                                              stream=torch.cuda.stream,
                                              synchronize=torch.cuda.synchronize)
    module.dist = _kit.Obj(
        all_reduce=lambda t, group: _kit.kernel([t], [t], "all_reduce"),
        reduce_scatter_tensor=lambda out, inp, group: _kit.kernel([inp], [out], "reduce_scatter"))
    bucket = _store(module, module.BucketStore, reduce_bucket_size=SIZE + SIZE // 2,
                    comm_stream=torch.cuda.Stream())
    bucket.reset_all()
    grads = _store(module, module.GradientStore, _grads_of_params={},
                   _working_index=0, grad_to_param_mapping={})
    params = [torch.nn.Parameter(torch.zeros(SIZE, device="cuda")) for _ in range(3)]
    opt = module.LowLevelZeroOptimizer.__new__(module.LowLevelZeroOptimizer)
    opt.__dict__.update(
        pg_to_bucket_store={None: bucket}, pid_to_bucket_store={id(p): bucket for p in params},
        pid_to_grad_store={id(p): grads for p in params}, _padding_map={id(p): 0 for p in params},
        _reduce_bucket_size=SIZE + SIZE // 2, _overlap_communication=overlap,
        _communication_dtype=None, _partition_grads=partition, _fp8_communication=False,
        grad_handles=[], _working_param_groups=[params])
    for step, p in enumerate(params):  # autograd accumulates each gradient, then the hook runs
        p.grad = torch.full((SIZE,), float(step + 1), device="cuda")
        if overlap or partition:  # else no hook is attached: _reduce_grad buckets them all
            opt._add_to_bucket(p, 0)
    opt._reduce_grad(partition)  # the rest of LowLevelZeroOptimizer.backward
    if overlap:
        torch.cuda.synchronize()
    kept.append((opt, params))  # the optimizer keeps the reduced gradients for its step
    return sum(g.sum() for per_param in grads._grads_of_params[0].values() for g in per_param)


@pytest.mark.parametrize("partition", [False, True], ids=["zero1", "zero2"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_r4_r7_as_backward_drives_it_clean(partition, overlap):
    assert _kit.findings(_backward, _kit.release(REL, FILE), partition, overlap, []) == []


@pytest.mark.parametrize("partition", [False, True], ids=["zero1", "zero2"])
def test_r7_without_the_comm_streams_wait_flagged(partition):
    found = _kit.findings(_backward, _kit.twin(REL, FILE, *NO_WAIT), partition, True, [])
    assert any("race" in f for f in found), found


def test_r4_without_record_stream_flagged():
    found = _kit.findings(_backward, _kit.twin(REL, FILE, *NO_RECORD), True, True, [])
    assert any("freed while stream comm_stream" in f for f in found), found
