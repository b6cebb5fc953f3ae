"""The CUDA oracles' wiring that runs without a GPU: the reuse oracle watching
from the lifetime oracle's dispatch mode, and the lifetime oracle handed a
tensor the runner made unseen. The oracles themselves are in ``tests/test_gpu.py``."""

import weakref
from types import SimpleNamespace

import pytest
import torch

from streamfuzz.fuzz import gates
from streamfuzz.fuzz.oracles import lifetime, lifetime_cuda, reuse


class _Main:
    device_index = 0
    cuda_stream = 1234
    device = torch.device("cpu")


class _Checker:
    def __init__(self) -> None:
        self.ops: list = []

    def _guarded(self, fn, *args):  # noqa: ANN001, ANN202
        fn(*args)

    def _on_op(self, func, args, kwargs, out):  # noqa: ANN001, ANN202
        self.ops.append(func)


class _Watch:
    def __init__(self) -> None:
        self.seen: list = []

    def observe(self, func, args, kwargs, out):  # noqa: ANN001, ANN202
        self.seen.append((func, out))


def test_a_shared_watch_rides_the_lifetime_mode_only_for_the_call():
    checker = _Checker()
    mode = lifetime_cuda._CudaDispatch(checker)
    watch = reuse.ReuseWatch(_Main(), rank=0)
    assert isinstance(watch.call(), reuse._Mode)  # no lifetime oracle: a mode of its own
    watch.share(mode)
    call = watch.call()
    assert mode.reuse is None
    with call:
        assert mode.reuse is watch
    assert mode.reuse is None


def test_the_lifetime_mode_hands_each_op_to_the_reuse_watch_after_the_checker():
    checker = _Checker()
    mode = lifetime_cuda._CudaDispatch(checker)
    a, b = torch.ones(2), torch.ones(2)
    add = torch.ops.aten.add.Tensor
    out = mode.__torch_dispatch__(add, (), (a, b))
    assert checker.ops == [add] and torch.equal(out, a + b)  # no watch: nothing else
    mode.reuse = watch = _Watch()
    out = mode.__torch_dispatch__(add, (), (a, b))
    assert checker.ops == [add, add] and watch.seen[0][0] is add
    assert torch.equal(watch.seen[0][1], out)


def test_trace_events_reach_every_live_gate_pool_and_skip_dead_ones(monkeypatch):
    class _Pool:
        def __init__(self) -> None:
            self.records: list = []
            self._next = 1  # a gate held in this example, as Gates counts them

        def _on_record(self, event, stream):  # noqa: ANN001, ANN202
            self.records.append((event, stream))

    live, gone = _Pool(), _Pool()
    refs = [weakref.ref(live), weakref.ref(gone)]
    del gone
    monkeypatch.setattr(gates, "_POOLS", refs)
    gates._each("_on_record", 7, 8)
    assert live.records == [(7, 8)]


def test_both_cuda_oracles_read_the_stream_handle_of_their_own_device(monkeypatch):
    from streamfuzz.fuzz import dispatch_mode

    monkeypatch.setattr(dispatch_mode, "_RAW_STREAM", lambda index: 0x7000 + index)
    assert dispatch_mode.current_stream_handle(torch.device("cuda", 3)) == 0x7003
    assert reuse.current_stream_handle is lifetime_cuda.current_stream_handle


class _BrokenEvent:
    def query(self) -> bool:
        raise RuntimeError("event query failed")


class _CudaLike:
    """Stands for a CUDA tensor just allocated on main (``check`` reads its storage)."""

    is_cuda = True

    def untyped_storage(self):  # noqa: ANN201
        return torch.ones(4).untyped_storage()


def test_a_reuse_watch_bug_is_one_finding_that_blames_streamfuzz_not_the_target():
    """Raised into the runner or the handler's op, it read as the target's crash."""
    watch = reuse.ReuseWatch(_Main(), rank=1)
    watch.step = 2
    watch._used.append((0, 1 << 62, _BrokenEvent(), 1, "copy_", 0x20, 1))
    watch.check(_CudaLike(), "churn")
    watch.check(_CudaLike(), "churn")  # watches no more
    (f,) = watch.findings
    assert (f.kind, f.rank, f.step) == ("crash", 1, 2)
    assert f.message.startswith("reuse oracle internal error (a bug in streamfuzz, not in the "
                                "code under test): RuntimeError: event query failed at ")
    assert "test_reuse_shared_mode.py:" in f.message


class _Streams:
    device = torch.device("cpu")
    created: list = []

    def current_stream(self) -> _Main:
        return _Main()


def test_a_tensor_made_unseen_is_followed_as_made_by_its_op_on_the_named_stream():
    checker = lifetime_cuda.CudaLifetimeChecker(_Streams(), rank=0)
    checker.kind = lambda t: lifetime.DEVICE  # a CPU tensor standing for device memory
    t = torch.zeros(3, dtype=torch.int64)
    checker.name(t, "idx_mapping", _Main(), made_by="aten._to_copy")
    info = checker.model.storages[t.untyped_storage()._cdata]
    assert (info.name, info.alloc_op, info.stream) == ("idx_mapping", "aten._to_copy",
                                                       _Main.cuda_stream)
    assert checker.model.name_of(info.stream) == "main"
    ((write,),) = info.writes.values()  # made is written, on main
    assert write.stream == _Main.cuda_stream and write.op == "aten._to_copy"
    checker.name(t, "renamed", _Main(), made_by="elsewhere")  # followed already: named only
    assert (info.name, info.alloc_op) == ("renamed", "aten._to_copy")
    assert checker.model.findings == []


class _Busy:
    def query(self) -> bool:
        return False


@pytest.mark.parametrize("main_waited, found", [(False, 1), (True, 0)])
def test_a_busy_block_is_no_finding_where_main_is_ordered_after_its_use(main_waited, found):
    """The lifetime oracle's clocks say whether main's new work runs after the
    old tenant's last use: main waited for that stream, so nothing can collide."""
    model = lifetime.LifetimeModel(0, {})
    side = 0x20
    model.new_stream(_Main.cuda_stream)
    model.new_stream(side)
    model.access(1, side, False, "index", ())  # no storage followed: only the clock moves
    model._enqueue(side)
    watch = reuse.ReuseWatch(_Main(), rank=0)
    watch.share(SimpleNamespace(checker=SimpleNamespace(model=model)))
    watch._used.append((0, 1 << 62, _Busy(), 1, "index", side, model.clocks[side][side]))
    if main_waited:
        model.wait_stream(_Main.cuda_stream, side)
    watch.check(_CudaLike(), "churn")
    assert len(watch.findings) == found
