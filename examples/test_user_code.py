"""Checked tests of plain torch.cuda stream code: ``pytest examples/test_user_code.py``.

The code under test is a pipeline rank sending each step's draft rows to the
next rank on a side stream while the main stream goes on. It knows nothing of
streamfuzz. Without a GPU the checked blocks run it on simulated CUDA streams;
with one, on real streams (``--streamfuzz-device`` chooses).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import streamfuzz

SLOTS = 64  # request slots in the draft table
K = 3       # draft tokens per request

# Each step schedules some distinct request slots (batch row -> slot).
batches = st.lists(st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=16, unique=True),
                   min_size=1, max_size=4)


class MainGather:
    """Gathers the rows on main, broadcasts them on a side stream: a correct overlap."""

    def __init__(self) -> None:
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()

    def send(self, draft_table: torch.Tensor, idx_mapping: torch.Tensor) -> torch.Tensor:
        rows = draft_table[idx_mapping]
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            dist.broadcast(rows, src=0)
            rows.record_stream(self.side)  # made on main, used on side
        return rows


class PrePR:
    """Before vLLM PR 55745: the side stream gathers with ``idx_mapping`` and
    nothing records it there, so its block can be reused while the gather waits."""

    def __init__(self) -> None:
        self.main = torch.cuda.current_stream()
        self.side = torch.cuda.Stream()

    def send(self, draft_table: torch.Tensor, idx_mapping: torch.Tensor) -> torch.Tensor:
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            rows = draft_table[idx_mapping].contiguous()
            dist.broadcast(rows, src=0)
            rows.record_stream(self.side)
        return rows


def run_steps(sender: MainGather | PrePR, steps: list[list[int]],
              check: streamfuzz.Check | None = None) -> list[list[list[int]]]:
    """What a model runner does around the sender, one step at a time."""
    main = torch.cuda.current_stream()
    table = torch.zeros((SLOTS, K), dtype=torch.int64, device="cuda")
    pos = torch.arange(K, device="cuda")
    sent = []
    for step, slots in enumerate(steps):
        idx_mapping = torch.tensor(slots).pin_memory().to("cuda", non_blocking=True)
        if check is not None:
            check.name(idx_mapping, "idx_mapping")
        table[idx_mapping] = (step + 1) * 1000 + idx_mapping.unsqueeze(1) * K + pos  # drafter
        sent.append(sender.send(table, idx_mapping))
        del idx_mapping  # the runner keeps no reference once the step is sent
        main.wait_stream(sender.side)  # the next step's drafter rewrites the table
    torch.cuda.synchronize()
    return [rows.cpu().tolist() for rows in sent]


@pytest.mark.streamfuzz
@settings(deadline=None)
@given(steps=batches)
def test_main_gather_overlap_is_clean(steps: list[list[int]]) -> None:
    sent = run_steps(MainGather(), steps)
    for step, (slots, rows) in enumerate(zip(steps, sent)):
        assert rows == [[(step + 1) * 1000 + s * K + p for p in range(K)] for s in slots]


@pytest.mark.xfail(raises=streamfuzz.StreamfuzzError, strict=True,
                   reason="pre-PR 55745: idx_mapping freed while the side stream reads it")
@settings(deadline=None)
@given(steps=batches)
def test_pre_pr_broadcast(steps: list[list[int]]) -> None:
    try:
        with streamfuzz.checked() as check:
            run_steps(PrePR(), steps, check)
    except streamfuzz.StreamfuzzError as err:
        # One finding per step, each the same: nothing else is wrong with this code.
        for finding in err.findings:
            assert finding.kind == "lifetime", err
            assert finding.message.startswith("idx_mapping (int64["), err
            assert "was freed while stream side" in finding.message, err
            assert "test_user_code.py:" in finding.message, err  # the user's own frames
        raise
