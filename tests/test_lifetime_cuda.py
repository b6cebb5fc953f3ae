"""The CUDA lifetime adapter's parts that run without a GPU; the rest is in
``tests/test_gpu.py``."""

import numpy as np
import torch

from streamfuzz.fuzz.oracles import lifetime_cuda


class _Checker:
    """Records what the adapter would hand the lifetime checker."""

    def __init__(self) -> None:
        self.reads: list[tuple[tuple[int, ...], str]] = []

    def _guarded(self, fn, *args):  # noqa: ANN001, ANN202
        fn(*args)

    def host_read(self, t: torch.Tensor, label: str) -> None:
        self.reads.append((tuple(t.shape), label))


def test_host_reads_are_seen_while_attached_and_the_methods_restored_after(monkeypatch):
    before = {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy")}
    checker = _Checker()
    monkeypatch.setattr(lifetime_cuda, "_active", checker)
    reads = lifetime_cuda._HostReads()
    t = torch.arange(3)
    with reads:
        assert t.tolist() == [0, 1, 2]
        assert np.array_equal(t.numpy(), np.arange(3))
        assert torch.zeros(2, 2).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert checker.reads == [((3,), "Tensor.tolist"), ((3,), "Tensor.numpy"),
                             ((2, 2), "Tensor.tolist")]
    assert {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy")} == before
    t.tolist()
    assert len(checker.reads) == 3


def test_host_reads_report_nothing_once_no_checker_is_active(monkeypatch):
    monkeypatch.setattr(lifetime_cuda, "_active", None)
    with lifetime_cuda._HostReads():
        assert torch.ones(2).tolist() == [1.0, 1.0]


class _Resizes(_Checker):
    def __init__(self) -> None:
        super().__init__()
        self.resizes: list[tuple[int, int]] = []

    def _on_resize(self, storage: torch.UntypedStorage, before: int) -> None:
        self.resizes.append((before, storage.nbytes()))


def test_a_storage_resize_is_seen_while_attached_and_the_method_restored_after(monkeypatch):
    """``resize_`` frees and allocates with no op saying so (FSDP's reshard)."""
    checker = _Resizes()
    monkeypatch.setattr(lifetime_cuda, "_active", checker)
    storage = torch.ones(4).untyped_storage()
    with lifetime_cuda._HostReads():
        storage.resize_(0)
        storage.resize_(8)
    storage.resize_(4)
    assert checker.resizes == [(16, 0), (0, 8)]
    assert "resize_" not in torch.UntypedStorage.__dict__


class _Syncs:
    """Records the syncs the adapter would hand the lifetime checker."""

    def __init__(self) -> None:
        self.syncs: list[tuple[str, int]] = []

    def _guarded(self, fn, *args, torch_ops=True):  # noqa: ANN001, ANN202
        fn(*args)

    def _on_event_sync(self, event: int) -> None:
        self.syncs.append(("event", event))


class _Event:
    cuda_event = 0xE1

    def __init__(self, done: bool) -> None:
        self.done = done


def test_a_query_that_says_done_is_a_sync_for_the_program_not_for_the_harness(monkeypatch):
    checker = _Syncs()
    monkeypatch.setattr(lifetime_cuda, "_active", checker)
    query = lifetime_cuda._query_method(lambda ev: ev.done, "_on_event_sync", "cuda_event")
    assert query(_Event(False)) is False  # not done: the program learns nothing
    assert query(_Event(True)) is True
    assert checker.syncs == [("event", 0xE1)]
    # The harness's own poll (the reuse oracle's, in fuzz/oracles/) is no sync.
    harness = {"query": query, "ev": _Event(True)}
    exec(compile("query(ev)", lifetime_cuda.__file__, "eval"), harness)
    assert checker.syncs == [("event", 0xE1)]


def test_event_and_stream_queries_are_wrapped_while_attached_and_restored_after():
    before = [torch.cuda.Event.__dict__.get("query"), torch.cuda.Stream.__dict__.get("query")]
    with lifetime_cuda._HostReads():
        assert torch.cuda.Event.query.__module__ == lifetime_cuda.__name__
        assert torch.cuda.Stream.query.__module__ == lifetime_cuda.__name__
    assert [torch.cuda.Event.__dict__.get("query"),
            torch.cuda.Stream.__dict__.get("query")] == before


_MAIN, _NCCL, _PRE, _END, _FUTURE = 0x10, 0x20, 0xE1, 0xE2, 0xE3


class _Launches(lifetime_cuda.CudaLifetimeChecker):
    """The adapter with no CUDA: the current stream is ``_MAIN``, and ``op``
    says where it would put a c10d op's accesses (holding its storage 7, as
    the model does for an async collective)."""

    def __init__(self) -> None:  # the model's parts only: no streams, no mode
        from streamfuzz.fuzz.oracles.lifetime import LifetimeModel, TensorTracker

        TensorTracker.__init__(self, LifetimeModel(0, {}), 0)
        self.model.stream_names[_MAIN] = "main"
        self._works = {}
        self.ops: list[tuple[int, object]] = []

    def _current(self) -> int:
        return _MAIN

    def _poll(self, frames=None):  # noqa: ANN001, ANN202
        return frames

    def op(self, func, args, kwargs, out, s, on=None):  # noqa: ANN001, ANN201
        self.ops.append((s, on))
        if on is not None:
            self.model.hold(on[1], on[0], [7])


def test_an_async_collective_runs_on_the_stream_nccl_recorded_its_end_event_on():
    checker = _Launches()
    # NCCL's launch: its stream waits for the current one, then the end event
    # and the future's event are recorded on its stream.
    checker._on_collective(None, (), {}, None, [
        ("_on_event_record", (_PRE, _MAIN)), ("_on_event_wait", (_PRE, _NCCL)),
        ("_on_event_record", (_END, _NCCL)), ("_on_event_record", (_FUTURE, _NCCL))])
    assert checker.ops == [(_MAIN, (_NCCL, _END))]
    assert checker.model.stream_names[_NCCL] == "nccl(stream 1)"
    assert _PRE in checker.model.events and _FUTURE in checker.model.events
    assert _END in checker.model.held
    # Waiting on the future's event is waiting for the work: NCCL lets go.
    checker._on_event_wait(_FUTURE, _MAIN)
    assert _END not in checker.model.held


def test_a_collective_nccl_ran_on_the_current_stream_is_an_op_there():
    checker = _Launches()
    checker._on_collective(None, (), {}, None, [("_on_event_record", (_END, _MAIN))])
    checker._on_collective(None, (), {}, None, [])
    assert checker.ops == [(_MAIN, None), (_MAIN, None)]
    assert _END in checker.model.events and not checker.model.held
