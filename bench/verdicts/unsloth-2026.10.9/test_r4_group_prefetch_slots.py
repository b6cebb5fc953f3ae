"""unsloth 2026.10.9, rank 4 of its scan: ``GroupPrefetcher._issue``
(studio/backend/core/inference/diffusion_offload_prefetch.py l.455), real on one path.

With the slot ring on, ``_issue`` copies a group into its slot on the copy
stream (``_copy_into(buffers[i], src)``, l.455). A slot made in ``_issue``
itself is made on the copy stream (``_views_for`` under
``torch.cuda.stream(stream)``), but ``materialize_slots`` (l.728), which the
step graph's ``before_capture`` calls right before a capture's warm-up, makes
the missing slots with ``torch.empty`` on the current stream, and the copy
stream's first fills of the warm-up are unordered with that stream unless
``fence_first`` is set (``kick``, l.818: the copy stream waits for an event of
the compute stream). ``install_group_prefetch`` sets ``fence_first = top is
None``: with a torchao top-level group adopted onto the copy stream there is
no fence, and the copy stream writes a block the current stream may still use
for its previous owner (the last step's tail after the last block's offload).

Driven as the engine drives it: one eager forward records the order
(``begin``, each group's ``onload`` / block / ``offload``, ``end``); the step
graph's install turns the ring on (``enable_slots``); the step's tail runs on
the current stream and drops its temporary; ``before_capture`` makes the
ring (``materialize_slots``); the warm-up forward runs on a side stream that
waited for the current one, as ``GraphedForward._capture`` does. With a top
group (no fence): flagged, the copy stream writing a slot the current stream
made; the fixed twin (the copy stream waits for the current stream after
``materialize_slots`` makes the ring) is clean. Without a top group
(``fence_first``): clean as released, and flagged with ``kick``'s fence
removed, so that path is safe by that fence.

Hand edits: diffusers' offload groups are small objects with what the
prefetcher reads (``modules``, ``cpu_param_dict`` of pinned host copies,
``stream``, the prefetcher's ``onload_`` marker, ``offload_leader`` for the top
group) and diffusers' ``offload_`` as it is with ``record_stream`` on (the
parameters point back at their host copies); ``_go()`` (diffusers' group
offloading module) answers that no tensor is torchao's.
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_offload_prefetch.py"
FIX = ("                self._alloc_slot(where)\n",
       "                self._alloc_slot(where)\n"
       "                self.stream.wait_stream(self._compute())\n")
NO_FENCE = ("                self.stream.wait_event(after_top)\n", "")


class _Group:
    """A diffusers offload group as the prefetcher reads it."""

    def __init__(self, block, stream, leader=None):
        self.block = block
        self.modules, self.parameters, self.buffers = [block], None, None
        self.stream, self.record_stream = stream, True
        self.cpu_param_dict = {p: p.data.pin_memory() for p in block.parameters()}
        for p in block.parameters():
            p.data = self.cpu_param_dict[p]
        self.onload_ = self._unsloth_prefetch_onload = object()
        if leader is not None:
            self.offload_leader = leader

    def offload_(self):
        for p, host in self.cpu_param_dict.items():
            p.data = host


def _forward(pf, top, groups, x):
    pf.begin()
    if top is not None:
        pf.onload(top)
        x = top.block(x)
    for g in groups:
        pf.onload(g)
        x = g.block(x)
        pf.offload(g)
    if top is not None:
        pf.offload(top)
    pf.end()
    return x


def _capture_warmup(loaded, with_top):
    module = loaded.module
    module._go = lambda: _kit.Obj(_is_torchao_tensor=lambda t: False,
                                  _swap_torchao_tensor=None)
    device = torch.ones(1, device="cuda").device
    copy = torch.cuda.Stream()
    denoiser = torch.nn.Module()
    top = _Group(torch.nn.Linear(8, 8), copy, leader=denoiser) if with_top else None
    groups = [_Group(torch.nn.Linear(8, 8), copy) for _ in range(3)]
    pf = module.GroupPrefetcher(denoiser, ([top] if top else []) + groups, device, depth=1)
    pf.fence_first = top is None  # as install_group_prefetch sets it
    with torch.no_grad():
        x = torch.ones(4, 8, device=device)
        x = _forward(pf, top, groups, x)  # the eager step records the order
        assert pf.enable_slots() >= 0 and pf.slot_of  # the step graph's install
        tail = x * 2.0  # the step's tail after the last block
        x = tail.sum(0)
        del tail  # its block goes back to the current stream's pool
        pf.materialize_slots()  # before_capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up, its output dropped
            _forward(pf, top, groups, torch.ones(4, 8, device=device))
        torch.cuda.current_stream().wait_stream(side)
    assert pf.stats.get("slot_fills", 0) > 0  # the warm-up filled the ring
    return x.sum()


def test_r4_top_group_warmup_after_materialize_flagged():
    found = _kit.findings(_capture_warmup, _kit.release(REL, FILE), with_top=True)
    assert any("race" in f and "_issue" in f and "materialize_slots" in f for f in found), found


def test_r4_top_group_fixed_twin_clean():
    assert _kit.findings(_capture_warmup, _kit.twin(REL, FILE, *FIX), with_top=True) == []


def test_r4_no_top_group_clean_by_the_first_fence():
    assert _kit.findings(_capture_warmup, _kit.release(REL, FILE), with_top=False) == []


def test_r4_no_top_group_without_the_fence_flagged():
    found = _kit.findings(_capture_warmup, _kit.twin(REL, FILE, *NO_FENCE), with_top=False)
    assert any("race" in f and "_issue" in f for f in found), found
