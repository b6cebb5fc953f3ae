"""The benchmark's plumbing on CPU, on a tiny run; and the gate fallback."""

import json
import random

import pytest
import torch

from streamfuzz.fuzz import bench
from streamfuzz.fuzz.draft.runner import run_scenario
from streamfuzz.fuzz.draft.scenario import DEFAULT_SPIN, Delay, Scenario, Step
from streamfuzz.fuzz.gates import Gates, GateUnavailable
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.streams import SimStreams
from streamfuzz.fuzz.targets import TargetContext

COLUMNS = ["target", "fuzzer ex/s", "waiting ex/s", "loop ex/s", "fuzzer/loop", "held by",
           "value oracle ms/ex",
           "reuse oracle ms/ex", "lifetime oracle ms/ex", "found (seeds)",
           "examples to 1st failure", "s to 1st failure (cold)", "of which start s",
           "s to 1st failure from process start", "shrink s", "torch.cuda / ctx.streams ex/s"]


def test_tiny_bench_writes_json_and_a_table_with_the_columns(tmp_path, rank_oracles):
    report = bench.run(["cpu"], ["pre-fix"], seeds=1, examples=4, detect_examples=2,
                       ff_examples=3, ff_budget_s=20, timeout=30, warmup_examples=2,
                       oracle_examples=2, log=lambda _: None)
    # The fuzzer's runs get every oracle, as `fuzz run` does; the loop then
    # switches them off set by set to cost each.
    every = frozenset(o.value for o in Oracle) - {"reuse"}  # what runs on CPU: no reuse watch
    assert rank_oracles[0] == ("pre-fix", every)  # the cold start's first example
    assert {o for _, o in rank_oracles} == {frozenset(), frozenset({"value"}), every}
    json_path, md_path = bench.write(tmp_path, report)
    data = json.loads(json_path.read_text())
    (run,) = data["runs"]
    assert run["device"] == "cpu" and run["world_size"] == 2
    (row,) = run["targets"]
    tp = row["throughput"]
    assert tp["examples"] == 4 and tp["fuzzer_ex_s"] > 0 and tp["loop_ex_s"] > 0
    assert tp["waiting_ex_s"] > 0
    assert tp["per_seed"]["gpu_reserved_mib"] == [[None, None]]  # no caching allocator on CPU
    assert tp["oracles"] == sorted(o.value for o in Oracle)  # what the bench asked for
    assert set(tp["oracle_cost_ms"]) == {"value", "reuse", "lifetime"}
    forms = tp["api_forms"]  # pre-fix against its ctx.streams form, same scenarios
    assert forms["examples"] == 4 and len(forms["ratios"]) == forms["rounds"] == 5
    assert forms["plain_ex_s"] > 0 and forms["streams_ex_s"] > 0
    assert any(t == bench.STREAMS_FORM["pre-fix"] for t, _ in rank_oracles)
    assert "detection" not in row  # gates and spins mean nothing on simulated streams
    assert len(row["first_failure"]["seeds"]) == 1
    (cold,) = row["from_process_start"]["seeds"]  # `fuzz run` in a process of its own
    assert cold["found"] and cold["exit"] == 1 and 0 < cold["s"] < cold["process_s"]
    # Every process's stages, on ranks that counted them: the driver's Hypothesis
    # and waiting, each rank's runner and lifetime oracle (simulated streams).
    b = row["stages"]
    assert b["examples"] == 4 and len(b["ranks"]) == 2
    assert {"hypothesis", "waiting", "messages"} <= set(b["driver"])
    for ms in b["ranks"]:
        assert {"runner", "simulation", "lifetime", "messages"} <= set(ms)
        assert "gpu" not in ms and "reuse" not in ms
    # CPU time by thread, the driver's and each rank's: the ranks' threads ran.
    assert len(b["cpu_threads"]) == 3 and sum(b["cpu_threads"][1].values()) > 0
    assert (tmp_path / "stages-cpu.png").stat().st_size > 0
    assert "| target | process | wall ms/ex |" in md_path.read_text()
    header = next(ln for ln in md_path.read_text().splitlines() if ln.startswith("| target |"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    assert "Detection with gates and spins: not on CPU" in md_path.read_text()


def test_random_scenarios_are_valid_and_crafted_ones_hold_until_a_point():
    rng = random.Random(0)
    for _ in range(200):
        bench.random_scenario(rng, 2).validate()
    assert bench.crafted("reuse", 1).steps[0].delays[0].until == "after_churn"
    war = bench.crafted("war", 1)
    assert len(war.steps) == 2 and war.steps[0].delays[0].until == "before_next_call"


def test_gates_are_unavailable_without_cuda():
    with pytest.raises(GateUnavailable):
        Gates.create(torch.device("cpu"))


class _SpinOnly(SimStreams):
    """CUDA-like streams without gates: every hold must become a spin."""

    def __init__(self):
        super().__init__()
        self.spins = []

    def spin(self, s, cycles, idle=False):
        self.spins.append((s, cycles))
        return "spin"


def _factory(ctx):
    from streamfuzz.fuzz.draft.targets.pp_draft import MainGather

    return MainGather(ctx)


def test_gate_delays_fall_back_to_spins_where_gates_are_unavailable():
    step = Step(idx_mapping=(0, 1), final=(True, True), num_sampled=(1, 1), num_rejected=(0, 0),
                delays=(Delay("pre_call", "side", 0, until="after_churn"),
                        Delay("post_call", "side", 1000, until="before_next_call"),
                        Delay("pre_call", "main", 0)))
    scn = Scenario(world_size=1, max_num_reqs=2, steps=(step,))
    streams = _SpinOnly()
    ctx = TargetContext(rank=0, world_size=1, last_rank=0, device=torch.device("cpu"),
                        group=None, max_num_reqs=2, num_spec_steps=2, streams=streams)
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        obs = run_scenario(scn, _factory, ctx, RunOptions(oracles={Oracle.VALUE}, hold=Hold.GATE))
    finally:
        dist.destroy_process_group()
    assert obs.held == ("spin",)
    assert [c for _, c in streams.spins] == [DEFAULT_SPIN, 1000]


def test_no_waiting_leaves_the_waiting_run_out(monkeypatch, cpu_pool):
    from streamfuzz.fuzz import driver

    pipelines = []
    real = driver.fuzz

    def fuzz(*args, **kwargs):
        pipelines.append(kwargs.get("pipeline", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "fuzz", fuzz)
    tp = bench.throughput(cpu_pool, "main-gather", 3, seeds=2, oracle_examples=2,
                          oracle_rounds=1, waiting=False)
    assert pipelines == [True, True]
    assert tp["waiting_ex_s"] is None and tp["per_seed"]["waiting_ex_s"] == []
    assert tp["fuzzer_ex_s"] > 0 and tp["loop_ex_s"] > 0
    bench.throughput(cpu_pool, "main-gather", 3, seeds=1, oracle_examples=2, oracle_rounds=1)
    assert pipelines == [True, True, True, False]


def test_reserved_memory_is_rank_0s_in_mib_and_none_where_unknown():
    from streamfuzz.fuzz.messages import Memory

    class _Pool:
        device = "cuda"  # off CUDA the ranks are not asked

        def __init__(self, mem):
            self.mem = mem

        def stats(self):
            return self.mem

    assert bench._reserved_mib(_Pool([Memory(rss=1, gpu_reserved=3 << 20), None])) == 3.0
    assert bench._reserved_mib(_Pool([Memory(rss=1)])) is None  # CPU
    assert bench._reserved_mib(_Pool([None])) is None  # rank 0 did not answer
    assert bench._reserved_mib(_Pool([])) is None
