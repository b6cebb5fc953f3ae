"""colossalai 0.5.0, rank 8: ``LowLevelZeroOptimizer.step`` (zero/low_level/low_level_optim.py
l.617), with ``overlap_allgather``.

Each updated shard (``param_to_gather``, made on the current stream) is
all-gathered asynchronously into the working parameter's padded storage, and
the work is handed on: ``set_all_gather_handle`` puts it on the parameter and
``ZeroOpHook.pre_forward`` (``wait_all_gather_handle``) waits for it before the
next forward uses the parameter. What the scan counts as touched before the
wait is the name ``param_to_gather`` bound to the next shard (the backend
keeps the last one until its work is waited for) and a dict lookup keyed by the
parameter. Driven as training drives it (a ZeRO-2 backward with overlapped
reduction, ``step``, then the next forward's hook and a read of each working
parameter on the current stream): clean. The same ``step`` without handing
the work on (no ``set_all_gather_handle``) is flagged: the next forward reads
a parameter the gather may still be writing.

Hand edits: the optimizer and its stores are built without ``__init__``
(which asks ``torch.distributed`` for ranks): the attributes backward and
``step`` read, two ranks, three bf16 working parameters with their fp32 master
shards under SGD (the stores' base class, past the loader's import depth, is
stood in: its ``world_size`` and ``local_rank`` are plain attributes);
``get_accelerator()`` (stood in on a CPU-only load) answers with ``torch.cuda``
and the device of a tensor made there. Collectives are described:
``dist.reduce_scatter_tensor`` and the norm's ``torch.distributed.all_reduce``
are one kernel each on the calling stream (NCCL's synchronous calls);
``all_gather_into_tensor`` with ``async_op`` makes one NCCL stream wait for the
calling stream and runs one kernel there, its work keeps the input and output
until waited for (ProcessGroupNCCL stashes them), and ``wait`` makes the then
current stream wait for it.
"""

import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/zero/low_level/low_level_optim.py"
NOT_HANDED_ON = ("                    set_all_gather_handle(working_param, handle)\n", "")
SIZE = 64


class _Group:
    """A process group of two ranks, this process rank 0."""


def _store(cls, **attrs):
    store = cls.__new__(cls)
    store.__dict__.update(_world_size=2, _local_rank=0, sizes=[2], torch_pg=None, world_size=2,
                          local_rank=0, **attrs)  # BaseStore's two properties
    return store


def _collectives(module, monkeypatch):
    gather_stream = torch.cuda.Stream()

    def all_gather_into_tensor(out, inp, group=None, async_op=False):
        gather_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(gather_stream):
            _kit.kernel([inp], [out], "all_gather")
            done = torch.cuda.Event()
            done.record()
        held = [inp, out]

        def wait():
            torch.cuda.current_stream().wait_event(done)
            held.clear()

        work = _kit.Obj(wait=wait)
        if not async_op:
            work.wait()
            return None
        return work

    dist = _kit.Obj(
        ProcessGroup=_Group, get_world_size=lambda group=None: 2, get_rank=lambda group=None: 0,
        all_reduce=lambda t, group=None, op=None: _kit.kernel([t], [t], "all_reduce"),
        reduce_scatter_tensor=lambda out, inp, group=None: _kit.kernel([inp], [out],
                                                                       "reduce_scatter"),
        all_gather_into_tensor=all_gather_into_tensor)
    module.dist = dist
    module.all_gather_into_flat_tensor_nd.__globals__["dist"] = dist
    monkeypatch.setattr(torch.distributed, "all_reduce", dist.all_reduce)
    device = torch.ones(1, device="cuda").device
    module.get_accelerator = lambda: _kit.Obj(
        current_stream=torch.cuda.current_stream, stream=torch.cuda.stream,
        synchronize=torch.cuda.synchronize, get_current_device=lambda: device)


def _train_step(loaded, monkeypatch, kept):
    module = loaded.module
    _collectives(module, monkeypatch)
    pg = _Group()
    params = [torch.nn.Parameter(torch.zeros(SIZE, dtype=torch.bfloat16, device="cuda"))
              for _ in range(3)]
    masters = [p.data.view(-1).split(SIZE // 2)[0].detach().clone().float() for p in params]
    bucket = _store(module.BucketStore, reduce_bucket_size=SIZE + SIZE // 2,
                    comm_stream=torch.cuda.Stream())
    bucket.reset_all()
    grads = _store(module.GradientStore, _grads_of_params={}, _working_index=0,
                   grad_to_param_mapping={})
    opt = module.LowLevelZeroOptimizer.__new__(module.LowLevelZeroOptimizer)
    opt.__dict__.update(
        pg_to_bucket_store={pg: bucket}, pid_to_bucket_store={id(p): bucket for p in params},
        pg_to_grad_store={pg: grads}, pid_to_grad_store={id(p): grads for p in params},
        pg_to_param_list={pg: params}, param_to_pg={p: pg for p in params},
        _padding_map={id(p): 0 for p in params}, _reduce_bucket_size=SIZE + SIZE // 2,
        _overlap_communication=True, _communication_dtype=None, _partition_grads=True,
        _fp8_communication=False, grad_handles=[], _working_param_groups=[params],
        _master_param_groups_of_current_rank={0: masters}, require_grad_sync=True,
        mixed_precision_mixin=None, _master_weights=True, _clip_grad_norm=0.0,
        _dtype=torch.bfloat16, _overlap_allgather=True,
        _working_param_to_padded_working_param={p: p.data.view(-1) for p in params},
        optim=torch.optim.SGD(masters, lr=0.1))
    for step, p in enumerate(params):  # backward: each gradient made, then the reduction hook
        p.grad = torch.full((SIZE,), float(step + 1), dtype=torch.bfloat16, device="cuda")
        opt._add_to_bucket(p, 0)
    opt._reduce_grad(True)
    torch.cuda.synchronize()  # LowLevelZeroOptimizer.backward ends so with overlap
    opt.step()
    for p in params:  # the next forward: ZeroOpHook.pre_forward, then the layer reads it
        module.wait_all_gather_handle(p)
    kept.append((opt, params))
    return sum(p.float().sum() for p in params)


def test_r8_as_training_drives_it_clean(monkeypatch):
    assert _kit.findings(_train_step, _kit.release(REL, FILE), monkeypatch, []) == []


def test_r8_without_handing_the_gather_on_flagged(monkeypatch):
    found = _kit.findings(_train_step, _kit.twin(REL, FILE, *NOT_HANDED_ON), monkeypatch, [])
    assert any("race" in f and "all_gather" in f for f in found), found
