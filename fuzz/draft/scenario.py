"""A scenario is one fuzz example as plain values.

Strategies produce it, the driver ships it to every rank, the reference and the
corpus read it. It holds no Hypothesis state, so a corpus entry survives edits
to the strategies and upgrades of Hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.protocol.scenario import (
    DEFAULT_SPIN,
    ScenarioError,
    check,
    fields_of,
    plain,
    polls_held,
    spin_cycles,
)

__all__ = ["DEFAULT_SPIN", "ScenarioError", "check", "fields_of", "plain", "polls_held",
           "spin_cycles"]

STREAMS = ("main", "side")
DELAY_POINTS = ("pre_call", "post_call")
GATE_UNTIL = ("", "after_call", "after_churn", "before_next_call")
"""Where a gate is released: ``""`` means a spin; the others name a point of the
step, and the release is queued on the *other* stream at that point, so the
held stream resumes exactly when that stream's work up to the point has run."""
CHURN_DTYPES = ("int32", "int64", "float32", "uint8")
"""The dtypes of churn allocations, in the order the strategies draw them."""
ITEMSIZE = {"int32": 4, "int64": 8, "float32": 4, "uint8": 1}
"""Bytes per element of each dtype a scenario names (churn and index)."""
FILL_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
              "float32": (-(2**24), 2**24), "uint8": (0, 255)}
IDX_DTYPES = ("int32", "int64")


@dataclass(frozen=True)
class Churn:
    """One allocation made right after the handler call returns.

    It models the runner's next allocations: on ``stream``, ``numel`` elements
    of ``dtype`` filled with ``fill``; ``keep`` holds it until the step ends,
    otherwise it is freed at once (and its block can be handed out again).
    """

    stream: str = "main"
    numel: int = 1
    dtype: str = "int32"
    fill: int = 0
    keep: bool = True


@dataclass(frozen=True)
class Delay:
    """Hold ``stream`` at ``point`` of a step: a spin, or a gate ``until`` a point.

    ``side`` is the first stream the handler created (its broadcast stream).
    With ``until`` set and gates available (``RunOptions.hold`` is gate), the
    stream is held by a gate kernel that the other stream opens at that point
    (``before_next_call``: after the next step's drafter), which forces the
    interleaving every time. Otherwise it is a spin of ``cycles`` GPU cycles
    (``until`` without ``cycles`` spins ``DEFAULT_SPIN``), which only makes
    the interleaving likely. Simulated CPU streams hold nothing (the lifetime
    oracle needs no interleaving forced); there a delay holds polls instead
    (``Step.pending_polls``).
    """

    point: str = "pre_call"
    stream: str = "side"
    cycles: int = 0
    until: str = ""


@dataclass(frozen=True)
class Step:
    """One engine step: the scheduled batch, and what happens around the call."""

    idx_mapping: tuple[int, ...] = ()
    idx_dtype: str = "int64"
    final: tuple[bool, ...] = ()
    num_sampled: tuple[int, ...] = ()
    num_rejected: tuple[int, ...] = ()
    churn: tuple[Churn, ...] = ()
    delays: tuple[Delay, ...] = ()

    @property
    def num_reqs(self) -> int:
        return len(self.idx_mapping)

    @property
    def pending_polls(self) -> int:
        """On simulated streams, how many of the step's polls of work the host
        has not synchronized with answer "not done" (``SimStreams.hold_polls``):
        a GPU held answers so while it is busy; see ``polls_held``."""
        return sum(polls_held(d.cycles, d.until) for d in self.delays)

    @property
    def broadcasts(self) -> bool:
        """Whether anything is broadcast: some request of the batch samples."""
        return any(self.final)


@dataclass(frozen=True)
class Scenario:
    """A sequence of steps run on every rank of a fixed world."""

    world_size: int = 1
    max_num_reqs: int = 4
    num_spec_steps: int = 2
    pipeline_depth: int = 1
    steps: tuple[Step, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return plain(self)

    @classmethod
    def from_dict(cls, data: Any) -> Scenario:
        """Build and validate; raises ScenarioError naming the bad field."""
        if not isinstance(data, dict):
            raise ScenarioError("scenario must be an object")
        top = fields_of(data, cls, "scenario")
        steps = []
        for i, raw in enumerate(top.pop("steps", [])):
            where = f"steps[{i}]"
            if not isinstance(raw, dict):
                raise ScenarioError(f"{where} must be an object")
            s = fields_of(raw, Step, where)
            s["churn"] = tuple(
                Churn(**fields_of(c, Churn, f"{where}.churn[{j}]"))
                for j, c in enumerate(s.get("churn", ()))
            )
            s["delays"] = tuple(
                Delay(**fields_of(d, Delay, f"{where}.delays[{j}]"))
                for j, d in enumerate(s.get("delays", ()))
            )
            for name in ("idx_mapping", "final", "num_sampled", "num_rejected"):
                s[name] = tuple(s.get(name, ()))
            steps.append(Step(**s))
        scenario = cls(**top, steps=tuple(steps))
        scenario.validate()
        return scenario

    def validate(self) -> None:
        """Reject what no runner would produce, with the field that is wrong."""
        check(isinstance(self.world_size, int) and self.world_size >= 1, "world_size must be >= 1")
        check(isinstance(self.max_num_reqs, int) and 1 <= self.max_num_reqs <= 4096,
               "max_num_reqs must be in 1..4096")
        check(isinstance(self.num_spec_steps, int) and 1 <= self.num_spec_steps <= 15,
               "num_spec_steps must be in 1..15")
        check(isinstance(self.pipeline_depth, int) and 1 <= self.pipeline_depth <= 8,
               "pipeline_depth must be in 1..8")
        for i, st in enumerate(self.steps):
            w = f"steps[{i}]"
            n = st.num_reqs
            check(len(set(st.idx_mapping)) == n, f"{w}.idx_mapping must hold distinct slots")
            check(all(isinstance(x, int) and 0 <= x < self.max_num_reqs for x in st.idx_mapping),
                   f"{w}.idx_mapping slots must be in 0..max_num_reqs-1")
            check(st.idx_dtype in IDX_DTYPES, f"{w}.idx_dtype must be one of {IDX_DTYPES}")
            for name in ("final", "num_sampled", "num_rejected"):
                check(len(getattr(st, name)) == n, f"{w}.{name} must have one entry per request")
            for r in range(n):
                ns, nr = st.num_sampled[r], st.num_rejected[r]
                check(0 <= ns <= self.num_spec_steps + 1, f"{w}.num_sampled out of range")
                check(0 <= nr <= self.num_spec_steps, f"{w}.num_rejected out of range")
                check(st.final[r] or ns == 0, f"{w}: a non-final chunk samples nothing")
            for j, c in enumerate(st.churn):
                check(c.stream in STREAMS, f"{w}.churn[{j}].stream must be one of {STREAMS}")
                check(c.dtype in CHURN_DTYPES,
                       f"{w}.churn[{j}].dtype must be one of {CHURN_DTYPES}")
                check(isinstance(c.numel, int) and 1 <= c.numel <= 1 << 20,
                       f"{w}.churn[{j}].numel must be in 1..2**20")
                lo, hi = FILL_RANGE.get(c.dtype, (0, 0))
                check(isinstance(c.fill, int) and lo <= c.fill <= hi,
                       f"{w}.churn[{j}].fill must be an integer in {lo}..{hi} for {c.dtype}")
            for j, d in enumerate(st.delays):
                check(d.stream in STREAMS, f"{w}.delays[{j}].stream must be one of {STREAMS}")
                check(d.point in DELAY_POINTS,
                       f"{w}.delays[{j}].point must be one of {DELAY_POINTS}")
                check(isinstance(d.cycles, int) and 0 <= d.cycles <= 10**8,
                       f"{w}.delays[{j}].cycles must be in 0..1e8")
                check(d.until in GATE_UNTIL, f"{w}.delays[{j}].until must be one of {GATE_UNTIL}")

    def describe(self) -> str:
        """A short human summary, used in reports."""
        sizes = ",".join(str(s.num_reqs) for s in self.steps)
        return (f"{len(self.steps)} steps (batch sizes {sizes or '-'}), "
                f"max_num_reqs={self.max_num_reqs}, num_spec_steps={self.num_spec_steps}, "
                f"pipeline_depth={self.pipeline_depth}, world_size={self.world_size}")
