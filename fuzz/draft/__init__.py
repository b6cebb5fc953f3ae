"""The draft broadcast as a protocol: the first one the engine fuzzed.

The pipeline-parallel draft broadcast of a speculative-decoding model runner
(``streamfuzz.fuzz.draft.scenario``, ``strategies``, ``streamfuzz.fuzz.draft.runner``,
``streamfuzz.fuzz.draft.reference``, ``streamfuzz.fuzz.draft.targets.pp_draft``). This
module is what the registry reads; it imports nothing heavy at module level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.draft.context import DraftReceiver, DraftSender
from streamfuzz.fuzz.draft.reference import Applied
from streamfuzz.fuzz.messages import Observations
from streamfuzz.fuzz.protocol import Protocol, methods_of

LAST_RANK, OTHER_RANKS = "the last rank", "the other ranks"
"""The handler's two roles, as reports name them."""

PROTOCOL = Protocol(
    name="draft-broadcast",
    scenario="streamfuzz.fuzz.draft.scenario:Scenario",
    strategy="streamfuzz.fuzz.draft.strategies.scenarios:scenarios",
    run="streamfuzz.fuzz.draft.runner:run_on_rank",
    values="streamfuzz.fuzz.draft.value:check",
    behaviours="streamfuzz.fuzz.draft:behaviours",
    smallest="streamfuzz.fuzz.draft:smallest",
    versions={"pre-fix": "streamfuzz.fuzz.draft.targets.pp_draft:pre_fix",
              "pr-fix": "streamfuzz.fuzz.draft.targets.pp_draft:pr_fix",
              "main-gather": "streamfuzz.fuzz.draft.targets.pp_draft:main_gather"},
    mutants={name: f"streamfuzz.fuzz.draft.targets.mutants:{name.replace('-', '_')}"
             for name in ("missing-wait", "wrong-record-stream", "receiver-no-wait",
                          "receiver-async-unwaited", "receiver-no-record", "receiver-drops-idx",
                          "sampled-before-wait", "early-event", "staging-buffer",
                          "host-read-unsynced", "host-rewrites-staging")},
    correct="main-gather",
    variants={"main-gather-synced": "streamfuzz.fuzz.draft.targets.pp_draft:main_gather_synced"},
    families=("vllm-pp", "vllm-pp-pre-pr"),
    upstream="streamfuzz.fuzz.draft.vllm:FAMILY",
    receiver_side=frozenset({"receiver-no-wait", "receiver-async-unwaited", "receiver-no-record",
                             "receiver-drops-idx", "early-event"}),
    handler_methods={LAST_RANK: methods_of(DraftSender), OTHER_RANKS: methods_of(DraftReceiver)},
    alone=LAST_RANK,
)


@dataclass(frozen=True)
class DraftObservations(Observations):
    """One rank's draft-broadcast outputs: the sender's ``sent`` rows per step;
    a receiver's state after each apply, read on main (the reference's own
    type); whether its handler applies non-final steps (the reference differs)."""

    sent: list[tuple[int, list[list[int]]]] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    applies_non_final: bool = True


def smallest(world_size: int) -> Any:
    """One step that schedules nothing, at the smallest sizes."""
    from streamfuzz.fuzz.draft.scenario import Scenario

    return Scenario.from_dict({"world_size": world_size, "max_num_reqs": 1,
                               "num_spec_steps": 1, "pipeline_depth": 1,
                               "steps": [{"idx_mapping": [], "idx_dtype": "int32"}]})


def _bucket(n: int) -> str:
    return "0" if n == 0 else "1" if n == 1 else "2-3" if n < 4 else "4-7" if n < 8 else "8+"


def behaviours(scenario: Any) -> list[str]:
    """Coarse labels of what an example exercised (steps, batch, depth, holds, churn)."""
    steps = scenario.steps
    labels = [f"steps {_bucket(len(steps))}",
              f"max batch {_bucket(max((s.num_reqs for s in steps), default=0))}",
              f"pipeline depth {scenario.pipeline_depth}"]
    if any(not s.broadcasts for s in steps):
        labels.append("a step broadcast nothing")
    if any(s.delays for s in steps):
        labels.append("delays on " + "+".join(sorted({d.stream for s in steps
                                                       for d in s.delays})))
    if any(s.churn for s in steps):
        labels.append("churn on " + "+".join(sorted({c.stream for s in steps
                                                      for c in s.churn})))
    if len({s.idx_dtype for s in steps if s.num_reqs}) > 1:
        labels.append("idx dtypes mixed")
    return labels
