"""unsloth 2026.10.9, rank 3 of its scan: ``_copy_file_chunks``
(studio/backend/core/inference/video_ltx2.py l.544), real.

``read_safetensors_to_device`` makes every output with ``torch.empty(...,
device=device)`` on the current stream (l.455), and ``_copy_file_chunks``
writes them on its own new stream (``flat[at:at + size].copy_(staging[slot],
non_blocking=True)``, l.544) with no wait for the current stream: a block the
allocator hands back may still be in use by work queued on the current stream
on its previous owner. (The end is ordered: ``stream.synchronize()``, l.553.)
The shape of rank 1 (``_ring_copy``), in the video loader.

Driven as the LTX-2.3 assembly drives it (``load_checkpoint_to_device(path,
device)``, video_ltx2.py l.1601), on a small safetensors file, after a tensor
the current stream still works on has been dropped: flagged. The fixed twin,
the new stream waiting for the current one before it copies, is clean.

Hand edits: none in the loader; the checkpoint is a two-tensor safetensors
file written by the harness.
"""

import json
import struct

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/video_ltx2.py"
FIX = ("    stream = torch.cuda.Stream(device = device)\n",
       "    stream = torch.cuda.Stream(device = device)\n"
       "    stream.wait_stream(torch.cuda.current_stream(device))\n")


def _checkpoint(path):
    """A safetensors file of two float32 tensors: header length, JSON header, data."""
    tensors = {"a.weight": torch.arange(48, dtype=torch.float32).reshape(6, 8),
               "b.bias": torch.ones(8)}
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        blob = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return tensors


def _load(loaded, path):
    module = loaded.module
    expected = _checkpoint(path)
    device = torch.ones(1, device="cuda").device
    previous = torch.zeros(64, device=device)
    previous.add_(1.0)
    previous.sum()  # the previous owner's kernels, still queued on the current stream
    del previous  # its block goes back to the current stream's pool
    state = module.load_checkpoint_to_device(path, device)
    assert state is not None and set(state) == set(expected)  # the direct path ran
    return sum(t.sum() for t in state.values())  # the model build reads them


def test_r3_direct_load_as_the_ltx_assembly_drives_it_flagged(tmp_path):
    found = _kit.findings(_load, _kit.release(REL, FILE), tmp_path / "ckpt.safetensors")
    assert any("race" in f and "_copy_file_chunks" in f for f in found), found


def test_r3_fixed_twin_clean(tmp_path):
    assert _kit.findings(_load, _kit.twin(REL, FILE, *FIX), tmp_path / "ckpt.safetensors") == []
