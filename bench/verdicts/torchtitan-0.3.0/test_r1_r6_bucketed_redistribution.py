"""torchtitan 0.3.0, ranks 1-6 of its scan: ``_BucketedRedistributionRuntime``
(distributed/flex_shard/_optimizer_reshard_runtime.py l.572-636), safe.

The scan reads the slot buffers (``storage_exchange``, ``compute_exchange``,
``storage_scratch``) as made on the current stream and used on the transfer
stream with no wait (rank 1) and no ``record_stream`` (ranks 2-6). They are
made in ``_BufferSlot.reserve`` under ``with device_handle.stream(transfer_stream)``
(l.136-162) and kept in the slot across calls, so their lifetime is the
transfer stream's. The only current-stream writes to them are
``_compute_redistributed``'s reads and writes of ``compute_exchange``, each
bucket's followed by ``slot.compute_done.record(caller)`` (l.618), which the
transfer stream waits for before it touches that slot again
(``transfer.wait_event(work.slot.compute_done)``, l.630; the slot's next
storage-to-compute comes after on the same stream). The transfer stream's
single ``wait_stream(caller)`` at the first redistributed bucket (l.482-484)
orders what the caller wrote before the step (gradients, momentum); the step
ends with ``caller_stream.wait_event(work.slot.done)`` (l.546).

Driven as ``DistMuon`` drives it: ``reserve_buffers`` once, then two steps,
each a backward writing the gradients on the current stream, ``run`` over five
buckets (four redistributed, so both pipeline slots are reused, and a
local-only bucket between them, which bars prefetch), and the next forward
reading the parameters: clean. With the wait at l.630 removed (the twin), the
transfer stream's storage-to-compute of a slot's next bucket and its
compute-to-storage race with the current stream's writes of
``compute_exchange``, and dropping the runtime frees that buffer while the
current stream's use is unordered: flagged (race and lifetime), so the harness
can fail. With the first-pass wait removed instead, the transfer stream's
``prepare`` reads the gradients the backward wrote: flagged; the one wait per
step suffices because the current stream writes nothing the transfer stream
reads during the loop but ``compute_exchange``, which the events order.

Hand edits: one rank (the all-to-alls are the release's local copies); the
plans are built with the release's own planners for a parameter owned
whole by rank 0; the callbacks stand for ``DistMuon``'s: ``prepare`` reads the
gradient, updates the momentum and writes the input, ``compute`` updates its
input in place, ``finalize`` applies the update to the parameter.
"""

import sys

import torch

from bench.verdicts import _kit

REL = "torchtitan-0.3.0"
FILE = "torchtitan/distributed/flex_shard/_optimizer_reshard_runtime.py"
NO_DONE_WAIT = ("            transfer.wait_event(work.slot.compute_done)\n", "")
NO_FIRST_WAIT = ("                    context.transfer_stream.wait_stream(caller)\n", "")
ROWS, COLS = 4, 8


class _Param:
    """One parameter as ``DistMuon``'s callbacks use it: value, gradient, momentum."""

    def __init__(self, device, seed):
        self.value = torch.full((ROWS, COLS), float(seed), device=device)
        self.grad = torch.zeros(ROWS, COLS, device=device)
        self.momentum = torch.zeros(ROWS, COLS, device=device)


def _spec(p):
    return p.value.shape, p.value.dtype, p.value.device


def _prepare(p, out):
    p.momentum.lerp_(p.grad, 0.05)
    torch.lerp(p.grad, p.momentum, 0.95, out=out)


def _compute(p, direction):
    direction.mul_(0.5)


def _finalize(p, update):
    p.value.add_(update, alpha=-0.01)


def _bucket(module, params, unredistributed=()):
    schedule = sys.modules[module._RedistributionBucketPlan.__module__]
    shape = (ROWS, COLS)
    plans = tuple(schedule._build_owned_redistribution_plan(
        [((0,), schedule._TensorRegion(offsets=(0, 0), shape=shape))],
        participants=(0,), owner_rank=0, logical_shape=shape) for _ in params)
    direction = schedule._RedistributionDirection

    def packed(way):
        return schedule._build_packed_all_to_all_schedule(
            plans, direction=way, process_group=None, local_participant=0)

    return schedule._RedistributionBucketPlan(
        unredistributed_items=tuple(unredistributed), redistributed_items=tuple(params),
        redistribution_plans=plans,
        group=schedule._RedistributionGroup(process_group=None, participants=(0,),
                                            local_participant=0),
        storage_to_compute_schedule=packed(direction.STORAGE_TO_COMPUTE),
        compute_to_storage_schedule=packed(direction.COMPUTE_TO_STORAGE),
        dtype=torch.float32, device=params[0].value.device)


def _steps(loaded, steps=2):
    module = loaded.module
    device = torch.ones(1, device="cuda").device
    p = [_Param(device, i) for i in range(7)]
    plans = [_bucket(module, p[0:2]), _bucket(module, p[2:3], unredistributed=p[3:4]),
             _bucket(module, p[4:5]), module._LocalBucketPlan(items=(p[5],)),
             _bucket(module, p[6:7])]
    runtime = module._BucketedRedistributionRuntime(device)
    runtime.reserve_buffers(plans, local_tensor_spec=_spec)
    total = torch.zeros(1, device=device)
    for step in range(steps):
        for q in p:  # the backward
            q.grad.fill_(float(step + 1))
        runtime.run(plans, local_tensor_spec=_spec, prepare=_prepare, compute=_compute,
                    finalize=_finalize)
        for q in p:  # the next forward
            total += q.value.sum()
    return total


def test_r1_r6_as_dist_muon_drives_it_clean():
    assert _kit.findings(_steps, _kit.release(REL, FILE)) == []


def test_r1_r6_without_the_compute_done_wait_flagged():
    found = _kit.findings(_steps, _kit.twin(REL, FILE, *NO_DONE_WAIT))
    assert any("race" in f and "_compute_redistributed" in f for f in found), found
    assert any("lifetime" in f and "_reserve_tensor" in f for f in found), found


def test_first_pass_wait_orders_the_backward():
    found = _kit.findings(_steps, _kit.twin(REL, FILE, *NO_FIRST_WAIT))
    assert any("race" in f and "_prepare" in f for f in found), found
