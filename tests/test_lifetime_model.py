"""The lifetime model on hand-written event sequences: each rule fires when it
must and stays quiet when the program's synchronization covers the access."""

import pytest

from streamfuzz.fuzz.oracles.lifetime import LifetimeModel, frames_here

MAIN, SIDE = 0, 1


class _Ref:
    def expired(self):
        return False


def _model():
    m = LifetimeModel(rank=1, stream_names={MAIN: "main", SIDE: "side"})
    m.new_stream(MAIN)
    m.new_stream(SIDE)
    return m


def _alloc(m, key=7, stream=MAIN, name="idx_mapping"):
    info = m.allocate(key, _Ref(), stream, (3,), "int64", "aten.lift_fresh", ())
    info.name = name
    return key


def _kinds(m):
    return [f.kind for f in m.report()]


def test_free_after_unordered_side_read_is_lifetime_and_names_the_tensor():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    m.step = 4
    m.free(k, ())
    m.step = 5
    (f,) = m.report()
    assert f.kind == "lifetime" and f.step == 4 and f.rank == 1
    assert f.message.startswith("idx_mapping (int64[3]) was freed while stream side")
    assert "aten.index.Tensor" in f.message


@pytest.mark.parametrize("sync", [
    lambda m: m.record_stream(7, SIDE),
    lambda m: m.wait_stream(MAIN, SIDE),
    lambda m: (m.record_event("e", SIDE), m.wait_event(MAIN, "e")),
    lambda m: m.sync_stream(SIDE),
    lambda m: m.sync_device(),
    lambda m: (m.record_event("e", SIDE), m.sync_event("e")),
], ids=["record_stream", "wait_stream", "event", "stream_sync", "device_sync", "event_sync"])
def test_free_is_clean_when_the_use_is_covered(sync):
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    sync(m)
    m.free(k, ())
    assert m.report() == []


def test_record_stream_on_the_wrong_stream_does_not_cover():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "c10d.broadcast_", ())
    m.record_stream(k, MAIN)
    m.free(k, ())
    assert _kinds(m) == ["lifetime"]


def test_event_recorded_before_the_use_does_not_cover_it():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.record_event("e", SIDE)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    m.wait_event(MAIN, "e")
    m.free(k, ())
    assert _kinds(m) == ["lifetime"]


def test_same_stream_use_and_free_is_clean():
    m = _model()
    k = _alloc(m)
    m.access(k, MAIN, True, "aten.fill_", ())
    m.free(k, ())
    assert m.report() == []


@pytest.mark.parametrize("first, second, kind", [
    (True, False, "read-after-write"),
    (False, True, "write-after-read"),
    (True, True, "write-after-write"),
])
def test_unordered_conflicting_accesses_are_races(first, second, kind):
    m = _model()
    k = _alloc(m, name="draft_table")
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, first, "a", ())
    m.access(k, MAIN, second, "b", ())
    (f,) = m.findings
    assert f.kind == "race" and f.message.startswith(f"{kind} race on draft_table")


def test_reads_from_two_streams_do_not_race():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "a", ())
    m.access(k, MAIN, False, "b", ())
    assert m.findings == []


def test_ordered_write_after_read_is_clean():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "a", ())
    m.record_event("e", SIDE)
    m.wait_event(MAIN, "e")
    m.access(k, MAIN, True, "b", ())
    assert m.findings == []


def test_host_sync_orders_later_work_on_every_stream():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "a", ())
    m.sync_stream(SIDE)  # e.g. .item() of something on side
    m.access(k, MAIN, True, "b", ())
    assert m.findings == []


def test_unrecorded_event_wait_orders_nothing():
    m = _model()
    k = _alloc(m)
    m.wait_event(SIDE, "never")
    m.access(k, SIDE, False, "a", ())
    assert _kinds(m) == ["race"]  # side reads main's unordered initial write


def test_findings_past_the_cap_are_counted_not_silently_dropped():
    m = _model()
    for key in range(12):
        _alloc(m, key=key, name=f"t{key}")
        m.wait_stream(SIDE, MAIN)
        m.access(key, SIDE, False, "aten.index.Tensor", ())
        m.free(key, ())
    found = m.report()
    assert len(found) == 8 and m.dropped == 4
    assert found[-1].message.endswith("... and 4 more finding(s) in this example, "
                                         "not shown (the first 8 are)")
    assert "more finding" not in m.findings[-1].message


def test_frames_are_the_callers_without_a_user_defined_mode_hook():
    # A mode's hook is the harness watching an op, even where a user wrote it;
    # the walk ends at the test runner.
    def __torch_dispatch__():  # noqa: N807 - the hook's name is the point
        return frames_here()

    def caller():
        return __torch_dispatch__()

    frames = caller()
    assert [fn for _, _, fn in frames] == [
        "caller", "test_frames_are_the_callers_without_a_user_defined_mode_hook"]
    assert all(path == __file__ for path, _, _ in frames)


NCCL = ("nccl", "1")


def test_a_use_that_a_recorded_stream_waited_for_is_covered():
    # side waited for the backend's use; record_stream(side) holds the block
    # until side's work so far is done, the backend's use included.
    m = _model()
    k = _alloc(m)
    m.wait_stream(NCCL, MAIN)
    m.access(k, NCCL, False, "c10d.send", ())
    m.wait_stream(SIDE, NCCL)
    m.record_stream(k, SIDE)
    m.free(k, ())
    assert m.report() == []


def _async_send(m, k):
    m.wait_stream(NCCL, MAIN)
    m.access(k, NCCL, False, "c10d.send", ())
    m.hold("w", NCCL, [k])


def test_an_async_collective_holds_its_storage_until_its_handle_is_waited_for():
    m = _model()
    k = _alloc(m)
    _async_send(m, k)
    m.free(k, ())  # dropped before the wait: the backend still holds it
    assert m.findings == []


@pytest.mark.parametrize("waiter, kinds", [(MAIN, []), (SIDE, ["lifetime"])],
                         ids=["waited-on-its-stream", "waited-on-another-stream"])
def test_once_waited_for_the_free_must_be_ordered_after_the_collective(waiter, kinds):
    m = _model()
    k = _alloc(m)
    _async_send(m, k)
    m.wait_work(waiter, "w")
    m.free(k, ())
    assert _kinds(m) == kinds


@pytest.mark.parametrize("waited, kinds", [(False, ["race"]), (True, [])],
                         ids=["never-waited-for", "waited-for"])
def test_reading_what_an_async_collective_writes_needs_a_wait_for_its_handle(waited, kinds):
    m = _model()
    k = _alloc(m, name="drafts")
    m.wait_stream(NCCL, MAIN)
    m.access(k, NCCL, True, "c10d.recv_", ())
    m.hold("w", NCCL, [k])
    if waited:
        m.wait_work(MAIN, "w")
    m.access(k, MAIN, False, "aten.index.Tensor", ())
    assert _kinds(m) == kinds


def _consumer_step(m, key, wait_first):
    """A batch made on the producer (SIDE), read on the consumer (MAIN), dropped
    with no record_stream; the producer's next batch, waited or not."""
    if wait_first:
        m.wait_stream(SIDE, MAIN)
    _alloc(m, key=key, stream=SIDE, name=f"batch{key}")
    m.wait_stream(MAIN, SIDE)
    m.access(key, MAIN, False, "aten.add.Tensor", ())
    m.free(key, ())


@pytest.mark.parametrize("wait_first, kinds", [(True, []), (False, ["lifetime"] * 3)],
                         ids=["producer-waits-before-each-allocation", "never-waits"])
def test_a_free_is_judged_at_the_next_allocation_on_its_stream(wait_first, kinds):
    # The caching allocator hands a freed block only to its own stream: a
    # producer that waits for the consumer before each allocation reuses
    # blocks only after the consumer's reads (a prefetching loader's shape).
    m = _model()
    for key in range(10, 14):
        _consumer_step(m, key, wait_first)
    assert [f.kind for f in m.findings] == kinds  # the last free is still pending
    # At the end the last free is judged too: trusted where the stream was
    # seen to wait before every reuse, reported where it was not.
    assert _kinds(m) == (kinds + ["lifetime"] if kinds else [])


def test_a_free_pending_at_the_end_is_judged_at_its_own_point():
    # Nothing reused the block, and a host sync came after the free: the
    # program's next step may still allocate on main before waiting, so the
    # free is judged where it happened (a one-step example keeps its finding).
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    m.free(k, ())
    m.sync_device()
    assert _kinds(m) == ["lifetime"]


def test_a_wait_between_the_free_and_the_next_allocation_orders_the_reuse():
    m = _model()
    k = _alloc(m)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    m.step = 2
    m.free(k, ())
    m.wait_stream(MAIN, SIDE)
    _alloc(m, key=8)
    assert _kinds(m) == []
    k = 9
    _alloc(m, key=k)
    m.wait_stream(SIDE, MAIN)
    m.access(k, SIDE, False, "aten.index.Tensor", ())
    m.step = 3
    m.free(k, ())
    m.step = 4
    _alloc(m, key=11)  # no wait this time: the reuse is unordered
    (f,) = m.report()
    assert f.kind == "lifetime" and f.step == 3
