"""megatron-core 0.16.1, rank 1 of its scan after the rules of issue 49's second
reading: ``StaticBufferLoader.__call__`` (full_cuda_graph.py l.74).

The loader's stream copies each microbatch's inputs into the static buffers a
full-iteration CUDA graph reads, with no wait for the current stream: neither
for the inputs (made on the current stream by the batch's move to the device)
nor for the last replay, which reads the same buffers on the current stream.
Driven as ``FullCudaGraphWrapper`` drives it (the first call of a microbatch
makes its buffers, later calls refill them): flagged. The fixed twin, the
loader's stream waiting for the current one first, is clean.

Hand edits: the inputs are a dict of two device tensors the current stream
writes, as a batch moved to the device is; the replay is one kernel reading
the buffers on the current stream.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/full_cuda_graph.py"
FIX = ("        assert isinstance(inputs, dict)\n",
       "        assert isinstance(inputs, dict)\n"
       "        self.stream.wait_stream(torch.cuda.current_stream())\n")


def _two_steps(loaded):
    module = loaded.module
    module.StaticBufferLoader.static_buffers = {"training": [], "validation": []}
    loader = module.StaticBufferLoader()
    total = torch.zeros(1, device="cuda")
    for step in range(2):
        inputs = {"tokens": torch.full((16,), float(step), device="cuda"),
                  "labels": torch.full((16,), float(step + 1), device="cuda")}
        buffers = loader(inputs, "training", 0)
        total += buffers["tokens"].sum() + buffers["labels"].sum()  # the replay's reads
    return total


def test_r1_static_buffers_refilled_as_the_graph_wrapper_drives_it_flagged():
    found = _kit.findings(_two_steps, _kit.release(REL, FILE))
    assert any("race" in f for f in found), found


def test_r1_fixed_twin_clean():
    assert _kit.findings(_two_steps, _kit.twin(REL, FILE, *FIX)) == []
