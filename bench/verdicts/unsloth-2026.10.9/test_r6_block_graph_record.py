"""unsloth 2026.10.9, rank 6 of its scan: ``BlockGraph._record``
(studio/backend/core/inference/diffusion_block_graph.py l.631), safe; rank 7,
``SegmentGraph._capture`` (l.1066), is the same line in the segment recorder.

The scan reads ``before`` as a tensor made on the capture stream and used on
the current stream with no ``record_stream``. ``before`` is
``torch.cuda.memory_reserved()`` (l.609, l.1053): a Python int, read again
after the capture to count the pool's growth (``memory_reserved() - before``,
l.631, l.1066). No tensor is made there. The tensors the capture stream
touches are the shared static buffers, kept by ``_Shared`` across calls, and
the capture is bracketed by ``stream.wait_stream(current)`` and
``current.wait_stream(stream)`` (l.600-602, l.630; l.1044-1046, l.1065).

Driven as the block's forward drives it (``BlockGraph.__call__``: the first
call at a layout runs eagerly, the second records, the third replays), with
new inputs the current stream writes before each call: clean. With
``current.wait_stream(stream)`` after the capture removed: flagged (the
replay on the current stream races with the capture stream's writes of the
static outputs), so the harness can fail.

Hand edits: CUDA graphs are not simulated, so the module's ``torch`` hands out
a graph whose capture lets the block's kernels run once on the capture stream
and whose replay is one kernel on the current stream reading the static
inputs and the block's weights and writing the static outputs; the graph pool
handle is a token.
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_block_graph.py"
NO_JOIN = ("                del out, flat\n"
           "            current.wait_stream(stream)\n",
           "                del out, flat\n")


class _EagerGraph:
    """A CUDA graph as a run without graph simulation can take it (see the module docstring)."""

    def __init__(self, shared, weights):
        self._shared, self._weights = shared, weights

    def capture_begin(self, pool=None, capture_error_mode=None):
        pass

    def capture_end(self):
        pass

    def reset(self):
        pass

    def replay(self):
        reads = [t for ts in self._shared.static_in.values() for t in ts] + self._weights
        writes = [t for ts in self._shared.static_out.values() for t in ts]
        _kit.kernel(reads, writes, "graph replay")


class _Torch:
    """``torch`` with ``torch.cuda``'s graph and pool handle answered as above."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


class _Cuda:
    def __init__(self, shared, weights):
        self.CUDAGraph = lambda: _EagerGraph(shared, weights)
        self.graph_pool_handle = object

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


def _three_calls(loaded):
    module = loaded.module
    device = torch.ones(1, device="cuda").device
    block = torch.nn.Linear(8, 8).to(device)
    shared = module._Shared(device.index)
    module._torch = lambda: _Torch(_Cuda(shared, list(block.parameters())))
    graph = module.BlockGraph(block, block.forward, shared)
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for step in range(3):
            x = torch.full((4, 8), float(step), device=device)
            total += graph(x).sum()
    assert graph.stats["captures"] == 1 and graph.stats["replays"] == 2, graph.stats
    return total


def test_r6_r7_eager_record_replay_clean():
    assert _kit.findings(_three_calls, _kit.release(REL, FILE)) == []


def test_r6_without_the_join_after_the_capture_flagged():
    found = _kit.findings(_three_calls, _kit.twin(REL, FILE, *NO_JOIN))
    assert any("race" in f and "graph replay" in f for f in found), found
