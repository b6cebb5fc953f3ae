"""Host syncs open the gates they would wait for: the bookkeeping and the
trace plumbing, without a GPU (the GPU side is in ``tests/test_gpu.py``)."""

from types import SimpleNamespace

import numpy as np
import pytest
from torch.cuda import _gpu_trace as trace

from streamfuzz.fuzz.gates import Gate, Gates, _hook, _polling, _Waits

S1, S2, S3 = 0x10, 0x20, 0x30
E1, E2 = 0x100, 0x200


class _Gate:
    """What ``_Waits`` reads of a gate: whether it is open."""

    def __init__(self, name: str, opener: int | None = None) -> None:
        self.name, self.opened, self.opener = name, False, opener

    def __repr__(self) -> str:
        return self.name


@pytest.fixture
def w():
    return _Waits()


def test_a_sync_on_the_held_stream_needs_its_gate_and_no_other(w):
    a, b = _Gate("a"), _Gate("b")
    w.hold(a, S1)
    w.hold(b, S2)
    assert w.for_stream(S1) == [a]
    assert w.for_stream(S2) == [b]
    assert w.for_stream(S3) == []


def test_an_opened_gate_is_needed_no_more(w):
    a = _Gate("a")
    w.hold(a, S1)
    a.opened = True
    w.opened(a)
    assert w.for_stream(S1) == [] and w.for_device() == []


def test_wait_stream_carries_the_gate_to_the_waiting_stream(w):
    a = _Gate("a")
    w.hold(a, S1)
    w.record(E1, S1)  # S2.wait_stream(S1) is a record on S1 and a wait on S2
    w.wait(S2, E1)
    assert w.for_stream(S2) == [a] and w.for_event(E1) == [a]


def test_an_event_recorded_before_the_hold_does_not_wait_for_it(w):
    a = _Gate("a")
    w.record(E1, S1)
    w.hold(a, S1)
    w.wait(S2, E1)
    assert w.for_event(E1) == [] and w.for_stream(S2) == []
    assert w.for_stream(S1) == [a]


def test_a_rerecorded_event_waits_for_what_its_stream_waits_for_now(w):
    a = _Gate("a")
    w.record(E1, S2)
    w.hold(a, S1)
    w.record(E1, S1)
    assert w.for_event(E1) == [a]
    w.forget(E1)  # the event was destroyed; its handle may come back as a new event
    assert w.for_event(E1) == []


def test_a_gate_opened_from_a_held_stream_waits_for_that_streams_gate(w):
    a, b = _Gate("a"), _Gate("b")
    w.hold(a, S1)
    w.hold(b, S2)
    a.opened = True
    w.opened_after(a, S2)  # a's opening copy is queued on S2, behind b
    assert w.for_stream(S1) == [b]
    b.opened = True
    w.opened(b)
    assert w.for_stream(S1) == []


def test_openers_waiting_on_each_other_end(w):
    a, b = _Gate("a"), _Gate("b")
    w.hold(a, S1)
    w.hold(b, S2)
    a.opened = True
    w.opened_after(a, S2)
    b.opened = True
    w.opened_after(b, S1)
    assert w.for_stream(S1) == [] and w.for_stream(S2) == []


def test_a_device_sync_needs_every_closed_gate_and_clear_forgets_them(w):
    a, b, c = _Gate("a"), _Gate("b"), _Gate("c")
    for g, s in ((a, S1), (b, S2), (c, S3)):
        w.hold(g, s)
    b.opened = True
    assert sorted(w.for_device(), key=repr) == [a, c]
    w.clear()
    assert w.for_device() == [] and w.for_stream(S1) == []


def _host_pool(slots: int = 4) -> Gates:
    """A pool with host-side flags only: the part of ``Gates`` that a trace
    callback drives (launching the kernel needs a GPU)."""
    pool = Gates.__new__(Gates)
    pool._flags = np.zeros((slots, 4), dtype=np.int32)
    pool._next = 0
    pool._init_waits()
    return pool


def _held(pool: Gates, slot: int, stream: int, opener: int | None = None) -> Gate:
    gate = Gate(pool, slot, SimpleNamespace(cuda_stream=stream), opener)
    pool._waits.hold(gate, stream)
    pool._next = max(pool._next, slot + 1)  # as Gates.hold counts its slots
    return gate


def test_the_trace_callbacks_open_the_gates_a_host_sync_waits_for():
    pool = _host_pool()
    assert _hook(pool)
    on_s1, on_s2 = _held(pool, 0, S1), _held(pool, 1, S2)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)
    trace.EventWaitCallbacks.fire_callbacks(E1, S3)
    trace.StreamSynchronizationCallbacks.fire_callbacks(S3)  # e.g. .item() on S3
    assert on_s1.opened and not on_s2.opened
    assert pool._flags[:, 0].tolist() == [1, 0, 0, 0]
    assert pool.opened_by_sync == 1
    trace.EventSynchronizationCallbacks.fire_callbacks(E1)  # nothing left to open
    assert pool.opened_by_sync == 1
    trace.DeviceSynchronizationCallbacks.fire_callbacks()
    assert on_s2.opened and pool._flags[:, 0].tolist() == [1, 1, 0, 0]
    assert pool.opened_by_sync == 2


def test_callbacks_before_the_first_gate_of_an_example_follow_nothing():
    pool = _host_pool()
    assert _hook(pool)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)
    trace.EventWaitCallbacks.fire_callbacks(E1, S3)
    assert pool._waits._events == {} and pool._waits._streams == {}
    on_s1 = _held(pool, 0, S1)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)  # now recorded behind the gate
    trace.EventWaitCallbacks.fire_callbacks(E1, S3)
    trace.StreamSynchronizationCallbacks.fire_callbacks(S3)
    assert on_s1.opened and pool.opened_by_sync == 1


def test_a_deleted_event_no_longer_carries_a_gate():
    pool = _host_pool()
    assert _hook(pool)
    gate = _held(pool, 0, S1)
    trace.EventRecordCallbacks.fire_callbacks(E2, S1)
    trace.EventDeletionCallbacks.fire_callbacks(E2)
    trace.EventSynchronizationCallbacks.fire_callbacks(E2)
    assert not gate.opened and pool.opened_by_sync == 0


def test_a_gate_whose_opener_waits_for_it_is_due_directly_or_through_events(w):
    a, b = _Gate("a", opener=S2), _Gate("b", opener=S3)
    w.hold(a, S1)
    w.hold(b, S1)
    w.record(E1, S1)
    assert w.wait(S3, E1) == [b]  # S3 is b's opener: it could never reach its point
    w.record(E2, S3)  # S3 now waits behind a too; S2 waits on S3's event
    assert w.wait(S2, E2) == [a]


def test_a_wait_by_another_stream_leaves_the_gate_closed(w):
    a = _Gate("a", opener=S2)
    w.hold(a, S1)
    w.record(E1, S1)
    assert w.wait(S3, E1) == []


def test_the_openers_wait_opens_its_gate_at_once():
    pool = _host_pool()
    assert _hook(pool)
    gate = _held(pool, 0, S1, opener=S2)
    other = _held(pool, 1, S1, opener=None)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)
    trace.EventWaitCallbacks.fire_callbacks(E1, S3)  # not the opener: stays held
    assert not gate.opened
    trace.EventWaitCallbacks.fire_callbacks(E1, S2)
    assert gate.opened and gate.opened_early == "a wait of its opening stream"
    assert not other.opened and pool.opened_by_wait == 1


def test_a_host_polling_in_a_loop_opens_what_it_polls_one_poll_does_not():
    pool = _host_pool()
    assert _hook(pool)
    gate = _held(pool, 0, S1)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)
    query = _polling(lambda event: False, "for_event", "cuda_event")
    polled = SimpleNamespace(cuda_event=E1)
    assert query(polled) is False
    assert not gate.opened  # one "not done": the in-flight path is forced
    assert query(polled) is False
    assert gate.opened and pool.opened_by_poll == 1
    assert gate.opened_early == "the host polling it in a loop"


def test_polls_of_work_behind_no_gate_change_nothing():
    pool = _host_pool()
    assert _hook(pool)
    gate = _held(pool, 0, S1)
    query = _polling(lambda stream: False, "for_stream", "cuda_stream")
    for _ in range(3):
        query(SimpleNamespace(cuda_stream=S2))
    assert not gate.opened and pool.opened_by_poll == 0


def test_a_poll_through_the_checkers_own_wrapper_is_still_the_programs():
    """The lifetime checker wraps ``query`` over the gates' wrapper: the poll's
    caller is the program, not the checker's wrapper."""
    import streamfuzz.fuzz.oracles.lifetime_cuda as checker_module

    pool = _host_pool()
    assert _hook(pool)
    gate = _held(pool, 0, S1)
    trace.EventRecordCallbacks.fire_callbacks(E1, S1)
    inner = _polling(lambda event: False, "for_event", "cuda_event")
    namespace = {"inner": inner}
    exec(compile("def query(self):\n    return inner(self)\n", checker_module.__file__, "exec"),
         namespace)
    polled = SimpleNamespace(cuda_event=E1)
    namespace["query"](polled)
    namespace["query"](polled)
    assert gate.opened and pool.opened_by_poll == 1
