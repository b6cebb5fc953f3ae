"""unsloth 2026.10.9, rank 1 of its scan: ``_ring_copy``
(studio/backend/core/inference/diffusion_fast_load.py l.477), real.

``_ring_copy`` makes the device copies with ``torch.empty_like(src, device=...)``
on the current stream (l.442), then writes them on its own new stream
(``dst8[...].copy_(staging[slot], non_blocking=True)``, l.477) with no wait for
the current stream. A block the current stream's allocator hands back may
still be in use by work queued there on its previous owner; the side stream's
copy is unordered with that work. (The end is ordered: ``stream.synchronize()``
and the current stream's ``wait_stream(stream)``, l.485-497.)

Driven as the load path drives it (``diffusion_layer_split._move_rest``,
``diffusion_memory``'s plain placement): ``with fast_upload([module], device):
module.to(device)``, after a tensor the current stream still works on has
been dropped (a previous model's or a failed attempt's, whose kernels are
queued): flagged (the side stream writes the block the current stream's work
on its previous owner still touches). The fixed twin, the new stream waiting
for the current one before it copies, is clean.

Hand edits: the size thresholds and the chunk size of the ring are module
constants set small (``_UPLOAD_MIN_TENSOR_BYTES``, ``_UPLOAD_MIN_TOTAL_BYTES``,
``_UPLOAD_CHUNK_BYTES``), so a small module takes the ring with several chunks
per tensor and the ring's slots are reused.
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_fast_load.py"
FIX = ("    stream = torch.cuda.Stream(device = device)\n",
       "    stream = torch.cuda.Stream(device = device)\n"
       "    stream.wait_stream(torch.cuda.current_stream(device))\n")


def _load(loaded):
    module = loaded.module
    module._UPLOAD_MIN_TENSOR_BYTES = 64
    module._UPLOAD_MIN_TOTAL_BYTES = 256
    module._UPLOAD_CHUNK_BYTES = 512
    device = torch.ones(1, device="cuda").device
    model = torch.nn.Linear(64, 32)
    previous = torch.zeros(64 * 32 + 32, device=device)
    previous.add_(1.0)
    previous.sum()  # the previous owner's kernels, still queued on the current stream
    del previous  # its block goes back to the current stream's pool
    with torch.no_grad(), module.fast_upload([model], device) as staged:
        model.to(device)
    assert staged == 2, staged  # the ring path ran (else the stock .to did)
    return model(torch.ones(4, 64, device=device)).sum()  # the first forward


def test_r1_ring_copy_as_the_load_path_drives_it_flagged():
    found = _kit.findings(_load, _kit.release(REL, FILE))
    assert any("race" in f and "_ring_copy" in f for f in found), found


def test_r1_fixed_twin_clean():
    assert _kit.findings(_load, _kit.twin(REL, FILE, *FIX)) == []
