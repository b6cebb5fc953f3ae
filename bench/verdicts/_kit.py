"""What the verdict harnesses share: the release, its fixed twin, and C kernels described.

A verdict harness loads the release's own file at run time (never a copy in
this repository). Its fixed twin is the same release with one minimal edit
applied to a copy of that file's text, loaded the same way, so that the twin
differs from the release by that edit only.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch

import streamfuzz
from streamfuzz.fuzz.scan.sources import open_source
from streamfuzz.standins import Loaded, load

_CACHE = Path(os.environ.get("STREAMFUZZ_SCAN_WHEELS",
                             Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                             / "streamfuzz" / "scan"))


def wheel(prefix: str) -> str:
    """The wheel ``prefix*.whl``, else the sdist ``prefix.tar.gz``, in the download cache
    (``pip download NAME==X --no-deps``: a release with no wheel comes as its sdist)."""
    found = sorted(_CACHE.glob(prefix + "*.whl")) or sorted(_CACHE.glob(prefix + ".tar.gz"))
    if not found:
        raise SystemExit(f"no {prefix}*.whl or {prefix}.tar.gz in {_CACHE}: "
                         "pip download the release there")
    return str(found[0])


def release(prefix: str, file: str) -> Loaded:
    """``file`` of the release, run as a module, unchanged."""
    return load(wheel(prefix), file)


def twin(prefix: str, file: str, old: str, new: str) -> Loaded:
    """``file`` of the release with ``old`` replaced by ``new`` once: the fixed twin."""
    root = Path(tempfile.mkdtemp(prefix="twin-"))
    for f in open_source(wheel(prefix)).files():  # as the release loads: an sdist's top dir off
        (root / f.path).parent.mkdir(parents=True, exist_ok=True)
        (root / f.path).write_text(f.text)
    path = root / file
    text = path.read_text()
    if text.count(old) != 1:
        raise AssertionError(f"the fix's anchor is not once in {file}: {old!r}")
    path.write_text(text.replace(old, new))
    return load(str(root), file)


def kernel(reads: list[Any], writes: list[Any], label: str) -> None:
    """A C kernel of the package, described by what it reads and writes on the current stream."""
    with streamfuzz.opaque(reads=[t for t in reads if t is not None],
                           writes=[t for t in writes if t is not None], label=label):
        pass


def p2p_op(op: str, tensor: Any, peer: int, group: Any = None) -> Obj:
    """``dist.P2POp`` as the described ``batch_isend_irecv`` reads it (``op``: isend, irecv)."""
    return Obj(op=op, tensor=tensor)


def batch_isend_irecv(stream: Any) -> Callable[[list[Any]], list[Obj]]:
    """``dist.batch_isend_irecv`` as ProcessGroupNCCL orders it: the group's stream
    (``stream``) waits for the caller's, runs one kernel reading the sends and writing
    the receives, and each request's ``wait`` makes the then current stream wait for it."""

    def run(ops: list[Any]) -> list[Obj]:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernel([op.tensor for op in ops if op.op == "isend"],
                   [op.tensor for op in ops if op.op == "irecv"], "nccl_send_recv")
            done = torch.cuda.Event()
            done.record()
        return [Obj(wait=lambda: torch.cuda.current_stream().wait_event(done))]

    return run


def findings(run: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """``run(*args, **kwargs)`` in one collecting checked block: its findings, as text."""
    with streamfuzz.checked(collect=True) as check:
        run(*args, **kwargs)
    return [str(f) for f in check.findings]


def feed(gen: Generator[Any, Any, Any], items: list[Any]) -> None:
    """Prime a consumer generator, send it each item, then run it out (a layerwise load)."""
    next(gen)
    for item in items:
        gen.send(item)
    for _ in gen:
        pass


class Obj:
    """A duck-typed object: the attributes the engine's code reads."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class _AsCuda:
    """``torch`` with ``torch.<device>`` answered by ``torch.cuda``."""

    def __init__(self, torch_module: Any, device: str) -> None:
        self._torch = torch_module
        self._device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, "cuda" if name == self._device else name)


def as_cuda(module: Any, device: str) -> None:
    """Run a module's ``torch.xpu`` (``torch.musa``) streams and events as the checked CUDA ones."""
    module.torch = _AsCuda(module.torch, device)


def dense_batch_class(base: type) -> type:
    """A batch of one dense tensor, derived from a package's batch base class (torchrec's
    ``Pipelineable``): the ``to`` and ``record_stream`` its pipelines call, and no more."""

    class _Batch(base):  # type: ignore[valid-type, misc]
        def __init__(self, dense: Any) -> None:
            self.dense = dense

        def to(self, device: Any, non_blocking: bool, data_copy_stream: Any = None) -> Any:
            return _Batch(self.dense.to(device, non_blocking=non_blocking))

        def record_stream(self, stream: Any) -> None:
            self.dense.record_stream(stream)

    return _Batch
