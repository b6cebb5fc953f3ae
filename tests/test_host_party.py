"""The host as a party: pinned memory touched by the host is ordered with the
streams only by host syncs, never by wait_stream or events alone."""

import pytest
import torch

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.oracles.lifetime import LifetimeChecker
from streamfuzz.fuzz.streams import SimStreams


def _run(body):
    """Run ``body(side)`` on fresh simulated streams under the lifetime checker."""
    api = SimStreams()
    checker = LifetimeChecker(api).attach()
    try:
        with api.session():
            side = torch.cuda.Stream()
            body(side)
            del side
        return checker.finish()
    finally:
        checker.detach()


def _copy_to_pinned(side):
    """Device rows copied non-blocking into pinned memory on ``side``."""
    rows = torch.arange(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        host = torch.empty(4, dtype=torch.int64, pin_memory=True)
        host.copy_(rows, non_blocking=True)
    rows.record_stream(side)
    return host


def test_wait_stream_does_not_order_the_host():
    def body(side):
        host = _copy_to_pinned(side)
        torch.cuda.current_stream().wait_stream(side)
        host.tolist()

    (f,) = _run(body)
    assert f.kind == "race"
    assert f.message.startswith("read-after-write race on a tensor int64[4] made by "
                                   "aten.empty.memory_format: the host reads it "
                                   "(Tensor.tolist) unordered with side's write (aten.copy_)")


def test_without_any_wait_the_reader_is_named_the_host_not_main():
    def body(side):
        host = _copy_to_pinned(side)
        host.sum()

    (f,) = _run(body)
    assert "the host reads it (aten.sum" in f.message and "main reads" not in f.message


@pytest.mark.parametrize("sync", ["stream", "event", "device", "blocking copy", "item",
                                  "tolist", "accelerator"])
def test_each_host_sync_orders_the_hosts_read(sync):
    def body(side):
        host = _copy_to_pinned(side)
        with torch.cuda.stream(side):
            ev = torch.cuda.Event()
            ev.record()
            probe = torch.ones(1, device="cuda")
            if sync == "blocking copy":
                probe.cpu()
            elif sync == "item":
                probe.item()
            elif sync == "tolist":
                probe.tolist()
        if sync == "stream":
            side.synchronize()
        elif sync == "event":
            ev.synchronize()
        elif sync == "device":
            torch.cuda.synchronize()
        elif sync == "accelerator":
            torch.accelerator.synchronize()
        host.tolist()
        host.add_(1)

    assert _run(body) == []


def test_a_non_blocking_copy_into_pageable_memory_is_synchronous_for_the_host():
    def body(side):
        pageable = torch.empty(4, dtype=torch.int64)
        pinned = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        with torch.cuda.stream(side):
            rows = torch.arange(4, device="cuda")
            pinned.copy_(rows, non_blocking=True)
            pageable.copy_(rows, non_blocking=True)  # CUDA waits for this one: the host too
        pinned.tolist()

    assert _run(body) == []


def test_the_host_rewriting_a_pinned_buffer_a_pending_upload_reads():
    def body(side):
        staging = torch.zeros(2, dtype=torch.int64).pin_memory()
        with torch.cuda.stream(side):
            staging.to("cuda", non_blocking=True)
        staging[0] = 7

    (f,) = _run(body)
    assert f.kind == "race"
    assert "the host writes it" in f.message and "unordered with side's read" in f.message


def test_a_pinned_buffer_freed_with_an_upload_pending_is_not_a_lifetime_failure():
    def body(side):
        staging = torch.ones(2, pin_memory=True)
        with torch.cuda.stream(side):
            dev = staging.to("cuda", non_blocking=True)
            del staging
            dev.add_(1)

    assert _run(body) == []


@pytest.mark.parametrize("name", ["HostReadSynced", "StagingSynced", "StagingBlockingCopy"])
def test_the_host_party_correct_variants_stay_clean(cpu_pool, ci_settings, name):
    res = driver.fuzz(cpu_pool, f"tests.cuda_handlers:{name}", ci_settings, max_examples=60,
                      seed=0, options=RunOptions(oracles={Oracle.LIFETIME, Oracle.VALUE}))
    assert res.failure is None, res.failure


@pytest.mark.parametrize(("name", "says"), [
    ("host-read-unsynced", "the host reads it (Tensor.tolist"),
    ("host-rewrites-staging", "the host writes it")])
def test_the_host_party_mutants_are_found_and_name_the_host(cpu_pool, ci_settings, name, says):
    res = driver.fuzz(cpu_pool, name, ci_settings, max_examples=200, seed=0,
                      options=RunOptions(oracles={Oracle.LIFETIME}))
    assert res.failure is not None and res.failure.kind == "race", name
    assert says in res.failure.message


def test_ops_that_read_only_metadata_are_no_access():
    # On CUDA, is_pinned is an aten op the dispatch mode sees; asking whether a
    # buffer is pinned while a stream writes it is no race.
    from streamfuzz.fuzz.oracles.lifetime import _op_info

    for op in (torch.ops.aten.is_pinned.default, torch.ops.aten.sym_size.int,
               torch.ops.aten.view.default):
        assert _op_info(op)[4], op
    for op in (torch.ops.aten.add.Tensor, torch.ops.aten.copy_.default,
               torch.ops.aten._local_scalar_dense.default):
        assert not _op_info(op)[4], op


def test_a_checker_bug_is_one_finding_that_blames_streamfuzz_not_the_target(monkeypatch):
    """The model raising must not reach the code under test (it would read as
    the target's crash): the example runs on, and one finding says whose bug."""
    from streamfuzz.fuzz.oracles.lifetime import LifetimeModel

    def broken(self, *args):
        raise KeyError("no such stream")

    monkeypatch.setattr(LifetimeModel, "wait_stream", broken)
    ran = []

    def body(side):
        torch.cuda.current_stream().wait_stream(side)
        _copy_to_pinned(side).sum()  # later events: not checked any more
        ran.append(True)

    (f,) = _run(body)
    assert ran and f.kind == "crash"
    assert f.message.startswith("lifetime oracle internal error (a bug in streamfuzz, not in "
                                "the code under test): KeyError: 'no such stream' at ")
    assert "test_host_party.py:" in f.message


def test_a_checker_bug_met_where_the_runner_names_or_polls_is_a_finding_not_a_crash(
        monkeypatch):
    """The runner calls the checker directly too (naming its batch tensors,
    polling after the call): a bug there must not raise into the runner either."""
    from streamfuzz.fuzz.oracles.lifetime import TensorTracker

    def broken(self, *args):
        raise RuntimeError("naming went wrong")

    monkeypatch.setattr(TensorTracker, "_name", broken)
    api = SimStreams()
    checker = LifetimeChecker(api).attach()
    try:
        with api.session():
            t = torch.ones(4, device="cuda")
            checker.name(t, "batch")  # raised into the runner before
            checker.name(t, "again")  # checks no more: one finding
            checker.poll()
        found = checker.finish()
    finally:
        checker.detach()
    (f,) = found
    assert f.kind == "crash" and "lifetime oracle internal error" in f.message
    assert "RuntimeError: naming went wrong at tests/test_host_party.py:" in f.message
