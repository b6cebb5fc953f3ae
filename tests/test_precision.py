"""Precision probes: each a few lines of plain torch.cuda code, a hazard and its
safe form side by side, with the verdict the checker must give.

They run on simulated streams, and on a GPU where one is present (the same
code, the same verdicts, except where "What the checker sees" (docs/oracles.md)
says the GPU path is coarser: ``CUDA_WHOLE`` here).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

import streamfuzz

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _verdict(device: str, probe) -> list[str]:
    """The finding kinds of ``probe()`` run in a checked block."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with streamfuzz.checked(device=device, collect=True) as check:
        probe()
    return [f.kind for f in check.findings]


def _messages(device: str, probe) -> list[str]:
    with streamfuzz.checked(device=device, collect=True) as check:
        probe()
    return [f.message for f in check.findings]


# -- slices: one storage, two streams --------------------------------------------
def _two_streams_write(main_part, side_part):
    def probe():
        buf = torch.zeros(8, 4, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # buf's zeros are ordered
        with torch.cuda.stream(side):
            side_part(buf).fill_(1)
        main_part(buf).fill_(2)
        torch.cuda.synchronize()
    return probe


SLICES = {
    "disjoint rows": (lambda b: b[4:], lambda b: b[:4], []),
    "overlapping rows": (lambda b: b[2:6], lambda b: b[:4], ["race"]),
    "disjoint columns": (lambda b: b[:, 2:], lambda b: b[:, :2], []),
    "overlapping columns": (lambda b: b[:, 1:], lambda b: b[:, :2], ["race"]),
    "interleaved rows": (lambda b: b[1::2], lambda b: b[::2], []),
    "a row and a column": (lambda b: b[3], lambda b: b[:, 0], ["race"]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(SLICES))
def test_slices_written_by_two_streams_race_only_where_they_overlap(device, case):
    main_part, side_part, expected = SLICES[case]
    assert _verdict(device, _two_streams_write(main_part, side_part)) == expected


# -- indexed rows ----------------------------------------------------------------
def _indexed(side_rows, main_rows, how):
    def probe():
        cache = torch.zeros(6, 4, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        src = torch.ones(len(side_rows), 4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            idx = torch.tensor(side_rows, device="cuda")
            if how == "index_copy_":
                cache.index_copy_(0, idx, src)
            elif how == "index_put_":
                cache[idx] = src
            else:
                cache.scatter_(0, idx.view(-1, 1).expand(-1, 4), src)
        rows = cache[torch.tensor(main_rows, device="cuda")]  # main reads, no wait for side
        torch.cuda.synchronize()
        del rows
    return probe


CUDA_WHOLE = pytest.mark.xfail(
    reason="on CUDA an index tensor in device memory is not read (that would sync): "
    "the op touches its whole view", strict=True)


@pytest.mark.parametrize("how", ["index_copy_", "index_put_", "scatter_"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu,
                                                                        CUDA_WHOLE])])
def test_disjoint_indexed_rows_do_not_race(device, how):
    assert _verdict(device, _indexed([0, 1], [3, 4], how)) == []


@pytest.mark.parametrize("how", ["index_copy_", "index_put_", "scatter_"])
@pytest.mark.parametrize("device", DEVICES)
def test_overlapping_indexed_rows_race(device, how):
    assert _verdict(device, _indexed([0, 3], [3, 4], how)) == ["race"]


@pytest.mark.parametrize("device", DEVICES)
def test_a_kv_cache_load_into_an_unused_block_is_clean_and_into_a_used_one_races(device):
    """One storage holds every block; a side stream loads blocks while main
    runs attention over the blocks of the batch."""
    def load(into):
        def probe():
            kv = torch.zeros(2, 8, 4, 2, device="cuda")  # (k/v, block, slot, dim)
            load_stream = torch.cuda.Stream()
            load_stream.wait_stream(torch.cuda.current_stream())
            staged = torch.ones(2, 1, 4, 2, device="cuda")
            load_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(load_stream):
                kv[:, into] = staged[:, 0]
            used = torch.tensor([1, 2])  # the batch's block table, in host memory
            out = kv[:, used].sum()  # main: attention over blocks 1 and 2
            torch.cuda.synchronize()
            del out
        return probe

    assert _verdict(device, load(5)) == []
    assert _verdict(device, load(2)) == ["race"]


@pytest.mark.parametrize("device", DEVICES)
def test_every_distinct_race_on_a_storage_is_reported_first_an_overlapping_one(device):
    def probe():
        buf = torch.zeros(16, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf[:4].fill_(1)                # site A
            buf[8:12].fill_(1)              # site B
        buf[12:].add_(1)                    # main: disjoint from both: no race
        buf[2:6].add_(1)                    # main, overlaps A only
        buf[10].add_(1)                     # main, overlaps B only
        torch.cuda.synchronize()

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    messages = _messages(device, probe)
    assert len(messages) == 2, messages
    assert "buf[2:6].add_(1)" in messages[0] and "buf[:4].fill_(1)" in messages[0]
    assert "buf[10].add_(1)" in messages[1] and "buf[8:12].fill_(1)" in messages[1]
    assert "bytes 8..16 of its 64" in messages[0]


# -- allocations at their true clock --------------------------------------------------
def _allocation(order):
    def probe():
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        warm = torch.ones(1 << 10, device="cuda")
        warm.mul_(2)
        order(main, side)
        x = torch.empty(1 << 10, device="cuda")
        with torch.cuda.stream(side):
            x.fill_(1)
        x.record_stream(side)
        torch.cuda.synchronize()
        del warm
    return probe


def _after_a_host_sync(main, side):
    torch.cuda.synchronize()


def _after_a_wait_with_no_main_work_since(main, side):
    side.wait_stream(main)


def _after_a_wait_then_a_free_of_later_work(main, side):
    side.wait_stream(main)
    y = torch.ones(1 << 10, device="cuda")  # main work after the wait...
    y.mul_(3)
    del y                                   # ...and its block freed: torch.empty may reuse it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order, expected", [
    (_after_a_host_sync, []),
    (_after_a_wait_with_no_main_work_since, []),
    (_after_a_wait_then_a_free_of_later_work, ["race"]),
], ids=["synchronize", "wait_stream", "wait-then-free"])
def test_a_fresh_allocation_stands_for_the_work_queued_before_it(device, order, expected):
    assert _verdict(device, _allocation(order)) == expected


@pytest.mark.parametrize("device", DEVICES)
def test_a_filled_allocation_is_a_write_on_its_stream(device):
    """``torch.zeros`` launches a fill on main: a side write without a wait races with it."""
    def probe():
        side = torch.cuda.Stream()
        torch.cuda.synchronize()
        x = torch.zeros(8, device="cuda")
        with torch.cuda.stream(side):
            x.fill_(1)
        torch.cuda.synchronize()
    assert _verdict(device, probe) == ["race"]


def test_an_allocation_race_says_which_block_may_be_reused():
    (msg,) = _messages("cpu", _allocation(_after_a_wait_then_a_free_of_later_work))
    assert msg.startswith("write-after-allocation race on a tensor float32[1024] made by "
                          "aten.empty"), msg
    assert "the last it freed: a tensor float32[1024] made by aten.ones" in msg
    assert "> x = torch.empty(1 << 10, device=\"cuda\")" in msg
    assert "> x.fill_(1)" in msg


# -- storages freed and made again in place (resize_) ---------------------------------
def _stash_then_free(order: str):
    """Memory-saving code: a side stream copies a buffer out (a stash to the
    host, an all-gather's input), then main frees the buffer's memory in
    place with ``untyped_storage().resize_(0)``, keeping the tensor."""
    def probe():
        buf = torch.ones(256, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            stash = buf.to("cpu", non_blocking=True)
        if order == "record_stream":
            buf.record_stream(side)
        elif order == "wait_stream":
            torch.cuda.current_stream().wait_stream(side)
        buf.untyped_storage().resize_(0)
        torch.cuda.synchronize()
        del stash
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order, expected", [
    ("none", ["lifetime"]), ("record_stream", []), ("wait_stream", [])])
def test_a_resize_to_zero_frees_the_storage(device, order, expected):
    assert _verdict(device, _stash_then_free(order)) == expected


def _unshard_after_a_free(record: bool):
    """FSDP-style: free a parameter's memory while a side stream still reads
    it, then allocate it again and write it on main (an unshard)."""
    def probe():
        param = torch.ones(256, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = param.sum()
        if record:
            param.record_stream(side)  # the old block waits for side; the new one is another
        param.untyped_storage().resize_(0)
        param.untyped_storage().resize_(256 * 4)
        param.fill_(2)  # main writes the new memory while side may still read the old
        torch.cuda.synchronize()
        del total
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("record, expected", [(False, ["lifetime"]), (True, [])])
def test_a_resize_from_zero_is_a_new_allocation(device, record, expected):
    """Once the old block is freed, main's write to the new one races nothing."""
    assert _verdict(device, _unshard_after_a_free(record)) == expected


def _gather_into_a_reallocated_buffer(wait: bool):
    """The new allocation may be a block main freed while its work still used
    it: a side stream that writes it (an all-gather into the unsharded
    parameter) must wait for main first."""
    def probe():
        side = torch.cuda.Stream()
        param = torch.empty(256, device="cuda")
        param.untyped_storage().resize_(0)
        torch.cuda.synchronize()
        scratch = torch.ones(256, device="cuda")
        scratch.mul_(3)
        del scratch  # freed on main, its block still in use by the mul_
        param.untyped_storage().resize_(256 * 4)
        if wait:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            param.fill_(1)
        param.record_stream(side)
        torch.cuda.synchronize()
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wait, expected", [(False, ["race"]), (True, [])])
def test_a_resize_from_zero_stands_for_the_work_queued_before_it(device, wait, expected):
    assert _verdict(device, _gather_into_a_reallocated_buffer(wait)) == expected


# -- set_: a tensor pointed at another storage ------------------------------------------
def _aliased_on_a_copy_stream(use_alias: bool):
    """A pipeline's ``record_stream`` workaround: on a copy stream that has
    not waited for main's write of ``x``, a shift-free alias of ``x``'s storage
    (``new_empty`` then ``set_``) is recorded, then detached. Only metadata:
    no data is touched, unless the alias is used."""
    def probe():
        x = torch.ones(256, device="cuda")                 # main writes x
        copy = torch.cuda.Stream()
        with torch.cuda.stream(copy):
            alias = x.new_empty([0]).set_(x.untyped_storage())
            alias.record_stream(copy)
            alias.set_()
            window = torch.empty(0, device="cuda").set_(x.untyped_storage(), 64, (16,), (1,))
            same = torch.zeros_like(x).set_(x)
            if use_alias:
                window.add_(1)                             # a write: unordered with main's
        torch.cuda.synchronize()
        del same
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_alias, expected", [(False, []), (True, ["race"])],
                         ids=["metadata-only", "alias-written"])
def test_set_points_a_tensor_at_a_storage_and_touches_no_data(device, use_alias, expected):
    assert _verdict(device, _aliased_on_a_copy_stream(use_alias)) == expected


# -- opaque work, described ------------------------------------------------------------
def _raw_copy(dst: torch.Tensor, src: torch.Tensor, gpu: bool) -> None:
    """A copy no aten op reports: on simulated streams the bytes move by memmove;
    on a GPU by the runtime's cudaMemcpyAsync (device to device) on the current stream."""
    n = src.numel() * src.element_size()
    if gpu:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        err = _cudart().cudaMemcpyAsync(ctypes.c_void_p(dst.data_ptr()),
                                        ctypes.c_void_p(src.data_ptr()), ctypes.c_size_t(n),
                                        3, stream)
        assert err == 0
    else:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)


def _cudart():
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _opaque_copy(wait: bool, annotated: bool, gpu: bool):
    def probe():
        src = torch.arange(64, dtype=torch.float32, device="cuda")
        src.mul_(2)                                  # main writes src
        dst = torch.empty(64, device="cuda")
        side = torch.cuda.Stream()
        if wait:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            if annotated:
                with streamfuzz.opaque(reads=[src], writes=[dst], label="raw copy"):
                    _raw_copy(dst, src, gpu)
            else:
                _raw_copy(dst, src, gpu)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wait, annotated, expected", [
    (False, True, ["race"]),
    (True, True, []),
    (False, False, []),  # unannotated: invisible, which is why the annotation exists
], ids=["annotated-unordered", "annotated-ordered", "unannotated"])
def test_an_annotated_raw_copy_is_checked_like_any_op(device, wait, annotated, expected):
    if device == "cuda" and _cudart() is None:
        pytest.skip("no CUDA runtime library to copy through")
    assert _verdict(device, _opaque_copy(wait, annotated, device == "cuda")) == expected


@pytest.mark.parametrize("device", DEVICES)
def test_the_decorator_form_names_tensor_parameters(device):
    @streamfuzz.opaque(reads=["src"], writes=["dst"])
    def launch(dst, src):
        _raw_copy(dst, src, device == "cuda")

    def probe():
        src = torch.ones(8, device="cuda")
        dst = torch.empty(8, device="cuda")
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            launch(dst, src)   # src's fill on main is not waited for
        torch.cuda.synchronize()

    if device == "cuda" and _cudart() is None:
        pytest.skip("no CUDA runtime library to copy through")
    kinds = _verdict(device, probe)
    assert kinds == ["race"], kinds


def test_opaque_rejects_what_it_cannot_check():
    with pytest.raises(streamfuzz.BadInput, match="lists"):
        streamfuzz.opaque(reads=torch.ones(1))
    with pytest.raises(streamfuzz.BadInput, match="no parameter 'y'"):
        streamfuzz.opaque(reads=["y"])(lambda x: x)
    with pytest.raises(streamfuzz.BadInput, match="'gpu'"):
        streamfuzz.opaque(stream="gpu")


def test_outside_a_checked_block_an_annotation_does_nothing():
    t = torch.ones(2)
    with streamfuzz.opaque(reads=[t], writes=[t]):
        pass


# -- a prefetching loader: the block goes back to the producer's pool ------------
def _prefetch_loader(wait_before_each_batch: bool, batches: int = 4):
    """A loader of the shape data loaders use: each batch is made on a
    prefetch stream, handed to the consumer's stream (it waits for the
    prefetch) and dropped with no record_stream. Safe only if the prefetch
    stream waits for the consumer before it allocates the next batch."""
    def probe():
        consumer = torch.cuda.current_stream()
        prefetch = torch.cuda.Stream()
        host = torch.arange(64, dtype=torch.float32).pin_memory()
        total = torch.zeros((), device="cuda")
        for _ in range(batches):
            if wait_before_each_batch:
                prefetch.wait_stream(consumer)
            with torch.cuda.stream(prefetch):
                batch = host.to("cuda", non_blocking=True)
            consumer.wait_stream(prefetch)
            total += batch.sum()  # the consumer reads the batch...
            del batch  # ...and drops it: its block goes back to the prefetch stream
        torch.cuda.synchronize()
    return probe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wait, expected", [(True, []), (False, ["lifetime"] * 4)],
                         ids=["waits-before-each-batch", "never-waits"])
def test_a_prefetch_stream_that_waits_before_each_allocation_reuses_safely(
        device, wait, expected):
    assert _verdict(device, _prefetch_loader(wait)) == expected
