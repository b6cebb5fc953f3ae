"""Which bytes of a storage an access touches: the lifetime oracle's element ranges.

Engine code keeps many tensors in one storage (a KV cache holds every block,
a staging buffer every chunk), and two streams that write different rows of
it never race. So an access is a *span*: the sorted, disjoint byte intervals
of its storage that it touches, or ``WHOLE`` where that is the whole storage
(the common case, kept cheap: no tuple is built for it).

* A view or slice is its exact elements: offset, sizes and strides, walked
  down to the innermost contiguous run. Past ``_MAX_PIECES`` intervals the
  span is coarsened into that many hulls, which can only add overlap.
* An indexed op (``index``, ``index_put_``, ``index_copy_``, ``index_select``,
  ``scatter_``, ``gather``, ``masked_fill_``...) touches what its indices name,
  read from the index tensor where it is host memory (always, on simulated
  streams). An index on the GPU is not read: that would make the host wait
  for the GPU, adding an order the program does not have; the op then
  touches its whole view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from streamfuzz.fuzz.dispatch_mode import unobserved

Span = tuple[tuple[int, int], ...] | None
"""Byte intervals ``[lo, hi)`` of a storage, sorted and disjoint; ``WHOLE`` (None): all of it."""
WHOLE: Span = None
_MAX_PIECES = 256
"""The most intervals a span keeps (beyond, hulls: more overlap, never less)."""
_MAX_INDICES = 4096
"""An index tensor with more elements is not read: the op touches its whole view."""


def overlap(a: Span, b: Span) -> bool:
    """Whether two spans of one storage share a byte (``WHOLE`` shares with any non-empty span)."""
    if a is None:
        return b is None or bool(b)
    if b is None:
        return bool(a)
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] <= b[j][0]:
            i += 1
        elif b[j][1] <= a[i][0]:
            j += 1
        else:
            return True
    return False


def covers(a: Span, b: Span) -> bool:
    """Whether span ``a`` holds every byte of span ``b``."""
    if a is None:
        return True
    if b is None:
        return False
    i = 0
    for lo, hi in b:
        while i < len(a) and a[i][1] <= lo:
            i += 1
        if i == len(a) or a[i][0] > lo or a[i][1] < hi:
            return False
    return True


def union(a: Span, b: Span) -> Span:
    if a is None or b is None:
        return WHOLE
    return _merged(list(a) + list(b))


def _merged(pieces: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, touching and overlapping intervals joined, at most ``_MAX_PIECES``."""
    pieces.sort()
    out: list[list[int]] = []
    for lo, hi in pieces:
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    if len(out) > _MAX_PIECES:
        per = -(-len(out) // _MAX_PIECES)
        out = [[out[i][0], out[min(i + per, len(out)) - 1][1]] for i in range(0, len(out), per)]
    return tuple((lo, hi) for lo, hi in out)


def _strided(offset: int, sizes: Sequence[int], strides: Sequence[int],
             itemsize: int) -> tuple[tuple[int, int], ...]:
    """The byte intervals of the elements at ``offset + sum(i_k * stride_k)``."""
    dims = []
    for size, stride in zip(sizes, strides):
        if size == 0:
            return ()
        if size > 1 and stride != 0:  # a broadcast dimension adds no element
            dims.append((stride, size))
    dims.sort(reverse=True)
    run = 1  # elements in the innermost contiguous run
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    starts = [offset]
    count = 1
    for _, size in dims:
        count *= size
    if count > 4 * _MAX_PIECES:  # too many to walk: hulls along the outermost dimension
        hull_inner = sum((size - 1) * stride for stride, size in dims[1:]) + run
        stride0, size0 = dims[0]
        per = -(-size0 // _MAX_PIECES)  # values of the outermost index per hull
        return _merged([((offset + i * stride0) * itemsize,
                         (offset + (min(i + per, size0) - 1) * stride0 + hull_inner) * itemsize)
                        for i in range(0, size0, per)])
    for stride, size in dims:
        starts = [s + i * stride for s in starts for i in range(size)]
    return _merged([(s * itemsize, (s + run) * itemsize) for s in starts])


def view_span(t: torch.Tensor, nbytes: int) -> Span:
    """The bytes of its storage (of ``nbytes`` bytes) that view ``t`` covers."""
    itemsize = t.element_size()
    offset = int(t.storage_offset())  # an int in eager mode; the stubs allow a SymInt
    if t.is_contiguous():
        n = t.numel() * itemsize
        lo = offset * itemsize
        if lo == 0 and n >= nbytes:
            return WHOLE
        return ((lo, lo + n),) if n else ()
    return _strided(offset, t.size(), t.stride(), itemsize)


def _readable(index: Any) -> bool:
    """Whether an index tensor can be read without the GPU (see the module docstring)."""
    return (isinstance(index, torch.Tensor) and not index.is_cuda and index.device.type == "cpu"
            and index.numel() <= _MAX_INDICES)


def _rows(t: torch.Tensor, dim: int, index: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """The sub-views ``t.select(dim, i)`` for each ``i`` in ``index``."""
    sizes, strides = list(t.size()), list(t.stride())
    dim = dim % max(t.dim(), 1)
    size, stride = sizes.pop(dim), strides.pop(dim)
    inner = _strided(0, sizes, strides, 1)  # in elements, relative to each row's start
    itemsize, offset = t.element_size(), t.storage_offset()
    rows = sorted({i % size for i in index.reshape(-1).tolist()}) if size else []
    if inner and len(rows) * len(inner) > 64 * _MAX_PIECES:
        inner = ((inner[0][0], inner[-1][1]),)  # each row as its hull: fewer, wider pieces
    return _merged([((offset + i * stride + lo) * itemsize, (offset + i * stride + hi) * itemsize)
                    for i in rows for lo, hi in inner])


def _positions(t: torch.Tensor, offsets: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """Single elements of ``t`` at element ``offsets`` from its storage offset."""
    itemsize, offset = t.element_size(), t.storage_offset()
    return _merged([((offset + o) * itemsize, (offset + o + 1) * itemsize)
                    for o in sorted(set(offsets.reshape(-1).tolist()))])


def _along(args: tuple, kwargs: dict) -> tuple[torch.Tensor, int, Any]:
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    index = args[2] if len(args) > 2 else kwargs.get("index")
    return args[0], dim, index


def _by_rows(args: tuple, kwargs: dict) -> tuple[tuple[int, int], ...] | None:
    """``index_select``, ``index_copy_``, ``index_add_``, ``index_fill_``: rows along ``dim``."""
    t, dim, index = _along(args, kwargs)
    if not _readable(index) or index.dtype == torch.bool:
        return None
    return _rows(t, dim, index)


def _by_elements(args: tuple, kwargs: dict) -> tuple[tuple[int, int], ...] | None:
    """``scatter_``, ``gather``: element ``p`` with coordinate ``dim`` replaced by ``index[p]``."""
    t, dim, index = _along(args, kwargs)
    if not _readable(index) or t.dim() == 0:
        return None
    dim %= t.dim()
    offsets = index.to(torch.int64).remainder(t.size(dim)) * t.stride(dim)
    for d in range(index.dim()):
        if d != dim:
            shape = [1] * index.dim()
            shape[d] = index.size(d)
            offsets = offsets + (torch.arange(index.size(d)) * t.stride(d)).view(shape)
    return _positions(t, offsets)


def _by_indices(args: tuple, kwargs: dict) -> tuple[tuple[int, int], ...] | None:
    """Advanced indexing (``index``, ``index_put_``): the index tensors, broadcast
    together, pick one value per indexed dimension; the other dimensions are whole."""
    t = args[0]
    indices = list(args[1] if len(args) > 1 else kwargs.get("indices", ()))
    if not indices or len(indices) > t.dim():
        return None
    expanded: list[Any] = []
    for i, index in enumerate(indices):
        if index is None:
            expanded.append(None)
        elif not _readable(index):
            return None
        elif index.dtype in (torch.bool, torch.uint8):
            if index.dim() != 1 or i + 1 > t.dim():
                return None  # a mask over several dimensions: the whole view
            expanded.append(index.nonzero().reshape(-1))
        else:
            expanded.append(index)
    picked = [i for i, index in enumerate(expanded) if index is not None]
    if not picked:
        return None
    if len(picked) == 1:
        return _rows(t, picked[0], expanded[picked[0]])
    values = torch.broadcast_tensors(*[expanded[i].to(torch.int64) for i in picked])
    offsets = sum(v.remainder(t.size(d)) * t.stride(d) for d, v in zip(picked, values))
    rest = [d for d in range(t.dim()) if d not in picked]
    inner = _strided(0, [t.size(d) for d in rest], [t.stride(d) for d in rest], 1)
    itemsize, offset = t.element_size(), t.storage_offset()
    return _merged([((offset + o + lo) * itemsize, (offset + o + hi) * itemsize)
                    for o in sorted(set(offsets.reshape(-1).tolist())) for lo, hi in inner])


def _by_mask(args: tuple, kwargs: dict) -> tuple[tuple[int, int], ...] | None:
    """``masked_fill_``, ``masked_scatter_``: the elements where the (broadcast) mask is set."""
    t = args[0]
    mask: Any = args[1] if len(args) > 1 else kwargs.get("mask")
    if not _readable(mask) or t.numel() > _MAX_INDICES:
        return None
    where = mask.expand_as(t).nonzero()
    if where.numel() == 0:
        return ()
    strides = torch.tensor(t.stride(), dtype=torch.int64)
    return _positions(t, (where * strides).sum(dim=1))


_INDEXED: dict[str, Callable[[tuple, dict], tuple[tuple[int, int], ...] | None]] = {
    "aten::index": _by_indices,
    "aten::index_put_": _by_indices,
    "aten::index_put": _by_indices,
    "aten::_index_put_impl_": _by_indices,
    "aten::index_select": _by_rows,
    "aten::index_copy_": _by_rows,
    "aten::index_add_": _by_rows,
    "aten::index_fill_": _by_rows,
    "aten::scatter_": _by_elements,
    "aten::scatter_add_": _by_elements,
    "aten::scatter_reduce_": _by_elements,
    "aten::gather": _by_elements,
    "aten::masked_fill_": _by_mask,
    "aten::masked_scatter_": _by_mask,
}
"""Ops whose first argument is touched only where their indices say."""


def indexed(name: str) -> bool:
    return name in _INDEXED


def indexed_span(name: str, args: tuple, kwargs: dict, nbytes: int) -> Span:
    """The span of an indexed op's first argument: what its indices name, else its whole view."""
    with unobserved(), torch._C.DisableTorchFunction():
        try:
            found = _INDEXED[name](args, kwargs)
        except (RuntimeError, IndexError, TypeError, ValueError):
            found = None  # an op torch itself rejects: its whole view, as any op's
        if found is None:
            return view_span(args[0], nbytes)
    return found
