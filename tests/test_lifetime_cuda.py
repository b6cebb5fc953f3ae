"""The CUDA lifetime adapter's parts that run without a GPU; the rest is in
``tests/test_gpu.py``."""

import numpy as np
import torch

from fuzz.oracles import lifetime_cuda


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
