"""megatron-core 0.16.1, ranks 6 and 7 of its scan after the rules of issue 49's
second reading: ``OffloadTensorGroup.record_offload_event`` and
``record_reload_event`` (pipeline_parallel/fine_grained_activation_offload.py
l.362, l.370), and a race found while driving them.

The two helpers record an event on the stream they are given; the work the
event ends is launched by their callers, and each caller's caller orders that
stream after the current one first: ``on_group_commit_forward`` (l.973) makes
the d2h stream wait before ``bulk_offload`` -> ``bulk_offload_group`` copies the
group's activations to the host; ``on_group_start_backward`` (l.1046) makes the
h2d stream wait before ``bulk_reload`` -> ``bulk_reload_group`` (or
``pre_reload_last_layer`` of the next chunk) copies them back.

* Rank 6: driven as a layer's group commit drives it, the offload's reads of
  the activations are ordered (no finding has the d2h stream read unordered);
  with the wait at l.973 removed, the d2h stream reads the activation unordered
  with the current stream's write: flagged. Safe.
* Rank 7: driven as the first stage of a two-deep pipeline drives it (two
  microbatches, every forward then every backward, two iterations, so that
  bulk reloads do work), no finding has the h2d stream's copies unordered
  with the current stream. Removing the wait at l.1046 changes nothing on the
  CPU stand-in: what it orders is the next reload's allocation on the h2d
  stream after the current stream's reads of the last reloaded tensors (a block
  reused by the caching allocator), which only a real GPU shows. Undecided.
* Found on the way, at neither site: ``tensor_pop`` (l.849) reloads a group
  that no bulk reload has reloaded synchronously, on the current stream
  (``reload``, l.760), without waiting for the group's offload event, so the
  host-to-device copy reads the pinned host buffer unordered with the d2h
  stream's copy into it. In the warmup iteration every group of the first
  backward chunk is reloaded so (``bulk_reload`` reloads
  ``_groups_to_reload[-1]``, the group whose backward just ran and which
  ``tensor_pop`` already reloaded). Flagged as
  ``forward_backward_no_pipelining`` drives it; the fixed twin, the current
  stream waiting for the group's offload event before that reload, is clean.

Hand edits: the release's autograd functions and saved-tensor hooks are called
in the order autograd calls them (per layer group: ``GroupStartFunction.forward``,
the pack hook for the group's activation, ``GroupCommitFunction.forward``; in
the backward, per group in reverse: ``GroupCommitFunction.backward``, the
unpack hook, the op that reads the activation, ``GroupStartFunction.backward``),
because the hooks make device tensors inside the backward, which the CPU
stand-in cannot see from autograd's engine. ``PipelineOffloadManager.__enter__``
is reduced to the flag the pack hook asserts (the rest installs the hooks and
tells Transformer Engine). A layer group is one matmul and a tanh.
"""

import torch

from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/pipeline_parallel/fine_grained_activation_offload.py"
DEV = torch.device("cuda", 0)
GROUPS = ("attn", "mlp")


def _forward(mgr, weight):
    h = torch.randn(4, 8, device=DEV)
    saved = []
    for name in GROUPS:
        chunk = mgr.pop_forward_chunk(name=name)  # fine_grained_offloading_group_start
        chunk.on_group_start_forward(name)
        mgr.inside_context = True
        h = torch.tanh(h @ weight)
        saved.append((chunk, name, mgr.on_save_for_backward(h)))
        mgr.inside_context = False
        chunk.on_group_commit_forward([])
    return saved


def _backward(mgr, saved):
    grad = torch.ones(4, 8, device=DEV)
    for chunk, name, tag in reversed(saved):
        chunk.on_group_commit_backward(name)
        activation = mgr.on_get_saved_tensor(tag)
        grad = grad * (1 - activation * activation)  # tanh's backward
        del activation
        chunk.on_group_start_backward()
    return grad.sum()


def _iterations(loaded, microbatches=1, count=1, pipelined=False):
    """``count`` training iterations of ``microbatches``: each forward then its backward
    (``forward_backward_no_pipelining``), or every forward then every backward (the
    first stage of a pipeline as deep as ``microbatches``)."""
    module = loaded.module
    interface = module.FineGrainedActivationOffloadingInterface
    module.PipelineOffloadManager.reset_instance()
    mgr = module.PipelineOffloadManager.get_instance()
    weight = torch.randn(8, 8, device=DEV)
    losses = []
    for _ in range(count):
        pending = []
        for _ in range(microbatches):
            interface.init_chunk_handler(vp_size=1, vp_stage=None, min_offloaded_tensor_size=16)
            pending.append(_forward(mgr, weight))
            if not pipelined:
                losses.append(_backward(mgr, pending.pop()))
        losses.extend(_backward(mgr, saved) for saved in pending)
        interface.reset()
    return losses


NO_D2H_WAIT = ("        self.d2h_stream.wait_stream(torch.cuda.current_stream())\n"
               "        self.bulk_offload(", "        self.bulk_offload(")
SYNC_RELOAD = ("        if isinstance(tensor, tuple):\n            tensor = self.reload(tensor)\n")
SYNC_RELOAD_FIX = (SYNC_RELOAD,
                   "        if isinstance(tensor, tuple):\n"
                   "            self.offload_groups[group_id - 1].wait_offload_event(\n"
                   "                torch.cuda.current_stream())\n"
                   "            tensor = self.reload(tensor)\n")


def _unordered_on(stream, found):
    return [f for f in found if f"{stream} reads it" in f or f"{stream} writes it" in f]


def test_r6_offload_as_the_group_commit_drives_it_ordered():
    found = _kit.findings(_iterations, _kit.release(REL, FILE))
    assert _unordered_on("_d2h_stream", found) == [], found


def test_r6_without_the_commits_wait_flagged():
    found = _kit.findings(_iterations, _kit.twin(REL, FILE, *NO_D2H_WAIT))
    assert any("_d2h_stream reads it (aten.copy_) unordered with main's write (aten.tanh" in f
               for f in _unordered_on("_d2h_stream", found)), found


def test_r7_reloads_as_a_pipeline_drives_them_ordered():
    loaded = _kit.release(REL, FILE)
    handler = loaded.module.ChunkOffloadHandler
    on_h2d = []
    reload = handler.reload

    def spied(self, state, non_blocking=None):
        on_h2d.append(torch.cuda.current_stream() == self.h2d_stream)
        return reload(self, state, non_blocking)

    handler.reload = spied
    found = _kit.findings(_iterations, loaded, microbatches=2, count=2, pipelined=True)
    assert any(on_h2d), "no bulk reload did work"
    assert _unordered_on("_h2d_stream", found) == [], found


def test_after_r7_sync_reload_as_no_pipelining_drives_it_flagged():
    found = _kit.findings(_iterations, _kit.release(REL, FILE))
    assert any("main reads it (aten.copy_) unordered with _d2h_stream's write (aten.copy_)" in f
               and "tensor_pop" in f for f in found), found


def test_after_r7_sync_reload_fixed_twin_clean():
    assert _kit.findings(_iterations, _kit.twin(REL, FILE, *SYNC_RELOAD_FIX)) == []
