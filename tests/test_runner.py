"""What the oracles see of the runner's own work: the batch copies out of
pinned memory and the drafter's write of the table, never the harness's
staging, row arithmetic or churn."""

import torch

from streamfuzz.fuzz.draft.runner import run_scenario
from streamfuzz.fuzz.draft.scenario import Churn, Scenario, Step
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.streams import SimStreams
from streamfuzz.fuzz.targets import TargetContext


class _Idle:
    """A handler with no ops of its own: every op seen is the runner's."""

    def __init__(self, ctx: TargetContext) -> None:
        self.side = ctx.streams.Stream()

    def broadcast_drafts(self, draft_table, batch):  # noqa: ANN001, ANN201
        return None


def test_the_oracles_see_the_batch_copies_and_the_drafters_write_only():
    step = Step(idx_mapping=(1, 0), idx_dtype="int32", final=(True, True), num_sampled=(1, 2),
                num_rejected=(0, 1),
                churn=(Churn("main", 40, "float32", 3, keep=True), Churn("side", 8, "uint8", 1)))
    scn = Scenario(world_size=1, max_num_reqs=2, num_spec_steps=2, steps=(step, step))
    streams = SimStreams()
    seen: list[tuple[str, tuple[str, ...]]] = []

    def record(what, *args):  # noqa: ANN001, ANN202
        if what == "op":
            func, op_args = args[0], args[1]
            kinds = tuple(streams.memory.kind(a) for a in op_args if isinstance(a, torch.Tensor))
            seen.append((str(func), kinds))

    streams.listeners.append(record)
    ctx = TargetContext(rank=0, world_size=1, last_rank=0, device=torch.device("cpu"),
                        group=None, max_num_reqs=2, num_spec_steps=2, streams=streams)
    obs = run_scenario(scn, _Idle, ctx, RunOptions(oracles={Oracle.LIFETIME}))
    assert obs.findings == ()
    copy = ("aten._to_copy.default", ("pinned",))  # out of a pinned buffer, onto the device
    per_step = [copy] * 4 + [("aten.index_put_.default", ("device", "device"))]
    assert seen == [("aten.zeros.default", ())] + per_step * 2
