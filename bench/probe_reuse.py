"""Probe: does a crafted pre-fix scenario corrupt the sent drafts on this GPU?

Spins only (``hold: spin``); ``python -m streamfuzz bench`` measures gates against spins.
"""
import os
import sys

import torch
import torch.distributed as dist

import streamfuzz.fuzz.draft.runner as runner_module
from streamfuzz.fuzz import targets
from streamfuzz.fuzz.draft import value
from streamfuzz.fuzz.draft.runner import run_on_rank
from streamfuzz.fuzz.draft.scenario import Churn, Delay, Scenario, Step
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.rank_main import _env

_OPTIONS = RunOptions(oracles={Oracle.VALUE, Oracle.REUSE}, hold=Hold.SPIN)

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29555")
os.environ.update(RANK="0", WORLD_SIZE="1")
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", device_id=dev)
group = dist.new_group(backend="nccl")

log = []
_orig_batch = runner_module._Run._batch
_orig_churn = runner_module._Run._churn


def _batch(self, i: int, step: Step) -> object:  # noqa: ANN001
    b = _orig_batch(self, i, step)
    log.append(("idx", b.idx_mapping.data_ptr()))
    return b


def _churn(self, step: Step) -> None:  # noqa: ANN001
    real_empty = torch.empty

    def empty(*a: object, **k: object) -> torch.Tensor:
        t = real_empty(*a, **k)
        log.append(("churn", t.data_ptr()))
        return t
    runner_module.torch.empty = empty
    try:
        _orig_churn(self, step)
    finally:
        runner_module.torch.empty = real_empty


runner_module._Run._batch = _batch
runner_module._Run._churn = _churn


def steps(n: int, cycles: int, fill: int, idx_dtype: str = "int64") -> Scenario:
    st = Step(idx_mapping=tuple(range(n)), idx_dtype=idx_dtype, final=(True,) * n,
              num_sampled=(1,) * n, num_rejected=(0,) * n,
              churn=(Churn(stream="main", numel=n, dtype=idx_dtype, fill=fill),),
              delays=(Delay("pre_call", "side", cycles),) if cycles else ())
    return Scenario(world_size=1, max_num_reqs=8, num_spec_steps=2, steps=(st,))


for target in sys.argv[1:] or ["pre-fix", "pr-fix", "main-gather"]:
    f = targets.load(target)
    for cycles in (2_000_000, 5_000_000, 10_000_000):
        for dt in ("int64", "int32"):
            bad = 0
            for _trial in range(40):
                scn = steps(4, cycles, 1, dt)
                obs = run_on_rank(scn, f, _env(dev, group), _OPTIONS)
                fails = value.check(scn, [obs])
                bad += bool(fails)

            print(f"{target} cycles={cycles} idx={dt}: {bad}/40 wrong", flush=True)
            if bad and fails:
                print("  e.g.", fails[0].message[:200])
dist.destroy_process_group()
