"""unsloth 2026.10.9, ranks 5, 8, 9 and 11 of its scan:
``_EncoderPrefetcher._copy_group_locked``
(studio/backend/core/inference/diffusion_small_host.py l.777, 790, 801), safe.

* Ranks 5, 8, 11 (``src`` read on the compute / side stream, "last written on
  the current stream"): ``src`` is the group's host copy
  (``cpu_param_dict``), never written by a stream. On the pageable path
  (l.783-806) no stream reads it at all: the host copies it into the pinned
  ring (``buf.copy_(sb[...])``, l.801) and the side stream copies the ring
  into ``dst``. On l.777 it is a pinned host copy (or a tensor already on the
  device, where ``.to`` returns it) read by an H2D copy on the compute stream.
  What the side stream writes is ``dst``, made on the compute stream
  (l.786) and ordered by ``queued`` (l.787-789, the side stream waits for the
  compute stream after the allocation); the forward takes it after
  ``cur.wait_event(done)`` in ``_attach``.
* Rank 9 (pinned ``self.stage`` rewritten by the host while the copy from it
  may still read it): each ring slot's event, recorded after the copy from
  it (l.803-805), is synchronized before the host writes that slot again
  (l.797-799).

Driven as ``install_encoder_prefetch`` drives it: the prefetcher made with
its ring, each group's ``onload_`` answered by ``onload``, the encoder's
forward hooks calling ``begin`` / ``end``, and two forwards (the first
copies synchronously and records the order; the second copies ahead on the
worker thread), a tensor the current stream still works on dropped before
each: clean. With the side stream's wait on ``queued`` removed: flagged
(write-after-allocation on ``dst``); with the slot event's ``synchronize``
removed: flagged (the host rewrites a ring slot the side stream's copy still
reads), so the harness can fail for each.

Hand edits: the ring's slot size (``_STAGE_SLOT_BYTES``) is set small, so a
weight spans several slots and the ring wraps; diffusers' leaf-level offload
groups are small objects with what the prefetcher reads (``modules``,
``cpu_param_dict`` of pageable host copies, one pinned, ``stream``) and
diffusers' ``offload_`` as it is with ``record_stream`` on (the parameters
point back at their host copies).
"""

import torch

from bench.verdicts import _kit

REL = "unsloth-2026.10.9"
FILE = "studio/backend/core/inference/diffusion_small_host.py"
NO_QUEUED_WAIT = ("                stream.wait_event(queued)\n", "")
NO_SLOT_SYNC = ("                    if ev is not None:\n"
                "                        ev.synchronize()\n", "")


class _Group:
    """A diffusers leaf-level offload group as the prefetcher reads it."""

    def __init__(self, block, stream, pinned_bias):
        self.block = block
        self.modules, self.parameters, self.buffers = [block], None, None
        self.stream, self.record_stream = stream, True
        self.cpu_param_dict = {p: p.data.clone() for p in block.parameters()}
        if pinned_bias:
            self.cpu_param_dict[block.bias] = block.bias.data.pin_memory()
        self.offload_()

    def offload_(self):
        for p, host in self.cpu_param_dict.items():
            p.data = host


def _forwards(loaded, count=2):
    module = loaded.module
    module._STAGE_SLOT_BYTES = 96
    device = torch.ones(1, device="cuda").device
    stream = torch.cuda.Stream()
    blocks = [torch.nn.Linear(8, 8) for _ in range(3)]
    groups = [_Group(b, stream, pinned_bias=(i == 0)) for i, b in enumerate(blocks)]
    pf = module._EncoderPrefetcher(torch.nn.Module(), groups, device)
    pf._ensure_stage()
    total = torch.zeros(1, device=device)
    with torch.no_grad():
        for _ in range(count):
            previous = torch.ones(64, device=device).mul_(2.0)
            total += previous.sum()
            del previous  # queued work on a block the next allocations may get
            x = torch.ones(4, 8, device=device)
            pf.begin()  # the encoder's forward pre-hook
            for g in groups:
                pf.onload(g)  # diffusers' hook calls the group's onload_
                x = g.block(x)
                g.offload_()
            pf.end()  # the forward hook
            total += x.sum()
    assert pf.stats["prefetched"] > 0 and pf.stats["sync"] > 0, pf.stats
    return total


def test_r5_r8_r9_r11_as_install_encoder_prefetch_drives_it_clean():
    assert _kit.findings(_forwards, _kit.release(REL, FILE)) == []


def test_r8_r11_without_the_queued_wait_flagged():
    found = _kit.findings(_forwards, _kit.twin(REL, FILE, *NO_QUEUED_WAIT))
    assert any("race" in f and "_copy_group_locked" in f for f in found), found


def test_r9_without_the_slot_sync_flagged():
    found = _kit.findings(_forwards, _kit.twin(REL, FILE, *NO_SLOT_SYNC))
    assert any("race" in f and "the host writes" in f for f in found), found
