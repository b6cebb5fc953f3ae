"""LMCache 0.5.6, ranks 5, 6, 10: the paged layerwise load (CUDA l.1294, MUSA l.689, XPU l.1084).

Driven as the vLLM adapter drives it (``start_load_kv``: the host slot mapping
copied to the device, ``retrieve_layer`` primed; one ``send`` per layer from
``wait_for_layer_load``; ``sync=True``, the last request's): the load stream's
scatter into the KV cache reads ``slot_mapping_full``, which ``torch.cat`` made
on the current stream, with no wait. The fixed twin adds
``self.load_stream.wait_stream(current_stream)`` where the function takes the
current stream, and is clean.

Hand edits: the CUDA and XPU C kernel ``device_ops.single_layer_kv_transfer``
is described by its reads and writes (the MUSA one is plain ``index_copy_`` and
runs); the GPU buffer allocator is a one-buffer object; ``torch.xpu`` and
``torch.musa`` run as ``torch.cuda``.
"""

import pytest
import torch

from bench.verdicts import _kit

REL = "lmcache-0.5.6"
CASES = {  # file, class, device module, the line the fix follows
    "r5-cuda": ("lmcache/v1/gpu_connector/gpu_connectors.py", "VLLMPagedMemLayerwiseGPUConnector",
                "cuda", "        current_stream = torch.cuda.current_stream()\n\n"
                "        for layer_id in range(self.num_layers):\n"
                "            memory_objs_layer = yield\n            if sync:"),
    "r10-xpu": ("lmcache/v1/gpu_connector/xpu_connectors.py", "VLLMPagedMemLayerwiseXPUConnector",
                "xpu", "        current_stream = torch.xpu.current_stream()\n\n"
                "        for layer_id in range(self.num_layers):\n"
                "            memory_objs_layer = yield\n            if sync:"),
    "r6-musa": ("lmcache/v1/gpu_connector/musa_connectors.py",
                "VLLMPagedMemLayerwiseMUSAConnector",
                "musa", "        current_stream = torch.musa.current_stream()"
                "  # type: ignore[attr-defined]\n\n        try:\n"),
}
LAYERS, TOKENS, HIDDEN = 3, 16, 8


def _transfer(mem, kv, slots, direction, fmt, token_major=True):
    reads, writes = ([mem, slots], [kv]) if direction == "H2D" else ([kv, slots], [mem])
    _kit.kernel(reads, writes, "single_layer_kv_transfer")


def _module(case, fixed):
    file, _, dev, anchor = CASES[case]
    if fixed:
        fix = anchor.split("\n")[0] + "\n        self.load_stream.wait_stream(current_stream)\n"
        loaded = _kit.twin(REL, file, anchor, fix + anchor[len(anchor.split("\n")[0]) + 1:])
    else:
        loaded = _kit.release(REL, file)
    module = loaded.module
    if dev != "cuda":
        _kit.as_cuda(module, dev)
    module.device_ops = _kit.Obj(single_layer_kv_transfer=_transfer)
    module.lmcache_native = _kit.Obj(TransferDirection=_kit.Obj(H2D="H2D", D2H="D2H"))
    return module


def _drive(case, fixed):
    module = _module(case, fixed)
    cls = getattr(module, CASES[case][1])
    conn = cls.__new__(cls)
    buf = torch.zeros(TOKENS, 2, HIDDEN, device="cuda")
    conn.__dict__.update(
        num_layers=LAYERS, use_mla=False, use_gpu=True, use_musa=False, dtype=torch.float32,
        hidden_dim_size=HIDDEN, engine_kv_format=None, device=buf.device,
        load_stream=torch.cuda.Stream(),
        kvcaches=[torch.zeros(2, 4, 16, 1, HIDDEN, device="cuda") for _ in range(LAYERS)],
        gpu_buffer_allocator=_kit.Obj(allocate=lambda shape, dtype, fmt: _kit.Obj(
            tensor=buf[: shape[0]], ref_count_down=lambda: None)),
    )
    conn._load_stream = conn.__dict__["load_stream"]  # the MUSA class reads it through a property
    conn.initialize_kvcaches_ptr = lambda **kw: None
    conn._lazy_initialize_buffer = lambda kv: None
    fmt = module.MemoryFormat.KV_T2D
    slot_mapping = torch.arange(TOKENS).to("cuda")  # the adapter: request.slot_mapping.to(device)
    starts, ends = [0, 8], [8, TOKENS]
    # what the storage side loaded, finished before the retrieval (a blocking copy)
    layers = [[_kit.Obj(tensor=torch.ones(e - s, 2, HIDDEN).to("cuda"), metadata=_kit.Obj(fmt=fmt))
               for s, e in zip(starts, ends)] for _ in range(LAYERS)]
    gen = conn.batched_to_gpu(starts=starts, ends=ends, slot_mapping=slot_mapping, sync=True)
    _kit.feed(gen, layers)  # retrieve_layer primes the consumer



@pytest.mark.parametrize("case", CASES)
def test_release_reads_the_slot_mapping_unordered(case):
    found = _kit.findings(_drive, case, fixed=False)
    assert any("read-after-write" in f and "aten.cat" in f for f in found), found


@pytest.mark.parametrize("case", CASES)
def test_fixed_twin_clean(case):
    assert _kit.findings(_drive, case, fixed=True) == []
