"""LMCache 0.5.6, ranks 2 and 7: ``VLLMPagedMem{GPU,XPU}ConnectorV2.from_gpu``; and,
after the rules of issue 49 item 1, rank 9: the same connector's ``batched_to_gpu``.

The store stream reads the KV caches (the model's writes, on the current
stream) with no wait in the function. As the vLLM adapter calls it
(``wait_for_save``: ``slot_mapping.to(self.device)`` of the request's host slot
mapping, then ``lmcache_engine.store`` -> ``batched_from_gpu``), that blocking
copy synchronizes the current stream first, so the model's writes are done:
clean. Called with a slot mapping already on the device (no blocking copy
before), the same function is flagged: it orders nothing itself.

Hand edits: the C kernel ``device_ops.multi_layer_kv_transfer`` is described
by its reads (every layer's cache, the pointers, the slots) and writes (the
memory object); ``_initialize_pointers`` returns a pointer tensor (the real one
reads the cache layout through C helpers); rank 7's ``torch.xpu`` runs as
``torch.cuda`` (``_kit.as_cuda``).
"""

import pytest
import torch

import streamfuzz
from bench.verdicts import _kit

CASES = {
    "r2-cuda": ("lmcache/v1/gpu_connector/gpu_connectors.py", "VLLMPagedMemGPUConnectorV2", False),
    "r7-xpu": ("lmcache/v1/gpu_connector/xpu_connectors.py", "VLLMPagedMemXPUConnectorV2", True),
}
LAYERS, TOKENS, HIDDEN = 2, 16, 8


def _connector(case):
    file, name, xpu = CASES[case]
    module = _kit.release("lmcache-0.5.6", file).module
    if xpu:
        _kit.as_cuda(module, "xpu")
    conn_box = []

    def transfer(mem, pointers, slots, *args, **kwargs):
        direction = args[2] if len(args) > 2 else kwargs.get("direction")
        caches = list(conn_box[0].kvcaches)
        if direction == "D2H":
            _kit.kernel([*caches, pointers, slots], [mem], "multi_layer_kv_transfer")
        else:
            _kit.kernel([mem, pointers, slots], caches, "multi_layer_kv_transfer")

    module.device_ops = _kit.Obj(multi_layer_kv_transfer=transfer)
    module.lmcache_native = _kit.Obj(TransferDirection=_kit.Obj(H2D="H2D", D2H="D2H"))
    cls = getattr(module, name)
    conn = cls.__new__(cls)
    # the real one copies host pointers to the device once, a blocking copy
    pointers = torch.empty(LAYERS, dtype=torch.int64, device="cuda")
    pointers.copy_(torch.zeros(LAYERS, dtype=torch.int64))
    conn.__dict__.update(gpu_buffer=None, store_stream=torch.cuda.Stream(), use_mla=False,
                         kvcaches=None, page_buffer_size=64, engine_kv_format=None,
                         block_size=16, head_size=HIDDEN, block_stride_elems=0,
                         load_stream=torch.cuda.Stream(), device=pointers.device)
    conn.initialize_kvcaches_ptr = lambda **kw: setattr(conn, "kvcaches", kw["kvcaches"])
    conn._initialize_pointers = lambda kvcaches: pointers
    conn_box.append(conn)
    return conn, module


def _step(case, device_slot_mapping, load=False):
    conn, module = _connector(case)
    kvcaches = [torch.zeros(2, 64, HIDDEN, device="cuda") for _ in range(LAYERS)]
    for kv in kvcaches:  # the model's forward writes the KV caches on the current stream
        kv.add_(1.0)
    if device_slot_mapping:
        slot_mapping = torch.arange(TOKENS, device="cuda")
    else:  # the adapter: slot_mapping = request.slot_mapping.to(self.device)
        slot_mapping = torch.arange(TOKENS).to("cuda")
    mem = _kit.Obj(tensor=torch.empty(2, LAYERS, TOKENS, HIDDEN).pin_memory(),
                   metadata=_kit.Obj(fmt=module.MemoryFormat.KV_2LTD))
    if load:  # the adapter's start_load_kv: lmcache_engine.retrieve -> batched_to_gpu
        conn.batched_to_gpu([mem], [0], [TOKENS], kvcaches=kvcaches, slot_mapping=slot_mapping)
    else:
        conn.batched_from_gpu([mem], [0], [TOKENS], kvcaches=kvcaches,
                              slot_mapping=slot_mapping)


@pytest.mark.parametrize("case", CASES)
def test_as_the_vllm_adapter_calls_it_clean(case):
    with streamfuzz.checked():
        _step(case, device_slot_mapping=False)


@pytest.mark.parametrize("case", CASES)
def test_without_the_callers_blocking_copy_flagged(case):
    read = r"reads it \(multi_layer_kv_transfer\) unordered with main's write \(aten.add_"
    with pytest.raises(streamfuzz.StreamfuzzError, match=read):
        with streamfuzz.checked():
            _step(case, device_slot_mapping=True)


# After the rules of issue 49 item 1, rank 9: the load side of the same connector,
# ``VLLMPagedMemGPUConnectorV2.batched_to_gpu`` (l.419): the load stream writes the KV
# caches with no wait in the function; the adapter's ``start_load_kv`` makes the same
# blocking copy of the slot mapping just before ``retrieve``.
@pytest.mark.parametrize("case", CASES)
def test_load_as_the_vllm_adapter_calls_it_clean(case):
    with streamfuzz.checked():
        _step(case, device_slot_mapping=False, load=True)


@pytest.mark.parametrize("case", CASES)
def test_load_without_the_callers_blocking_copy_flagged(case):
    with pytest.raises(streamfuzz.StreamfuzzError, match=r"multi_layer_kv_transfer"):
        with streamfuzz.checked():
            _step(case, device_slot_mapping=True, load=True)
