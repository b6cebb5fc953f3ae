"""colossalai 0.5.0, rank 6: ``GeminiDDP.grad_handle`` (zero/gemini/gemini_ddp.py l.430),
with ``enable_async_reduce``.

What the scan reads as ``p`` used on ``async_reduce_stream`` is ``grads_device[p]``,
a dict lookup keyed by the parameter: no device work touches ``p`` there. The
gradient is copied into the chunk on the current stream; the async stream
waits for the current stream before it reduce-scatters the chunk, waits for
that work, and scales the shard; ``_post_backward`` synchronizes the async
stream before anything reads the reduced gradients. Driven as a backward pass
drives it (each parameter's chunk gathered for the forward, its state moved
by the backward's op hooks, its gradient made on the current stream and the
hook run, for both parameters of one chunk, so the second one reduces the
chunk; then ``_post_backward``'s synchronize and a read of the shard): clean.
The same function without the async stream's wait for the current stream is
flagged: the reduce-scatter reads the chunk the gradient copy may still be
writing.

Hand edits: ``get_accelerator()`` (stood in on a CPU-only load) answers with
``torch.cuda`` and the device of a tensor made there, in the chunk, the chunk
manager and ``gemini_ddp``; ``colossalai.utils.free_storage`` (past the
loader's import depth) is ``chunk.py``'s own ``free_storage``, which frees the
same way (the storage resized to 0). The op hooks' layout work (the stood-in
``GeminiManager``) is the chunk manager's ``access_chunk``, and their state
moves are ``trans_tensor_state`` as ``GeminiZeROHook.pre_op``/``post_op`` make
them. ``grad_handle``'s ``torch._C.DisableTorchFunction()`` (there for
``ColoParameter``'s torch-function override, which these plain parameters
lack) is a null context, so that the CPU simulation, a torch-function mode,
sees its factory calls. Collectives are described: ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` make one NCCL stream wait for the calling stream and
run one kernel there; with ``async_op`` the tensors are recorded on that stream
(ProcessGroupNCCL's ``recordStream``) and ``wait`` makes the then current stream
wait for it, else the calling stream waits at once. Two ranks, this one rank 0.
"""

import contextlib

import torch

from bench.verdicts import _kit

REL = "colossalai-0.5.0"
FILE = "colossalai/zero/gemini/gemini_ddp.py"
UNORDERED = (" " * 16 + "async_reduce_stream.wait_stream(get_accelerator().current_stream())\n",
             " " * 16 + "pass\n")
SIZE = 64


def _collectives():
    nccl = torch.cuda.Stream()

    def collective(out, inp, label, async_op):
        nccl.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(nccl):
            _kit.kernel([inp], [out], label)
            done = torch.cuda.Event()
            done.record()
        work = _kit.Obj(wait=lambda: torch.cuda.current_stream().wait_event(done))
        if not async_op:
            work.wait()
            return None
        inp.record_stream(nccl)
        out.record_stream(nccl)
        return work

    return _kit.Obj(
        get_world_size=lambda group=None: 2, get_rank=lambda group=None: 0,
        all_gather_into_tensor=lambda out, inp, group=None, async_op=False: collective(
            out, inp, "all_gather", async_op),
        reduce_scatter_tensor=lambda out, inp, group=None, async_op=False: collective(
            out, inp, "reduce_scatter", async_op))


class _Delegate:
    """``base`` with some attributes answered otherwise."""

    def __init__(self, base, **attrs):
        self._base = base
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        return getattr(self._base, name)


def _backward(loaded, kept):
    module = loaded.module
    module.torch = _Delegate(torch, _C=_Delegate(torch._C,
                                                 DisableTorchFunction=contextlib.nullcontext))
    chunks = module.ChunkManager.__init__.__globals__
    chunk_module = module.Chunk.__init__.__globals__
    device = torch.ones(1, device="cuda").device
    accelerator = _kit.Obj(name="cuda", get_current_device=lambda: device, Stream=torch.cuda.Stream,
                           current_stream=torch.cuda.current_stream, stream=torch.cuda.stream)
    dist = _collectives()
    for namespace in (vars(module), chunks, chunk_module):
        namespace["get_accelerator"] = lambda: accelerator
    for namespace in (vars(module), chunks):
        namespace["free_storage"] = chunk_module["free_storage"]
    chunks["dist"] = chunk_module["dist"] = dist
    manager = module.ChunkManager({2: {"chunk_size": 4 * SIZE, "keep_gathered": False}},
                                  reuse_fp16_chunk=True)
    params = [torch.nn.Parameter(torch.full((SIZE,), float(n), dtype=torch.bfloat16,
                                            device="cuda")) for n in range(2)]
    for p in params:  # GeminiDDP._init_chunks
        manager.register_tensor(tensor=p, group_type="fp16_param", config_key=2, zero_group=None,
                                cpu_offload=False, pin_memory=False)
    manager.close_all_groups()
    chunk = manager.get_chunk(params[0])
    state = module.TensorState
    manager.access_chunk(chunk)  # forward: pre_op gathers the chunk, post_op holds it
    for p in params:
        manager.trans_tensor_state(p, state.COMPUTE)
        manager.trans_tensor_state(p, state.HOLD)
    async_reduce_stream = torch.cuda.Stream()
    for n, p in enumerate(params):  # backward: pre_op, the gradient, post_op, the hook
        manager.trans_tensor_state(p, state.COMPUTE)
        grad = torch.full((SIZE,), float(n + 1), dtype=torch.bfloat16, device="cuda")
        manager.trans_tensor_state(p, state.HOLD_AFTER_BWD)
        module.GeminiDDP.grad_handle(
            grad, chunk_manager=manager, param2name={p: f"w{n}" for n, p in enumerate(params)},
            grads_device={p: device for p in params}, master_weights=True,
            enable_gradient_accumulation=False, p=p, async_reduce_stream=async_reduce_stream)
    async_reduce_stream.synchronize()  # GeminiDDP._post_backward
    kept.append((manager, params))
    return chunk.cuda_shard.float().sum()  # the optimizer reads the reduced shard


def test_r6_as_the_backward_drives_it_clean():
    assert _kit.findings(_backward, _kit.release(REL, FILE), []) == []


def test_r6_without_the_async_streams_wait_flagged():
    found = _kit.findings(_backward, _kit.twin(REL, FILE, *UNORDERED), [])
    assert any("race" in f and "reduce_scatter" in f for f in found), found
