"""The lifetime oracle through the whole pipeline on CPU ranks (gloo, world 2),
and on a GPU where one is visible."""

import pytest

from streamfuzz.fuzz import driver, targets
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.host import probe_gpus
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.ranks import RankPool

LIFETIME = RunOptions(oracles={Oracle.LIFETIME})


def _step(slots=(1, 0)):
    n = len(slots)
    return Step(idx_mapping=tuple(slots), final=(True,) * n, num_sampled=(1,) * n,
                num_rejected=(0,) * n)


def _scn(world=2, steps=2):
    return Scenario(world_size=world, max_num_reqs=3, num_spec_steps=2,
                    steps=tuple(_step() for _ in range(steps)))


def test_pre_fix_is_a_lifetime_bug_on_idx_mapping(cpu_pool):
    v = driver.evaluate(cpu_pool, "pre-fix", _scn(steps=1), LIFETIME)
    f = v.first
    assert (f.kind, f.rank, f.step) == ("lifetime", 1, 0)
    assert f.message.startswith("idx_mapping (int64[2]) was freed while stream side")
    assert "aten.index.Tensor" in f.message and "pp_draft.py" in f.message


def test_pr_fix_is_a_race_on_the_draft_table(cpu_pool):
    v = driver.evaluate(cpu_pool, "pr-fix", _scn(), LIFETIME)
    assert [f.kind for f in v.failures] == ["race"]
    assert v.first.message.startswith("write-after-read race on draft_table")
    assert v.first.step == 1


def test_main_gather_is_clean(cpu_pool):
    for world_steps in (1, 3):
        assert driver.evaluate(cpu_pool, "main-gather", _scn(steps=world_steps),
                               LIFETIME).ok


def test_host_syncs_order_what_the_side_stream_read_before_its_free(cpu_pool):
    # main-gather-synced waits for its side stream on the host instead of
    # record_stream: clean; without that wait the same code is a lifetime bug.
    for steps in (1, 3):
        assert driver.evaluate(cpu_pool, "main-gather-synced", _scn(steps=steps), LIFETIME).ok
    v = driver.evaluate(cpu_pool, "tests.targets:synced_without_the_sync", _scn(steps=1),
                        LIFETIME)
    assert not v.ok and v.first.kind == "lifetime", v.summary()


def test_a_query_that_says_done_orders_the_host_like_a_synchronize(cpu_pool):
    # Polling a stream's or an event's query() until True, then freeing or
    # reading on the host: what a GPU program may do in place of a synchronize.
    for steps in (1, 3):
        v = driver.evaluate(cpu_pool, "tests.targets:synced_by_polling", _scn(steps=steps),
                            LIFETIME)
        assert v.ok, v.summary()


def test_value_only_runs_have_no_rank_findings(cpu_pool):
    assert driver.evaluate(cpu_pool, "pre-fix", _scn(), RunOptions(oracles={Oracle.VALUE})).ok


@pytest.mark.parametrize("name", sorted(targets.MUTANTS))
def test_every_mutant_is_found_by_the_lifetime_oracle(cpu_pool, ci_settings, name):
    res = driver.fuzz(cpu_pool, name, ci_settings, max_examples=200, seed=0, options=LIFETIME)
    assert res.failure is not None and res.failure.kind in ("lifetime", "race"), name


def test_fuzzing_finds_and_shrinks_both_bugs(cpu_pool, ci_settings):
    pre = driver.fuzz(cpu_pool, "pre-fix", ci_settings, max_examples=200, seed=1,
                      options=LIFETIME)
    assert pre.failure.kind == "lifetime" and "idx_mapping" in pre.failure.message
    assert len(pre.scenario.steps) == 1
    pr = driver.fuzz(cpu_pool, "pr-fix", ci_settings, max_examples=200, seed=1,
                     options=LIFETIME)
    assert pr.failure.kind == "race" and "draft_table" in pr.failure.message
    assert len(pr.scenario.steps) == 2


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_every_buggy_target_found_within_200_examples_on_every_seed(cpu_pool, ci_settings,
                                                                    seed):
    for name in targets.BUILTIN:
        res = driver.fuzz(cpu_pool, name, ci_settings, max_examples=200, seed=seed,
                          options=LIFETIME)
        assert (res.failure is None) == (name in targets.CORRECT), (name, seed)


@pytest.mark.gpu
def test_gpu_run_reports_lifetime_and_race_beside_the_value_oracle():
    if probe_gpus() < 1:
        pytest.skip("no CUDA GPU")
    both = RunOptions(oracles={Oracle.VALUE, Oracle.LIFETIME})
    with RankPool(1, "cuda", timeout=120.0) as pool:
        pre = driver.evaluate(pool, "pre-fix", _scn(world=1, steps=1), both)
        assert pre.first.kind == "lifetime", pre.summary()
        assert pre.first.message.startswith("idx_mapping")
        pr = driver.evaluate(pool, "pr-fix", _scn(world=1), both)
        assert [f.kind for f in pr.failures][:1] == ["race"], pr.summary()
        assert "draft_table" in pr.first.message
        ok = driver.evaluate(pool, "main-gather", _scn(world=1, steps=3), both)
        assert ok.ok, ok.summary()
        # Ordering races only: NCCL may stash a collective's tensors until it
        # completes, which legitimately covers a lifetime mutant of the send side.
        for name in ("missing-wait", "sampled-before-wait", "staging-buffer"):
            v = driver.evaluate(pool, name, _scn(world=1), both)
            assert not v.ok and v.first.kind in ("lifetime", "race"), (name, v.summary())


def test_a_free_right_after_a_gloo_broadcast_is_judged_the_same_every_time(cpu_pool):
    """gloo holds a broadcast tensor for a moment after the call returns; the
    receive buffers read on main without record_stream must be found anyway,
    on every replay of the one-step case, never only when gloo let go in time."""
    step = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(1, 1),
                num_rejected=(0, 0))
    scn = Scenario(world_size=2, max_num_reqs=3, num_spec_steps=2, steps=(step,))
    kinds = [driver.evaluate(cpu_pool, "receiver-no-record", scn, LIFETIME).first
             for _ in range(200)]
    assert sum(f is not None and f.kind == "lifetime" for f in kinds) == 200
