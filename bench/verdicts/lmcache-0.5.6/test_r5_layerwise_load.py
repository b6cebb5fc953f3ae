"""LMCache 0.5.6, rank 5: ``VLLMPagedMemLayerwiseGPUConnector.batched_to_gpu`` (l.1294).

As the vLLM adapter drives it (``start_load_kv``: ``slot_mapping`` copied to the
device, ``retrieve_layer`` primed with two ``next``; ``wait_for_layer_load``
advancing it once per layer): the load stream's transfer kernel reads
``slot_mapping_full``, which ``torch.cat`` made on the current stream, with no
wait. The fixed twin adds ``self.load_stream.wait_stream(current_stream)``.

Hand edits (evidence, not the writer's output): the C kernel
``device_ops.single_layer_kv_transfer`` is described by its reads and writes
(``_kit.kernel``); the GPU buffer allocator is a one-buffer object.
"""

import pytest
import torch

import streamfuzz
from bench.verdicts import _kit

FILE = "lmcache/v1/gpu_connector/gpu_connectors.py"
FIX = ("        current_stream = torch.cuda.current_stream()\n\n        for layer_id in range(self.num_layers):\n            memory_objs_layer = yield\n            if sync:",
       "        current_stream = torch.cuda.current_stream()\n        self.load_stream.wait_stream(current_stream)\n\n        for layer_id in range(self.num_layers):\n            memory_objs_layer = yield\n            if sync:")
LAYERS, TOKENS, HIDDEN = 3, 16, 8
H2D = "H2D"


def _transfer(mem, kv, slots, direction, fmt, token_major=True):
    reads, writes = ([mem, slots], [kv]) if direction == H2D else ([kv, slots], [mem])
    _kit.kernel(reads, writes, "single_layer_kv_transfer")


def _connector(module):
    module.device_ops = _kit.Obj(single_layer_kv_transfer=_transfer)
    module.lmcache_native = _kit.Obj(TransferDirection=_kit.Obj(H2D=H2D, D2H="D2H"))
    cls = module.VLLMPagedMemLayerwiseGPUConnector
    conn = cls.__new__(cls)
    buf = torch.zeros(TOKENS, 2, HIDDEN, device="cuda")
    conn.__dict__.update(
        num_layers=LAYERS, use_mla=False, use_gpu=True, dtype=torch.float32,
        hidden_dim_size=HIDDEN, engine_kv_format=None, load_stream=torch.cuda.Stream(),
        kvcaches=[torch.zeros(2, 64, HIDDEN, device="cuda") for _ in range(LAYERS)],
        gpu_buffer_allocator=_kit.Obj(allocate=lambda shape, dtype, fmt: _kit.Obj(
            tensor=buf[: shape[0]], ref_count_down=lambda: None)),
    )
    conn.initialize_kvcaches_ptr = lambda **kw: None
    conn._lazy_initialize_buffer = lambda kv: None
    fmt = module.MemoryFormat.KV_T2D
    return conn, fmt


def _drive(module):
    conn, fmt = _connector(module)
    slot_mapping = torch.arange(TOKENS).to("cuda")  # the adapter: request.slot_mapping.to(device)
    starts, ends = [0, 8], [8, TOKENS]
    gen = conn.batched_to_gpu(starts, ends, slot_mapping=slot_mapping, sync=True)
    next(gen)  # retrieve_layer primes the consumer
    for _layer in range(LAYERS):
        mem = [_kit.Obj(tensor=torch.ones(e - s, 2, HIDDEN).pin_memory(),
                        metadata=_kit.Obj(fmt=fmt)) for s, e in zip(starts, ends)]
        gen.send(mem)
    for _ in gen:
        pass


def test_release_flags_the_unordered_read():
    target = _kit.release("lmcache-0.5.6", FILE)
    with pytest.raises(streamfuzz.StreamfuzzError, match="slot_mapping_full|cat"):
        with streamfuzz.checked():
            _drive(target.module)


def test_fixed_twin_is_clean():
    target = _kit.twin("lmcache-0.5.6", FILE, *FIX)
    with streamfuzz.checked():
        _drive(target.module)
