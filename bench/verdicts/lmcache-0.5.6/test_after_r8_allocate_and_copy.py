"""LMCache 0.5.6, rank 8 after the rules of issue 49 item 1:
``allocate_and_copy_objects`` (storage_manager.py l.114).

The scan reads the copy stream's copy of ``src_memory_obj.tensor`` into a new
memory object as unordered with the current stream's last write of both. As
``StorageManager.batched_put`` calls it, the sources are the host memory
objects ``from_gpu`` has just filled on the store stream and synchronized
(``store_stream.synchronize()`` for a target that is not on the device), the
targets are fresh objects of another backend's allocator, and the function
synchronizes its stream before it returns: clean. Where the current stream
itself filled the source without blocking (what the scan's reading assumes),
the copy is flagged.

Hand edits: the allocator backend is an object whose ``allocate`` gives a
memory object on a fresh pinned tensor (a host backend's) and whose
``contains`` says no; the memory objects are objects with the attributes the
function reads; ``torch_dev`` is ``torch.cuda``.
"""

import torch

from bench.verdicts import _kit

FILE = "lmcache/v1/storage_backend/storage_manager.py"
SHAPE = (2, 4, 16, 8)


def _memory_obj(tensor):
    return _kit.Obj(tensor=tensor, get_shape=lambda: tensor.shape,
                    get_dtype=lambda: tensor.dtype, meta=_kit.Obj(fmt=None))


def _put(filled_on_device=False):
    module = _kit.release("lmcache-0.5.6", FILE).module
    module.torch_dev = torch.cuda
    src = torch.empty(SHAPE).pin_memory()
    kv = torch.ones(SHAPE, device="cuda")
    if filled_on_device:  # what the scan's reading assumes: the current stream wrote it
        src.copy_(kv, non_blocking=True)
    else:  # from_gpu: the store stream fills it, then the host waits for that stream
        store = torch.cuda.Stream()
        store.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(store):
            src.copy_(kv, non_blocking=True)
        store.synchronize()
    backend = _kit.Obj(contains=lambda key: False,
                       allocate=lambda shape, dtype, **kw: _memory_obj(
                           torch.empty(shape, dtype=dtype).pin_memory()))
    keys, objs = module.allocate_and_copy_objects(backend, ["k0"], [_memory_obj(src)],
                                                  torch.cuda.Stream())
    assert keys == ["k0"]
    return objs[0].tensor.sum()  # the host backend reads the copy after the sync


def test_as_batched_put_calls_it_clean():
    assert _kit.findings(_put) == []


def test_flagged_where_the_current_stream_filled_the_source():
    assert any("race" in f for f in _kit.findings(_put, filled_on_device=True))
