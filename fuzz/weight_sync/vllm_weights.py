"""vLLM's own packed NCCL weight broadcast as a weight-sync target.

``vllm/distributed/weight_transfer/packed_tensor.py`` is read from the same
vLLM source the draft-broadcast family uses (``streamfuzz.fuzz.upstream``: a wheel, an
sdist, a tree or an installed ``vllm``) and compiled unchanged; it imports
only torch. Group rank 0 calls ``packed_nccl_broadcast_producer`` exactly as
``NCCLWeightTransferEngine._broadcast`` does (``post_iter_func`` returns the
tensor); the other ranks call ``packed_nccl_broadcast_consumer`` as
``receive_weights`` does, with the harness's post-unpack callback in place of
``model.load_weights``. The module is executed afresh for every example: its
buffer streams are cached per module (``_get_streams``), and each example
has its own streams.
"""

from __future__ import annotations

import functools
import hashlib
import linecache
import types
from typing import Any

from streamfuzz.fuzz import upstream
from streamfuzz.fuzz.weight_sync.group import WeightSyncContext

FILE = "vllm/distributed/weight_transfer/packed_tensor.py"


class _Source:
    def __init__(self, up: Any, text: str) -> None:
        self.up = up
        self.text = text
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        self.filename = f"vllm-{up.version}/{FILE}"
        linecache.cache[self.filename] = (len(text), None, text.splitlines(keepends=True),
                                          self.filename)
        self.code = compile(text, self.filename, "exec", dont_inherit=True)

    def provenance(self) -> dict[str, Any]:
        return {"project": "vllm", "version": self.up.version, "file": FILE,
                "sha256": self.sha256, "from": self.up.kind, "edit": None}

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("_streamfuzz_upstream.packed_tensor")
        mod.__file__ = self.filename
        exec(self.code, mod.__dict__)
        return mod


@functools.lru_cache(maxsize=8)
def source(version: str | None) -> _Source:
    """vLLM ``version``'s file (None: the installed vllm); raises UpstreamError."""
    up = upstream.find(version) if version else upstream.resolve(None)
    return _Source(up, upstream.read_file(up, FILE))


def provenance(version: str | None) -> dict[str, Any]:
    return source(version).provenance()


class _Handler:
    def __init__(self, ctx: WeightSyncContext, mod: types.ModuleType) -> None:
        self.ctx = ctx
        self.mod = mod

    def send(self, named: Any) -> None:
        self.mod.packed_nccl_broadcast_producer(
            iterator=named, group=self.ctx.group, src=0, post_iter_func=lambda item: item[1],
            buffer_size_bytes=self.ctx.buffer_bytes, num_buffers=self.ctx.num_buffers)

    def receive(self, meta: Any, load: Any) -> None:
        self.mod.packed_nccl_broadcast_consumer(
            iterator=meta, group=self.ctx.group, src=0, post_unpack_func=load,
            buffer_size_bytes=self.ctx.buffer_bytes, num_buffers=self.ctx.num_buffers,
            device=self.ctx.device)


def factory(version: str | None) -> Any:
    src = source(version)

    def make(ctx: WeightSyncContext) -> _Handler:
        return _Handler(ctx, src.module())

    make.protocol = "weight-sync"  # type: ignore[attr-defined]
    return make
