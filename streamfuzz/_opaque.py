"""``opaque()``: say what work the checker cannot see reads and writes.

The model is ThreadSanitizer's ``ANNOTATE_*`` macros and the CUDA sanitizer's
argument schema: the program states the accesses, the checker orders them as
it orders any op. Valid inside ``checked()`` and in fuzz targets, on CPU and
CUDA; with no checker active it does nothing.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from streamfuzz.fuzz.annotations import describe
from streamfuzz.fuzz.errors import BadInput

F = TypeVar("F", bound=Callable[..., Any])


class opaque:  # noqa: N801 - used as a function and a decorator, like contextlib's
    """Opaque work enqueued on ``stream`` (default: the current one; ``"host"``
    for the host itself) that reads ``reads`` and writes ``writes``.

    As a context manager, the tensors themselves; the work counts as enqueued
    when the block starts::

        with streamfuzz.opaque(reads=[src], writes=[dst], label="cuMemcpyAsync"):
            libcuda.cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, stream)

    As a decorator, the names of the function's tensor parameters (a
    parameter holding a list or tuple of tensors counts each)::

        @streamfuzz.opaque(reads=["x"], writes=["out"])
        def launch_my_kernel(x, out, n): ...
    """

    __module__ = "streamfuzz"

    def __init__(self, reads: Iterable[Any] = (), writes: Iterable[Any] = (), *,
                 stream: Any = None, label: str | None = None) -> None:
        if isinstance(reads, (str, torch.Tensor)) or isinstance(writes, (str, torch.Tensor)):
            raise BadInput("opaque(): reads and writes are lists (of tensors, or of "
                           "parameter names for the decorator form)")
        self.reads, self.writes = list(reads), list(writes)
        if isinstance(stream, str) and stream != "host":
            raise BadInput(f"opaque(): stream={stream!r}: give a stream, None (the current "
                           f"stream) or 'host'")
        self.stream = stream
        self.label = label

    def __enter__(self) -> opaque:
        for name, given in (("reads", self.reads), ("writes", self.writes)):
            bad = [x for x in given if not isinstance(x, torch.Tensor)]
            if bad:
                raise BadInput(f"opaque(): {name} holds {type(bad[0]).__name__}, not a tensor "
                               f"(parameter names are for the decorator form)")
        _check_host(self.reads + self.writes, self.stream, self.label or "opaque work")
        describe(self.reads, self.writes, self.label or "opaque work", self.stream)
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, fn: F) -> F:
        signature = inspect.signature(fn)
        names = [*self.reads, *self.writes]
        unknown = [n for n in names if not isinstance(n, str) or n not in signature.parameters]
        if unknown:
            raise BadInput(f"opaque(): {fn.__qualname__} has no parameter "
                           f"{', '.join(map(repr, unknown))}; name its tensor parameters")
        label = self.label or fn.__qualname__

        @functools.wraps(fn)
        def launch(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            reads = _tensors(bound.arguments[n] for n in self.reads)
            writes = _tensors(bound.arguments[n] for n in self.writes)
            _check_host(reads + writes, self.stream, label)
            describe(reads, writes, label, self.stream)
            return fn(*args, **kwargs)
        return launch  # type: ignore[return-value]


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


def _check_host(tensors: list[torch.Tensor], stream: Any, label: str) -> None:
    """``stream="host"`` with device memory is the caller's mistake, said as one: work
    that reaches device memory without a kernel (an RDMA write, a peer's copy) is
    still ordered by a stream, the one it is issued or waited on."""
    if stream != "host":
        return
    from streamfuzz.fuzz import streams
    from streamfuzz.fuzz.tensors import DEVICE

    memory = getattr(streams.running(), "memory", None)
    for t in tensors:
        on_device = memory.key_kind(t)[1] == DEVICE if memory is not None else t.is_cuda
        if on_device:
            raise BadInput(f"opaque(): {label}: stream='host' with device memory; the host "
                           f"cannot touch it directly: give the stream the work is issued on "
                           f"or waited for (an RDMA write: the stream that waits for its "
                           f"completion)")
