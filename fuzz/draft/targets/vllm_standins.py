"""Stand-ins for the vLLM modules that ``pp_utils.py`` imports: all of them, here.

vLLM's file runs unchanged; only its ``import vllm...`` statements are answered
from this module (through the ``__import__`` of the module's own builtins, so
``sys.modules`` and an installed vllm are left alone). Each stand-in is the
least that ``PPHandler`` touches:

* ``vllm.envs``: ``VLLM_XPU_PP_MICROBATCH`` (read only on XPU).
* ``vllm.distributed.parallel_state.get_pp_group()``: the pipeline group of
  this rank's real ``torch.distributed`` world: ``rank_in_group``,
  ``last_rank``, ``is_last_rank``; ``world_size`` is the pipeline depth of the
  scenario (``PPHandler`` sizes its ring of in-flight steps by it);
  ``make_sibling_device_group()`` returns the rank's real process group.
* ``vllm.platforms.current_platform``: ``is_xpu()`` is False.
* ``vllm.sequence.IntermediateTensors``: a type in signatures (the hidden-state
  relay is not fuzzed; building one raises).
* ``vllm.utils.torch_utils.async_tensor_h2d``: a pinned host tensor copied to
  the device with ``non_blocking=True`` on the current stream, as vLLM does.
* ``vllm.v1.worker.gpu.input_batch.InputBatch``: the fields ``PPHandler``
  reads; ``streamfuzz.fuzz.draft.targets.vllm_pp`` fills them the way vLLM's runner does.

Any other ``vllm`` import raises ImportError naming it.
"""

from __future__ import annotations

import builtins as _builtins
import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from streamfuzz.fuzz.draft.context import TargetContext


@dataclass
class InputBatch:
    """What ``PPHandler`` reads of vLLM's ``InputBatch`` (same names, same types)."""

    num_reqs: int
    idx_mapping: torch.Tensor
    idx_mapping_np: np.ndarray
    num_scheduled_tokens: np.ndarray
    num_computed_tokens_np: np.ndarray
    prefill_len_np: np.ndarray
    is_prefilling_np: np.ndarray
    max_seq_len_np: np.ndarray | None
    num_draft_tokens: int


class _PPGroup:
    """The pipeline group as ``PPHandler`` asks for it, answered from the real world."""

    def __init__(self, ctx: TargetContext) -> None:
        self._ctx = ctx
        self.rank_in_group = ctx.rank
        self.last_rank = ctx.last_rank
        self.is_last_rank = ctx.rank == ctx.last_rank
        self.world_size = ctx.pipeline_depth

    def make_sibling_device_group(self, group_desc: str | None = None) -> Any:
        return self._ctx.group


_GROUP: _PPGroup | None = None


@contextlib.contextmanager
def pp_group(ctx: TargetContext) -> Iterator[None]:
    """``get_pp_group()`` answers for ``ctx`` while a handler is being made."""
    global _GROUP
    before, _GROUP = _GROUP, _PPGroup(ctx)
    try:
        yield
    finally:
        _GROUP = before


def get_pp_group() -> _PPGroup:
    if _GROUP is None:
        raise RuntimeError("get_pp_group() outside a handler's construction")
    return _GROUP


class _Platform:
    @staticmethod
    def is_xpu() -> bool:
        return False


class IntermediateTensors:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("the hidden-state relay of PPHandler is not fuzzed")


def async_tensor_h2d(data: Any, device: str | torch.device | None = None,
                     dtype: torch.dtype | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """A fresh host tensor of ``data``, pinned and copied without blocking to ``device``."""
    if dtype is None and out is not None:
        dtype = out.dtype
    host = torch.tensor(np.asarray(data), dtype=dtype)
    target = torch.device(device) if device is not None else host.device
    if target.type != "cpu":
        host = host.pin_memory()
    if out is not None:
        return out.copy_(host, non_blocking=True)
    return host.to(target, non_blocking=True) if target.type != "cpu" else host


def _modules() -> dict[str, types.ModuleType]:
    def mod(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(
            name, "streamfuzz stand-in (streamfuzz.fuzz.draft.targets.vllm_standins)")
        m.__dict__.update(attrs)
        return m

    found = {
        "vllm.envs": mod("vllm.envs", VLLM_XPU_PP_MICROBATCH=False),
        "vllm.distributed.parallel_state": mod("vllm.distributed.parallel_state",
                                               get_pp_group=get_pp_group),
        "vllm.platforms": mod("vllm.platforms", current_platform=_Platform()),
        "vllm.sequence": mod("vllm.sequence", IntermediateTensors=IntermediateTensors),
        "vllm.utils.torch_utils": mod("vllm.utils.torch_utils",
                                      async_tensor_h2d=async_tensor_h2d),
        "vllm.v1.worker.gpu.input_batch": mod("vllm.v1.worker.gpu.input_batch",
                                              InputBatch=InputBatch),
    }
    # The packages above them, each holding its children as attributes.
    for name in list(found):
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            parent, child = ".".join(parts[:i]), ".".join(parts[:i + 1])
            found.setdefault(parent, mod(parent))
            setattr(found[parent], parts[i], found[child])
    return found


MODULES = _modules()
"""Every stood-in module by its vLLM name."""


def _import(name: str, globals: Any = None, locals: Any = None,  # noqa: A002
            fromlist: Any = (), level: int = 0) -> Any:
    if level == 0 and (name == "vllm" or name.startswith("vllm.")):
        if name not in MODULES:
            raise ImportError(f"streamfuzz stands in for vLLM's imports of PPHandler only, "
                              f"not {name} (see fuzz/draft/targets/vllm_standins.py)")
        return MODULES[name] if fromlist else MODULES["vllm"]
    return _builtins.__import__(name, globals, locals, fromlist, level)


def builtins() -> dict[str, Any]:
    """The builtins for vLLM's module: Python's, with vLLM's imports answered here."""
    return {**_builtins.__dict__, "__import__": _import}
