"""Element ranges: which bytes of a storage a view or an indexed op touches."""

import torch

from streamfuzz.fuzz.oracles import spans


def _span(view, base):
    return spans.view_span(view, base.untyped_storage().nbytes())


def test_a_whole_tensor_is_the_whole_storage_and_a_slice_its_bytes():
    t = torch.zeros(8, 4)
    assert _span(t, t) is spans.WHOLE
    assert _span(t[2:4], t) == ((32, 64),)
    assert _span(t[2:2], t) == ()  # touches nothing: overlaps nothing
    assert not spans.overlap(_span(t[2:2], t), spans.WHOLE)


def test_strided_views_are_exact_where_they_interleave():
    t = torch.zeros(8, 4)
    even, odd = _span(t[::2], t), _span(t[1::2], t)
    assert not spans.overlap(even, odd)
    assert spans.overlap(_span(t[:, 1:3], t), _span(t[:, 2:], t))
    assert not spans.overlap(_span(t[:, :2], t), _span(t[:, 2:], t))
    assert spans.overlap(_span(t[3], t), _span(t[:, 0], t))


def test_covers_and_union():
    t = torch.zeros(16)
    assert spans.covers(_span(t[:8], t), _span(t[2:5], t))
    assert not spans.covers(_span(t[:8], t), _span(t[6:10], t))
    assert spans.union(_span(t[:4], t), _span(t[4:8], t)) == ((0, 32),)
    assert spans.covers(spans.WHOLE, _span(t[3:], t)) and not spans.covers(_span(t[3:], t),
                                                                             spans.WHOLE)


def test_a_huge_strided_view_is_bounded_and_never_misses_an_overlap():
    t = torch.zeros(1_000_000, 8)
    a, b = _span(t[:, :2], t), _span(t[:, 2:], t)
    assert len(a) <= 256 and len(b) <= 256
    assert spans.overlap(a, _span(t[500_000, 1:2], t))  # a byte it holds: never missed


def test_indexed_ops_touch_the_rows_their_indices_name():
    cache = torch.zeros(6, 4)
    n = cache.untyped_storage().nbytes()
    rows01 = spans.indexed_span("aten::index_copy_", (cache, 0, torch.tensor([0, 1]),
                                                      torch.ones(2, 4)), {}, n)
    rows34 = spans.indexed_span("aten::index", (cache, [torch.tensor([3, 4])]), {}, n)
    row1 = spans.indexed_span("aten::index_put_", (cache, [torch.tensor([-5])], torch.ones(4)),
                              {}, n)
    assert rows01 == ((0, 32),) and rows34 == ((48, 80),)
    assert not spans.overlap(rows01, rows34) and spans.overlap(rows01, row1)
    col = spans.indexed_span("aten::scatter_", (cache, 1, torch.tensor([[3], [3]]),
                                                torch.ones(2, 1)), {}, n)
    assert col == ((12, 16), (28, 32))
    masked = spans.indexed_span("aten::masked_fill_",
                                (cache, torch.tensor([False, True, False, False])), {}, n)
    assert masked == tuple((16 * r + 4, 16 * r + 8) for r in range(6))


def test_an_index_the_host_cannot_read_is_the_whole_view():
    t = torch.zeros(6, 4)
    meta_index = torch.empty(2, dtype=torch.int64, device="meta")
    got = spans.indexed_span("aten::index_select", (t[1:5], 0, meta_index), {},
                             t.untyped_storage().nbytes())
    assert got == ((16, 80),)
