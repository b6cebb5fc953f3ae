"""vLLM's own ``PPHandler``, driven the way vLLM's model runner drives it.

The runner side is modelled on ``vllm/v1/worker/gpu/model_runner.py`` of vLLM
0.32.0 (for the 0.30-0.32 API) and 0.34.0 (for 0.33-0.34). Per step, on every
rank:

1. ``execute_model`` starts with ``update_pp_decode_requests``: the handler's
   ``get_prev_sampled_outputs`` hands back the entry received pipeline-depth
   steps ago, after making the main stream wait for its event. In 0.32 it
   also scatters the received drafts into the draft table it is given; in
   0.34 the runner's ``postprocess_sampled`` does that on the main stream,
   skipping rows whose index came back as -1.
2. The step's ``InputBatch`` is built; its ``idx_mapping`` is a fresh device
   copy (the harness makes it, as the runner does).
3. ``sample_tokens``: the last rank calls ``broadcast`` (sampled tokens and
   counts), the drafter writes the draft table (the harness's drafter; it runs
   just before this call, an order the handler cannot tell apart: ``broadcast``
   and ``broadcast_drafts`` both wait for the main stream first), then
   ``broadcast_drafts``: 0.32 passes the table and the batch and the handler
   gathers on its stream; 0.34 gathers ``table[idx_mapping]`` on the main
   stream and passes the rows. Other ranks call ``receive`` (0.34 with
   ``recv_drafts=True``: drafts are proposed every step here).
4. The runner drops the batch.

A request's prefill state is what ``Batch.final`` says: a final request is a
decode (prefill done, ``1 + num_spec_steps`` tokens scheduled); a non-final one
is the first half of a prefill. vLLM does not apply drafts of non-final
chunks on the other ranks (``applies_non_final = False`` tells the reference).
"""

from __future__ import annotations

import types
from collections import deque
from typing import Any

import numpy as np
import torch

from streamfuzz.fuzz import upstream
from streamfuzz.fuzz.dispatch_mode import DispatchMode
from streamfuzz.fuzz.draft.context import Batch, TargetContext
from streamfuzz.fuzz.draft.targets import vllm_standins

_PROMPT = 8
"""Prompt length of every request: a non-final chunk schedules half of it."""


class _Sent(DispatchMode):
    """Catches the tensor of the last broadcast issued while it is active:
    what the handler sent, which vLLM keeps to itself."""

    def __init__(self) -> None:
        super().__init__()
        self.tensor: torch.Tensor | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func._schema.name == "c10d::broadcast_":
            self.tensor = args[0][0]
        return func(*args, **kwargs)


class VllmRunner:
    """The harness's handler API (``streamfuzz.fuzz.targets``) over vLLM's ``PPHandler``."""

    applies_non_final = False

    def __init__(self, ctx: TargetContext, up: upstream.Upstream,
                 code: types.ModuleType | None = None) -> None:
        self.ctx = ctx
        self.gathered = up.api == "gathered"
        with vllm_standins.pp_group(ctx):
            self.handler = (code or upstream.module(up)).PPHandler(
                max_num_reqs=ctx.max_num_reqs, num_speculative_steps=ctx.num_spec_steps,
                device=ctx.device)
        self.polled = 0  # steps whose get_prev_sampled_outputs has run
        self.ready: deque[dict[str, Any]] = deque()
        self.table: torch.Tensor | None = None

    # -- every rank, start of a step -------------------------------------------
    def _poll(self) -> None:
        """``update_pp_decode_requests`` of one step."""
        if self.gathered:
            out = self.handler.get_prev_sampled_outputs()
        else:
            out = self.handler.get_prev_sampled_outputs(self.table)
        self.polled += 1
        if out is not None:
            if self.table is None:
                raise RuntimeError("PPHandler handed back a step before any was due")
            if self.gathered and out.get("draft_tokens") is not None:
                _scatter_kept(self.table, out["idx_mapping"], out["draft_tokens"])
            self.ready.append(out)

    def _catch_up(self, step: int) -> None:
        while self.polled <= step:
            self._poll()

    # -- last rank -----------------------------------------------------------
    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        self.table = draft_table
        self._catch_up(batch.step)
        ib = _input_batch(batch, self.ctx.num_spec_steps)
        self.handler.broadcast(batch.sampled_tokens, batch.num_sampled, batch.num_rejected, ib)
        with _Sent() as sent:
            if self.gathered:
                self.handler.broadcast_drafts(draft_table[ib.idx_mapping])
            else:
                self.handler.broadcast_drafts(draft_table, ib)
        return sent.tensor

    # -- other ranks -----------------------------------------------------------
    def receive_drafts(self, batch: Batch) -> None:
        self._catch_up(batch.step)
        ib = _input_batch(batch, self.ctx.num_spec_steps)
        if self.gathered:
            self.handler.receive(ib, recv_drafts=True)
        else:
            self.handler.receive(ib)

    def apply_received(self, draft_table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.table = draft_table
        # One step's poll at a time, as steps (or, after the last, idle steps) pass.
        for _ in range(self.ctx.pipeline_depth + 1):
            if self.ready:
                break
            self._poll()
        if not self.ready:
            raise RuntimeError("PPHandler handed back nothing pipeline-depth steps after a "
                               "step that broadcast")
        out = self.ready.popleft()
        return out["sampled_tokens"], out["num_sampled"], out["num_rejected"]


def _input_batch(batch: Batch, k: int) -> vllm_standins.InputBatch:
    n = batch.num_reqs
    final = np.array(batch.final, dtype=bool)
    prefilling = ~final
    return vllm_standins.InputBatch(
        num_reqs=n, idx_mapping=batch.idx_mapping,
        idx_mapping_np=np.array(batch.host_idx_mapping, dtype=np.intp),
        num_scheduled_tokens=np.where(final, 1 + k, _PROMPT // 2).astype(np.int32),
        num_computed_tokens_np=np.where(final, _PROMPT, 0).astype(np.int32),
        prefill_len_np=np.full(n, _PROMPT, dtype=np.int32),
        is_prefilling_np=prefilling,
        # The runner passes a length cap only when the batch holds a prefill.
        max_seq_len_np=np.full(n, 4 * _PROMPT, dtype=np.int32) if prefilling.any() else None,
        num_draft_tokens=n * k)


def _scatter_kept(table: torch.Tensor, idx: torch.Tensor, drafts: torch.Tensor) -> None:
    """0.34's ``postprocess_sampled`` for drafts: rows at ``idx``, -1 skipped, on main.

    Without a host sync (vLLM does it in a kernel): skipped rows go to a
    scratch row past the table's end.
    """
    scratch = torch.cat([table, table.new_zeros((1, table.shape[1]))])
    rows = torch.where(idx >= 0, idx, scratch.shape[0] - 1)
    scratch[rows] = drafts
    table.copy_(scratch[:-1])


def factory(up: upstream.Upstream, code: types.ModuleType | None = None) -> Any:
    """The target factory for ``up`` (``streamfuzz.fuzz.targets.load`` calls this); ``code``
    is an edited copy of ``up``'s module to drive instead (a ``mutate`` mutant)."""

    def make(ctx: TargetContext) -> VllmRunner:
        return VllmRunner(ctx, up, code)

    make.upstream = up  # type: ignore[attr-defined]
    return make
