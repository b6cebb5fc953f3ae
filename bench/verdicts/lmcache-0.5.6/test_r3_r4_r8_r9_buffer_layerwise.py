"""LMCache 0.5.6, ranks 3, 4, 8, 9: ``VLLMBuffer­Layerwise{GPU,XPU}Connector.batched_to_gpu``.

Driven as ``LMCacheEngine.retrieve_layer`` drives it for the blender (prime,
one ``send`` per layer, one last ``next``), two retrievals in a row.

* Ranks 3 and 8 (unordered): at layer 0 the load stream writes
  ``old_positions_full``, which ``torch.zeros`` made on the current stream, and
  the load buffer, which the previous retrieval's last transfer on the current
  stream read before handing it back to the allocator, with no wait. The
  harness flags the write-after-write on ``old_positions_full``; the fixed twin
  (``self.load_stream.wait_stream(torch.cuda.current_stream())`` after the
  zeros) is clean.
* Ranks 4 and 9 (lifetime of ``old_positions_full``): the same runs show no
  lifetime finding: the device-wide ``synchronize()`` at layer 1 follows the
  only load-stream use.

Hand edits: the C kernel ``single_layer_kv_transfer`` is described by its reads
and writes; the RoPE kernel is an elementwise op reading the positions;
``_lazy_initialize_buffer`` is replaced by a real ``GPUMemoryAllocator`` of the
release (its ``torch_dev`` answered by ``torch.cuda``); rank 8/9's
``torch.xpu`` runs as ``torch.cuda``.
"""

import pytest
import torch

from bench.verdicts import _kit

REL = "lmcache-0.5.6"
CASES = {
    "r3-r4-cuda": ("lmcache/v1/gpu_connector/gpu_connectors.py", "VLLMBufferLayerwiseGPUConnector",
                   "torch.cuda"),
    "r8-r9-xpu": ("lmcache/v1/gpu_connector/xpu_connectors.py", "VLLMBufferLayerwiseXPUConnector",
                  "torch.xpu"),
}
ZEROS = ("                (num_all_tokens,), dtype=torch.int64, device=self.kvcaches[0].device\n"
         "            )\n")
LAYERS, TOKENS, HIDDEN = 3, 16, 8


def _transfer(mem, kv, slots, direction, fmt, token_major=False):
    reads, writes = ([mem, slots], [kv]) if direction == "H2D" else ([kv, slots], [mem])
    _kit.kernel(reads, writes, "single_layer_kv_transfer")


def _module(case, fixed):
    file, _, dev = CASES[case]
    if fixed:
        wait = f"            self.load_stream.wait_stream({dev}.current_stream())\n"
        loaded = _kit.twin(REL, file, ZEROS, ZEROS + wait)
    else:
        loaded = _kit.release(REL, file)
    module = loaded.module
    if dev == "torch.xpu":
        _kit.as_cuda(module, "xpu")
    module.device_ops = _kit.Obj(single_layer_kv_transfer=_transfer)
    module.lmcache_native = _kit.Obj(TransferDirection=_kit.Obj(H2D="H2D", D2H="D2H"))
    return module


def _connector(case, module):
    alloc_mod = _kit.release(REL, "lmcache/v1/memory_allocators/gpu_memory_allocator.py").module
    alloc_mod.torch_dev = _kit.Obj(is_available=lambda: True)
    cls = getattr(module, CASES[case][1])
    conn = cls.__new__(cls)
    conn.__dict__.update(
        num_layers=LAYERS, hidden_dim_size=HIDDEN, cache_positions=True, use_gpu=True,
        dtype=torch.float32, engine_kv_format=None, buffer_mapping={},
        current_gap_positions=None, load_stream=torch.cuda.Stream(),
        store_stream=torch.cuda.Stream(), use_mla=False,
        kvcaches=[torch.zeros(2, 64, HIDDEN, device="cuda") for _ in range(LAYERS)],
        gpu_buffer_allocator=alloc_mod.GPUMemoryAllocator(8 * 2 * TOKENS * HIDDEN * 4,
                                                          device="cuda"),
        fused_rotary_emb=lambda old, new, k: k + (new - old).unsqueeze(-1).to(k.dtype),
    )
    conn.initialize_kvcaches_ptr = lambda **kw: None
    conn._lazy_initialize_buffer = lambda kv: None
    return conn


def _retrievals(case, fixed, count=2):
    module = _module(case, fixed)
    conn = _connector(case, module)
    fmt = module.MemoryFormat.KV_2TD
    slot_mapping = torch.arange(TOKENS).to("cuda")  # the adapter's blocking copy
    starts, ends = [0, 8], [8, TOKENS]
    layers = [[_kit.Obj(tensor=torch.ones(2, e - s, HIDDEN).pin_memory(),
                        metadata=_kit.Obj(fmt=fmt, cached_positions=torch.arange(s, e).to("cuda")))
               for s, e in zip(starts, ends)] for _ in range(LAYERS)]
    for _ in range(count):
        gen = conn.batched_to_gpu(starts, ends, slot_mapping=slot_mapping)
        _kit.feed(gen, layers)



@pytest.mark.parametrize("case", CASES)
def test_release_load_stream_writes_unordered(case):
    found = _kit.findings(_retrievals, case, fixed=False)
    assert any("write-after-write" in f and "aten.zeros" in f for f in found), found
    assert not any("lifetime" in f or "freed" in f for f in found), found


@pytest.mark.parametrize("case", CASES)
def test_fixed_twin_clean(case):
    assert _kit.findings(_retrievals, case, fixed=True) == []
