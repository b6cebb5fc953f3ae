"""What every rank must hold after each sync, computed on the CPU from the scenario.

Values are small integers in (sync, parameter, element), exact in every
parameter dtype: ``((sync + 2) * 37 + index * 11 + element) % 127``; sync -1
is the value a parameter starts with. A stale element therefore reads as the
previous write's value, and the oracle says how many elements were stale.
"""

from __future__ import annotations

from typing import Any

import torch

from streamfuzz.fuzz.verdict import Failure
from streamfuzz.fuzz.weight_sync import WeightSyncObservations
from streamfuzz.fuzz.weight_sync.scenario import Param, WeightSyncScenario

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16, "int32": torch.int32, "uint8": torch.uint8}


def values(sync: int, index: int, param: Param, device: Any = "cpu") -> torch.Tensor:
    """Parameter ``index``'s values as written by sync ``sync`` (-1: initial)."""
    base = (sync + 2) * 37 + index * 11
    flat = torch.remainder(torch.arange(param.numel, dtype=torch.int64, device=device) + base, 127)
    return flat.to(TORCH_DTYPES[param.dtype]).view(param.shape)


def last_write(scenario: WeightSyncScenario, sync: int, index: int) -> int:
    """The sync whose optimizer step last wrote ``index`` up to ``sync`` (-1: none)."""
    for s in range(sync, -1, -1):
        if index in scenario.syncs[s].writes:
            return s
    return -1


def expected(scenario: WeightSyncScenario, sync: int) -> list[torch.Tensor]:
    """Every parameter's values at the moment of sync ``sync``'s call."""
    return [values(last_write(scenario, sync, i), i, p) for i, p in enumerate(scenario.params)]


def check(scenario: WeightSyncScenario,
          observations: list[WeightSyncObservations]) -> list[Failure]:
    """Rank 0's sent bytes, then every consumer's parameters, against the reference."""
    failures: list[Failure] = []
    for obs in sorted(observations, key=lambda o: o.rank):
        rank = obs.rank
        if rank == 0:
            failures += _check_sent(scenario, obs.sent, rank)
        else:
            failures += _check_received(scenario, obs.received, rank)
    return failures


def _check_sent(scenario: WeightSyncScenario, sent: list, rank: int) -> list[Failure]:
    got_syncs = [s for s, _ in sent]
    if got_syncs != list(range(len(scenario.syncs))):
        return [Failure("value", f"rank {rank} sent on syncs {got_syncs}, expected "
                                 f"{list(range(len(scenario.syncs)))}", rank)]
    for s, data in sent:
        want = expected(scenario, s)
        nbytes = sum(p.nbytes for p in scenario.params)
        if len(data) != nbytes:
            return [Failure("value", f"sync {s}: rank {rank} sent {len(data)} bytes, "
                                     f"expected {nbytes}", rank, s)]
        got, at = [], 0
        for p in scenario.params:
            got.append(_tensor(data[at:at + p.nbytes], p))
            at += p.nbytes
        diff = _diff(scenario, s, want, got)
        if diff:
            return [Failure("value", f"sync {s}: rank {rank} sent wrong bytes: {diff}", rank, s)]
    return []


def _check_received(scenario: WeightSyncScenario, received: list, rank: int) -> list[Failure]:
    got_syncs = [s for s, _ in received]
    if got_syncs != list(range(len(scenario.syncs))):
        return [Failure("value", f"rank {rank} received on syncs {got_syncs}, expected "
                                 f"{list(range(len(scenario.syncs)))}", rank)]
    for s, params in received:
        got = [_tensor(b, p) for b, p in zip(params, scenario.params)]
        diff = _diff(scenario, s, expected(scenario, s), got)
        if diff:
            return [Failure("value", f"sync {s}: rank {rank} parameters wrong after the "
                                     f"sync: {diff}", rank, s)]
    return []


def _tensor(data: bytes, p: Param) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
        torch.empty(0, dtype=torch.uint8)
    return raw.view(TORCH_DTYPES[p.dtype]).view(p.shape)


def _diff(scenario: WeightSyncScenario, sync: int, want: list[torch.Tensor],
          got: list[torch.Tensor]) -> str:
    parts = []
    for i, (p, w, g) in enumerate(zip(scenario.params, want, got)):
        bad = (w != g).reshape(-1)
        n = int(bad.sum())
        if not n:
            continue
        prev = values(last_write(scenario, sync - 1, i), i, p) if sync > 0 else \
            values(-1, i, p)
        stale = int(((g == prev).reshape(-1) & bad).sum()) if last_write(
            scenario, sync, i) != last_write(scenario, sync - 1, i) or sync == 0 else 0
        what = f"{stale} stale (the value before this sync's write)" if stale else "not stale"
        first = int(bad.nonzero()[0])
        parts.append(f"p{i} ({p.dtype}{list(p.shape)}): {n} of {p.numel} elements differ, "
                     f"{what}; first at {first}: expected {w.reshape(-1)[first].item()} "
                     f"got {g.reshape(-1)[first].item()}")
    return "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
