"""One weight-sync example as plain values: the parameters, the buffers, the syncs.

Like the draft broadcast's scenario it holds no Hypothesis state, so a corpus
entry replays after the strategies change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.protocol.scenario import check, fields_of, plain, polls_held

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "uint8": 1}
"""Parameter dtypes and their sizes in bytes."""
HOLD_UNTIL = ("", "broadcast", "after_call")
"""How a hold ends: ``""`` a spin of ``cycles``; ``broadcast`` a gate the host
opens when the target first hands a buffer to the group; ``after_call`` a gate
the host opens when the call returns."""
CHURN_DTYPES = ("int32", "float32", "uint8")
MAX_NUMEL = 1 << 22


@dataclass(frozen=True)
class Param:
    """One parameter: its shape and dtype (its name is ``p<index>``)."""

    shape: tuple[int, ...] = (1,)
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype]


@dataclass(frozen=True)
class Hold:
    """Hold every rank's caller stream before the optimizer step (the trainer's
    writes queue behind it): a spin, or a gate opened at ``until``."""

    cycles: int = 0
    until: str = ""


@dataclass(frozen=True)
class Churn:
    """An allocation on the caller's stream right after the call, freed at once
    unless ``keep``: the trainer's next step reusing freed blocks."""

    numel: int = 1
    dtype: str = "int32"
    fill: int = 0
    keep: bool = False


@dataclass(frozen=True)
class Sync:
    """One training step: the optimizer writes ``writes`` (parameter indices),
    then every rank calls the target; ``holds`` and ``churn`` around it."""

    writes: tuple[int, ...] = ()
    holds: tuple[Hold, ...] = ()
    churn: tuple[Churn, ...] = ()

    @property
    def pending_polls(self) -> int:
        """As a draft step's (``streamfuzz.fuzz.draft.scenario.Step.pending_polls``), from its
        holds."""
        return sum(polls_held(h.cycles, h.until) for h in self.holds)


@dataclass(frozen=True)
class WeightSyncScenario:
    """A fixed world; group rank 0 produces, the others consume."""

    world_size: int = 1
    params: tuple[Param, ...] = (Param(),)
    buffer_bytes: int = 1024
    num_buffers: int = 2
    syncs: tuple[Sync, ...] = field(default_factory=lambda: (Sync(writes=(0,)),))

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_dict(cls, data: Any) -> WeightSyncScenario:
        """Build and validate; raises ScenarioError naming the bad field."""
        top = fields_of(data, cls, "scenario")
        params = tuple(_param(p, f"params[{i}]") for i, p in enumerate(top.pop("params", [])))
        syncs = []
        for i, raw in enumerate(top.pop("syncs", [])):
            s = fields_of(raw, Sync, f"syncs[{i}]")
            syncs.append(Sync(
                writes=tuple(s.get("writes", ())),
                holds=tuple(Hold(**fields_of(h, Hold, f"syncs[{i}].holds[{j}]"))
                            for j, h in enumerate(s.get("holds", ()))),
                churn=tuple(Churn(**fields_of(c, Churn, f"syncs[{i}].churn[{j}]"))
                            for j, c in enumerate(s.get("churn", ())))))
        scenario = cls(**top, params=params, syncs=tuple(syncs))
        scenario.validate()
        return scenario

    def validate(self) -> None:
        check(isinstance(self.world_size, int) and self.world_size >= 1,
               "world_size must be >= 1")
        check(1 <= len(self.params) <= 64, "params must hold 1..64 parameters")
        for i, p in enumerate(self.params):
            check(p.dtype in DTYPES, f"params[{i}].dtype must be one of {tuple(DTYPES)}")
            check(1 <= len(p.shape) <= 3 and all(isinstance(d, int) and d >= 1
                                                  for d in p.shape),
                   f"params[{i}].shape must be 1..3 positive sizes")
            check(p.numel <= MAX_NUMEL, f"params[{i}] must have at most {MAX_NUMEL} elements")
        check(isinstance(self.buffer_bytes, int) and 1 <= self.buffer_bytes <= 1 << 30,
               "buffer_bytes must be in 1..2**30")
        check(isinstance(self.num_buffers, int) and 1 <= self.num_buffers <= 4,
               "num_buffers must be in 1..4")
        check(len(self.syncs) >= 1, "syncs must hold at least one sync")
        for i, s in enumerate(self.syncs):
            check(all(isinstance(w, int) and 0 <= w < len(self.params) for w in s.writes)
                   and len(set(s.writes)) == len(s.writes),
                   f"syncs[{i}].writes must be distinct parameter indices")
            for j, h in enumerate(s.holds):
                check(h.until in HOLD_UNTIL, f"syncs[{i}].holds[{j}].until must be one of "
                                              f"{HOLD_UNTIL}")
                check(isinstance(h.cycles, int) and 0 <= h.cycles <= 10**8,
                       f"syncs[{i}].holds[{j}].cycles must be in 0..1e8")
            for j, c in enumerate(s.churn):
                check(c.dtype in CHURN_DTYPES,
                       f"syncs[{i}].churn[{j}].dtype must be one of {CHURN_DTYPES}")
                check(isinstance(c.numel, int) and 1 <= c.numel <= 1 << 20,
                       f"syncs[{i}].churn[{j}].numel must be in 1..2**20")
                check(isinstance(c.fill, int) and 0 <= c.fill <= 255,
                       f"syncs[{i}].churn[{j}].fill must be in 0..255")

    def describe(self) -> str:
        """A short human summary, used in reports."""
        params = ", ".join(f"{p.dtype}{list(p.shape)}" for p in self.params)
        writes = ";".join(",".join(map(str, s.writes)) or "-" for s in self.syncs)
        holds = sum(len(s.holds) for s in self.syncs)
        return (f"{len(self.syncs)} syncs (writes {writes}), params [{params}] "
                f"({self.total_bytes} B), buffer_bytes={self.buffer_bytes}, "
                f"num_buffers={self.num_buffers}, holds={holds}, world_size={self.world_size}")

    def short(self) -> str:
        return f"{len(self.syncs)} syncs/{len(self.params)} params"


def behaviours(scenario: WeightSyncScenario) -> list[str]:
    """Coarse labels: how many chunks, buffers, syncs, and what was held."""
    chunks = chunk_sizes(scenario)
    labels = [f"syncs {min(len(scenario.syncs), 4)}", f"buffers {scenario.num_buffers}",
              f"chunks {min(len(chunks), 4)}"]
    if any(s.holds for s in scenario.syncs):
        labels.append("holds " + "+".join(sorted({h.until or "spin" for s in scenario.syncs
                                                   for h in s.holds})))
    if any(s.churn for s in scenario.syncs):
        labels.append("churn")
    if len({p.dtype for p in scenario.params}) > 1:
        labels.append("dtypes mixed")
    return labels


def chunk_sizes(scenario: WeightSyncScenario) -> list[int]:
    """Parameters per packed buffer: a buffer takes parameters until its bytes
    exceed ``buffer_bytes`` (so a parameter can straddle the boundary)."""
    out, n, size = [], 0, 0
    for p in scenario.params:
        n += 1
        size += p.nbytes
        if size > scenario.buffer_bytes:
            out.append(n)
            n, size = 0, 0
    if n:
        out.append(n)
    return out


def _param(raw: Any, where: str) -> Param:
    p = fields_of(raw, Param, where)
    if "shape" in p:
        p["shape"] = tuple(p["shape"]) if isinstance(p["shape"], (list, tuple)) else p["shape"]
    return Param(**p)
