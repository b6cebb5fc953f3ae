"""unsloth 2026.10.9, ranks 6 and 7 of its scan: ``BlockGraph._record``
(studio/backend/core/inference/diffusion_block_graph.py l.631) and
``SegmentGraph._capture`` (l.1066), the same line in the segment recorder; safe.

The scan reads ``before`` as a tensor made on the capture stream and used on
the current stream with no ``record_stream``. ``before`` is
``torch.cuda.memory_reserved()`` (l.609, l.1053): a Python int, read again
after the capture to count the pool's growth (``memory_reserved() - before``,
l.631, l.1066). No tensor is made there. The tensors the capture stream
touches are the shared static buffers, kept by ``_Shared`` across calls, and
the capture is bracketed by ``stream.wait_stream(current)`` and
``current.wait_stream(stream)`` (l.600-602, l.630; l.1044-1046, l.1065).

Driven as the denoiser's forward drives them, with new inputs the current
stream writes before each call: rank 6 through ``BlockGraph.__call__`` (the
first call at a layout runs eagerly, the second records, the third replays);
rank 7 through two blocks of one segment (``BlockGraph.__call__`` hands each
call to ``SegmentGraph.call``: the first forward records the run eagerly, the
second warms it up, captures it and replays it, the third replays): clean. With
``current.wait_stream(stream)`` after the capture removed: flagged (the
replay or the hand-out on the current stream races with the capture
stream's writes), so each harness can fail.

Hand edits: CUDA graphs are not simulated, so the module's ``torch`` hands out
a graph whose capture lets the block's kernels run once on the capture stream
and whose replay is one kernel on the current stream reading the static
inputs and the blocks' weights and writing the recorded outputs; the graph pool
handle is a token. For rank 7 the layer split's lazy routing
(``_lazy_chain``) answers yes, as it does for a split whose class passes each
block's outputs straight to the next.
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_block_graph.py"
NO_JOIN = ("                del out, flat\n"
           "            current.wait_stream(stream)\n",
           "                del out, flat\n")
NO_SEGMENT_JOIN = ("                        raise\n"
                   "            current.wait_stream(stream)\n",
                   "                        raise\n")


class _EagerGraph:
    """A CUDA graph as a run without graph simulation can take it (see the module docstring)."""

    def __init__(self, io):
        self._io = io

    def capture_begin(self, pool=None, capture_error_mode=None):
        pass

    def capture_end(self):
        pass

    def reset(self):
        pass

    def replay(self):
        reads, writes = self._io()
        _kit.kernel(reads, writes, "graph replay")


class _Torch:
    """``torch`` with ``torch.cuda``'s graph and pool handle answered as above."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


class _Cuda:
    def __init__(self, io):
        self.CUDAGraph = lambda: _EagerGraph(io)
        self.graph_pool_handle = object

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


def _three_calls(loaded):
    module = loaded.module
    device = torch.ones(1, device="cuda").device
    block = torch.nn.Linear(8, 8).to(device)
    shared = module._Shared(device.index)

    def io():
        return ([t for ts in shared.static_in.values() for t in ts] + list(block.parameters()),
                [t for ts in shared.static_out.values() for t in ts])

    module._torch = lambda: _Torch(_Cuda(io))
    graph = module.BlockGraph(block, block.forward, shared)
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for step in range(3):
            x = torch.full((4, 8), float(step), device=device)
            total += graph(x).sum()
    assert graph.stats["captures"] == 1 and graph.stats["replays"] == 2, graph.stats
    return total


def _segment_forwards(loaded):
    module = loaded.module
    module._lazy_chain = lambda root: True
    device = torch.ones(1, device="cuda").device
    blocks = [torch.nn.Linear(8, 8).to(device) for _ in range(2)]
    shared = module._Shared(device.index)
    graphs = [module.BlockGraph(b, b.forward, shared) for b in blocks]
    segment = module.SegmentGraph(graphs, shared)

    def io():
        entries = list(segment.cache.values())
        return ([t for e in entries for t in e.static_in]
                + [p for b in blocks for p in b.parameters()],
                [t for e in entries for ts in e.outputs for t in ts])

    module._torch = lambda: _Torch(_Cuda(io))
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for step in range(3):
            x = torch.full((4, 8), float(step), device=device)
            for g in graphs:
                x = g(x)
            total += x.sum()
    stats = segment.stats
    assert stats["segment_captures"] == 1 and stats["segment_replays"] == 2, stats
    return total


def test_r6_eager_record_replay_clean():
    assert _kit.findings(_three_calls, _kit.release(REL, FILE)) == []


def test_r6_without_the_join_after_the_capture_flagged():
    found = _kit.findings(_three_calls, _kit.twin(REL, FILE, *NO_JOIN))
    assert any("race" in f and "graph replay" in f for f in found), found


def test_r7_segment_record_capture_replay_clean():
    assert _kit.findings(_segment_forwards, _kit.release(REL, FILE)) == []


def test_r7_without_the_join_after_the_capture_flagged():
    found = _kit.findings(_segment_forwards, _kit.twin(REL, FILE, *NO_SEGMENT_JOIN))
    assert any("race" in f and "graph replay" in f for f in found), found
