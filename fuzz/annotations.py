"""Work the dispatcher cannot see, described by the program: the checker's input for it.

A raw Triton launch, a C++ extension's kernel, a copy through ``ctypes`` or
RDMA: no aten op reports what they touch, so the lifetime oracle would judge
the program as if they were not there. The program says what such work reads
and writes, and on which stream; the active checker (simulated streams or
CUDA's) records it as one op enqueued at that moment. With no checker active
it costs one lookup and does nothing, so the annotation can stay in
production code.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from streamfuzz.fuzz.tensors import HOST


def describe(reads: list[torch.Tensor], writes: list[torch.Tensor], label: str,
             stream: Any = None) -> None:
    """Tell the active checker, if any, about opaque work enqueued now on
    ``stream`` (None: the current stream; ``"host"``: the host itself)."""
    from streamfuzz.fuzz import streams

    on_host = isinstance(stream, str)  # "host": opaque() lets no other string through
    sim = streams.running()
    if sim is not None:
        sim.emit("opaque", reads, writes, label,
                 HOST if on_host else stream if stream is not None else sim.current_stream())
        return
    # Imported where it runs.
    lifetime_cuda = sys.modules.get("streamfuzz.fuzz.oracles.lifetime_cuda")
    if lifetime_cuda is not None and lifetime_cuda._active is not None:
        lifetime_cuda._active.describe(reads, writes, label, HOST if on_host else stream)
