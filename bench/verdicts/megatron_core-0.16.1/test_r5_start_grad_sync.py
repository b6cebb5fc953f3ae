"""megatron-core 0.16.1, rank 5 of its scan after the rules of issue 49's second
reading: ``_ParamAndGradBucketGroup.start_grad_sync``
(distributed/param_and_grad_buffer.py l.438).

With several distributed-optimizer instances and ``overlap_grad_reduce``, the
gradient reduce-scatter runs on ``self.communication_stream``, which waits for
``torch.cuda.default_stream()`` (l.422), not for the stream the gradients were
made on. Megatron itself makes that another stream: ``CudaGraphManager.__init__``
(transformer/cuda_graphs.py l.1434, ``cuda_graph_impl="local"``) sets a new side
stream as current, and it stays current until ``create_cudagraphs()`` sets the
default stream back at the end of the step that creates the graphs (l.471), after
a device-wide synchronize before each capture (l.934).
In that step the backward writes the grad buffer on the side stream, and
``finalize_model_grads`` -> ``finish_grad_sync`` runs ``start_grad_sync`` (the
first batch launches it there). Driven so: flagged (the communication stream
reads the grad buffer unordered with the side stream's write). The fixed twin,
the communication stream waiting for the current stream, is clean; so is the
release when training runs on the default stream (the last test), which is
why the wait holds in a run without local CUDA graphs.

Hand edits: the collectives are described by what they read and write on the
stream they are issued on (``async_op`` is False with several instances, so the
issuing stream waits for NCCL): ``reduce_scatter_tensor`` reads the bucket and
writes this rank's shard, the inter-instance ``all_reduce`` reads and writes the
shard; ``_coalescing_manager`` only groups them. The groups are small objects
with a rank. The bucket, the bucket group and the DDP config are the release's
own; the communication stream is set as ``DistributedDataParallel.__init__``
sets it.
"""

import contextlib

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/distributed/param_and_grad_buffer.py"
FIX = ("self.communication_stream.wait_stream(torch.cuda.default_stream())",
       "self.communication_stream.wait_stream(torch.cuda.current_stream())")
DEV = torch.device("cuda", 0)
_MODEL_LIFETIME = []  # the DDP grad buffers live as long as the model: never freed in a step


def _reduce_scatter(output, input, op=None, group=None, async_op=False):
    _kit.kernel([input], [output], "reduce_scatter_tensor")


def _all_reduce(tensor, op=None, group=None, async_op=False):
    _kit.kernel([tensor], [tensor], "all_reduce")


class _TorchWithCollectives:
    """``torch`` as the file sees it, with ``torch.distributed``'s calls described."""

    def __init__(self, torch_module):
        self._torch = torch_module
        self.distributed = _kit.Obj(all_reduce=_all_reduce, ReduceOp=torch.distributed.ReduceOp,
                                    get_rank=lambda: 0)

    def __getattr__(self, name):
        return getattr(self._torch, name)


@contextlib.contextmanager
def _coalescing_manager(group, async_ops=False):
    yield _kit.Obj(wait=lambda: None)


def _bucket_group(module):
    module.torch = _TorchWithCollectives(module.torch)
    module.dist_reduce_scatter_func = _reduce_scatter
    module._coalescing_manager = _coalescing_manager
    config = module.DistributedDataParallelConfig(
        use_distributed_optimizer=True, overlap_grad_reduce=True,
        num_distributed_optimizer_instances=2)
    param = torch.nn.Parameter(torch.zeros(16, device=DEV))
    grad_data = torch.zeros(16, device=DEV)  # the DDP grad buffer
    _MODEL_LIFETIME.append(grad_data)
    bucket = module._ParamAndGradBucket([param], None, grad_data, offset=0, numel_unpadded=16,
                                        gradient_scaling_factor=1.0, bucket_id=0)
    group = module._ParamAndGradBucketGroup([bucket], config,
                                            collective_group=_kit.Obj(rank=lambda: 0),
                                            collective_group_size=2)
    group.inter_distributed_optimizer_instance_group = _kit.Obj(rank=lambda: 0)
    group.communication_stream = torch.cuda.Stream()
    return group, grad_data


def _first_step(loaded, local_cuda_graphs=True):
    default = torch.cuda.default_stream()
    if local_cuda_graphs:
        torch.cuda.set_stream(torch.cuda.Stream())  # CudaGraphManager.__init__
    try:
        group, grad_data = _bucket_group(loaded.module)
        grad_data.zero_()     # zero_grad_buffer at the start of the step
        grad_data.add_(1.0)   # the backward's main_grad accumulation
        group.finish_grad_sync()  # finalize_model_grads, first batch
        torch.cuda.synchronize()  # create_cudagraphs: before each capture (l.934)
        torch.cuda.set_stream(default)  # and at its end (l.471)
        return grad_data.sum()  # the optimizer's read
    finally:
        torch.cuda.set_stream(default)


def test_r5_side_stream_of_local_cuda_graphs_flagged():
    found = _kit.findings(_first_step, _kit.release(REL, FILE))
    assert any("communication_stream reads it (reduce_scatter_tensor)" in f
               and "aten.add_" in f for f in found), found


def test_r5_fixed_twin_clean():
    assert _kit.findings(_first_step, _kit.twin(REL, FILE, *FIX)) == []


def test_r5_training_on_the_default_stream_clean():
    assert _kit.findings(_first_step, _kit.release(REL, FILE), local_cuda_graphs=False) == []
