"""A plain test file, as a user has it: no streamfuzz import, GPU tests that
skip without CUDA. ``tests/test_pytest_flag.py`` runs it under
``pytest --streamfuzz``: the tests named ``test_bug_*`` must fail with a
finding, ``test_ok_*`` pass, ``test_unsimulated_*`` be skipped as not
simulated."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SIDE = torch.cuda.Stream() if torch.cuda.is_available() else None  # made at import


@pytest.fixture
def table():
    return torch.arange(64, device="cuda").view(16, 4)


def _gather(table, n, keep_alive):
    main = torch.cuda.current_stream()
    idx = torch.arange(n).to("cuda", non_blocking=True)
    SIDE.wait_stream(main)
    with torch.cuda.stream(SIDE):
        rows = table[idx]
    if keep_alive:
        idx.record_stream(SIDE)
    del idx
    main.wait_stream(SIDE)
    return rows


@requires_cuda
def test_bug_gather_frees_index_in_use(table):
    assert _gather(table, 4, keep_alive=False).shape == (4, 4)


@requires_cuda
def test_ok_gather_records_stream(table):
    assert _gather(table, 4, keep_alive=True).shape == (4, 4)


def _train_step(optimizer_cls):
    model = torch.nn.Linear(4, 4).cuda()
    opt = optimizer_cls(model.parameters(), lr=0.1)
    model(torch.ones(2, 4, device="cuda")).sum().backward()
    opt.step()


@requires_cuda
def test_ok_sgd_step():
    _train_step(torch.optim.SGD)


@requires_cuda
def test_ok_adam_step():
    _train_step(torch.optim.Adam)


def _offload(wait):
    """Free a buffer's memory (``resize_(0)``) while a copy stream reads it."""
    buf = torch.ones(1024, device="cuda")
    host = torch.empty(1024, pin_memory=True)
    SIDE.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(SIDE):
        host.copy_(buf, non_blocking=True)
    if wait:
        torch.cuda.current_stream().wait_stream(SIDE)
    buf.untyped_storage().resize_(0)
    torch.cuda.current_stream().wait_stream(SIDE)
    torch.cuda.synchronize()
    return host


@requires_cuda
def test_bug_resize_frees_under_copy():
    _offload(wait=False)


@requires_cuda
def test_ok_resize_after_wait():
    _offload(wait=True)


@requires_cuda
def test_bug_host_reads_before_sync():
    side = torch.cuda.Stream()
    x = torch.ones(8, device="cuda")
    out = torch.empty(8, pin_memory=True)
    with torch.cuda.stream(side):
        out.copy_(x, non_blocking=True)
    assert out.sum().item() == 8


@requires_cuda
def test_unsimulated_graph_capture():
    torch.cuda.CUDAGraph()


class TestUnittestStyle:
    def test_ok_sees_cuda(self):
        assert torch.cuda.is_available()
