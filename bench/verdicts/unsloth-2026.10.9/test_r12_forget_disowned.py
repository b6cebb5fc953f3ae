"""unsloth 2026.10.9, rank 12 of its scan: ``GroupPrefetcher._forget_disowned``
(studio/backend/core/inference/diffusion_offload_prefetch.py l.576), safe.

The scan reads ``compute`` as a stream other than the current one, with a
wait "on some paths only". ``compute`` is ``self._compute()``, which returns
``torch.cuda.current_stream(self.device)`` (l.389-391): the clone of a
disowned group's slot (``_detach_from_slot`` under
``torch.cuda.stream(compute)``, l.572-573) runs on the current stream, and the
copy stream waits for the event recorded after it (``done``, l.575-577)
before any later fill of that slot. The conditional ``compute.wait_event``
(l.567) is for a copy still queued; a group waited for at its ``onload`` has
``ready[gid] = None``.

Driven as the prefetcher's owner drives it (a top-level group adopted, so no
``fence_first``; depth 2, three slots for four block groups): the ring on, one
forward records the order; in the second the last group is made resident
while it sits in its slot (its ``onload_`` replaced, as
``_keep_groups_resident`` does; its later onloads only ``kick``), so ``end``
forgets it and clones it out of the slot; the third forward's first fill, ahead
of any release, refills that slot with the group that shares it: clean. With
the copy stream's wait on ``done`` removed: flagged (the refill races with the
clone's read of the slot), so the harness can fail. (With ``fence_first``, or
a refill after a release, a later compute event orders it as well.)

Hand edits: diffusers' offload groups are small objects with what the
prefetcher reads, and diffusers' ``offload_`` as it is with ``record_stream``
on; ``_go()`` answers that no tensor is torchao's; the residency change is the
replacement of the group's ``onload_``, done by the harness between the
block's compute and its offload.
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_offload_prefetch.py"
NO_DONE_WAIT = ("                group.stream.wait_event(done)\n"
                "                self.slot_owner.pop(self.slot_of[gid], None)\n",
                "                self.slot_owner.pop(self.slot_of[gid], None)\n")


class _Group:
    """A diffusers offload group as the prefetcher reads it."""

    def __init__(self, block, stream, leader=None):
        self.block = block
        self.modules, self.parameters, self.buffers = [block], None, None
        self.stream, self.record_stream = stream, True
        self.cpu_param_dict = {p: p.data.pin_memory() for p in block.parameters()}
        self.offload_()
        self.onload_ = self._unsloth_prefetch_onload = object()
        if leader is not None:
            self.offload_leader = leader

    def offload_(self):
        for p, host in self.cpu_param_dict.items():
            p.data = host


def _forward(pf, top, groups, x, resident_after=None):
    pf.begin()
    pf.onload(top)
    x = top.block(x)
    for g in groups:
        owned = pf.owns(g)
        if owned:
            pf.onload(g)
        else:
            pf.kick()  # a resident group's onload_
        x = g.block(x)
        if g is resident_after:
            g.onload_ = object()  # made resident on the device: its onload_ replaced
            continue
        if owned:
            pf.offload(g)
    pf.offload(top)
    pf.end()
    return x


def _three_forwards(loaded):
    module = loaded.module
    module._go = lambda: _kit.Obj(_is_torchao_tensor=lambda t: False,
                                  _swap_torchao_tensor=None)
    device = torch.ones(1, device="cuda").device
    copy = torch.cuda.Stream()
    denoiser = torch.nn.Module()
    top = _Group(torch.nn.Linear(8, 8), copy, leader=denoiser)
    groups = [_Group(torch.nn.Linear(8, 8), copy) for _ in range(4)]
    pf = module.GroupPrefetcher(denoiser, [top] + groups, device, depth=2)
    pf.fence_first = False  # as install_group_prefetch sets it with a top group
    assert pf.enable_slots() >= 0 and pf.slot_of
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for resident_after in (None, groups[3], None):
            x = _forward(pf, top, groups, torch.ones(4, 8, device=device), resident_after)
            total += x.sum()
    assert pf.slot_of[id(groups[3])] == pf.slot_of[id(groups[0])]
    assert pf.stats.get("slot_fills", 0) > 4, pf.stats
    return total


def test_r12_disowned_group_cloned_out_of_its_slot_clean():
    assert _kit.findings(_three_forwards, _kit.release(REL, FILE)) == []


def test_r12_without_the_copy_streams_wait_flagged():
    found = _kit.findings(_three_forwards, _kit.twin(REL, FILE, *NO_DONE_WAIT))
    assert any("race" in f and "_detach_from_slot" in f for f in found), found
