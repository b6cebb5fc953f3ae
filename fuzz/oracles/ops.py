"""What an aten or c10d op does to its arguments, read from its schema once.

The lifetime oracle sees every op: which arguments it reads and writes, which
can hold a tensor at all, whether it touches data or only metadata, whether
the host waits for it. Each op overload's schema is read once and kept.
"""

from __future__ import annotations

from typing import Any

import torch

from streamfuzz.fuzz.tensors import tensors_in

# Ops that make the host wait for the current stream (a blocking copy to the host).
HOST_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::equal",
                            "aten::is_nonzero", "aten::masked_select", "aten::unique_dim",
                            "aten::_unique2"})
# Ops that read a tensor's metadata, never its data: no access, like a view.
# ``set_`` points a tensor at another storage (or none): metadata only too,
# though its schema marks the tensor written.
METADATA_OPS = frozenset({"aten::is_pinned", "aten::sym_size", "aten::sym_stride",
                           "aten::sym_numel", "aten::sym_storage_offset", "aten::size",
                           "aten::stride", "aten::dim", "aten::numel", "aten::is_contiguous",
                           "aten::is_same_size", "aten::storage_offset", "aten::set_"})
# Ops that make a new tensor like their tensor argument: they read its shape,
# dtype and device, never its data.
LIKE_OPS = frozenset({"aten::new_empty", "aten::new_empty_strided", "aten::new_zeros",
                      "aten::new_ones", "aten::new_full", "aten::empty_like",
                      "aten::zeros_like", "aten::ones_like", "aten::full_like",
                      "aten::rand_like", "aten::randn_like", "aten::randint_like"})
COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::_copy_from",
                       "aten::_copy_from_and_resize"})
RECEIVES = frozenset({"c10d::recv_", "c10d::recv_any_source_"})
REDUCTIONS = frozenset({"c10d::reduce_"})
"""c10d ops whose schemas mark no argument written, though they write the
program's tensors: a receive's, and a reduction's on its root."""
"""The most accesses a storage keeps per stream and kind (older ones merge: more
overlap, never less)."""
ALLOC_OPS = frozenset({"aten::empty", "aten::empty_strided", "aten::new_empty",
                        "aten::new_empty_strided", "aten::empty_like", "aten::empty_permuted"})


_NO_TENSORS: tuple = ()


def result_tensors(x: Any) -> Any:
    """``tensors_in`` for the hot path: a tensor or a non-sequence without a list."""
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tensors_in(x)
    return _NO_TENSORS


_NO_TENSOR_TYPES = frozenset({"int", "SymInt", "bool", "number", "float", "complex", "str",
                               "Device", "Generator", "Layout", "ScalarType", "MemoryFormat",
                               "AnyEnumType", "Storage"})
"""Schema argument types that never hold a tensor (after Optional[...] and List[...])."""
ONE, MANY = 0, 1
"""How an argument holds tensors: one (``Tensor``, ``Tensor?``), or any number
(a list, or a type the schema does not pin down), found by ``tensors_in``."""


def _holds(type_name: str) -> int | None:
    base = type_name
    while base.startswith(("Optional[", "List[")):
        base = base[base.index("[") + 1:-1]
    if base in _NO_TENSOR_TYPES:
        return None
    return ONE if type_name in ("Tensor", "Optional[Tensor]") else MANY


OpInfo = tuple[str, str, tuple[str, ...], tuple[bool, ...], bool, bool,
                tuple[tuple[int, str, bool, int], ...]]
_OPS: dict[Any, OpInfo] = {}
"""Per op overload, read from its schema once: (schema name, label, argument
names, which arguments it writes, whether it touches no data: every result
a view, or metadata only, whether it is a collective, and the arguments that
can hold a tensor: (position, name, written, ``ONE`` or ``MANY``)). An op's
sizes, scalars and options are never searched for tensors."""


def op_info(func: Any) -> OpInfo:
    info = _OPS.get(func)
    if info is None:
        schema = func._schema
        views = [r.alias_info is not None and not r.alias_info.is_write for r in schema.returns]
        writes = tuple(a.alias_info is not None and a.alias_info.is_write
                       for a in schema.arguments)
        slots = () if schema.name in LIKE_OPS else tuple(
            (i, a.name, writes[i], holds) for i, a in enumerate(schema.arguments)
            if (holds := _holds(str(a.type))) is not None)
        info = _OPS[func] = (
            schema.name, str(func).replace(".default", ""),
            tuple(a.name for a in schema.arguments), writes,
            bool(views) and all(views) or schema.name in METADATA_OPS,
            schema.name.startswith("c10d::"), slots)
    return info


def is_collective(func: Any) -> bool:
    """Whether an op overload is a c10d op (a collective or point-to-point call)."""
    return op_info(func)[5]
