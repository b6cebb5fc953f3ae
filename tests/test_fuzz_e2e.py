"""The whole pipeline on CPU ranks: strategies -> driver -> ranks -> oracle -> corpus."""

import pytest
from hypothesis import strategies as st

from streamfuzz.fuzz import corpus, driver, profiles
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.strategies import scenarios

SHIFTED = "tests.targets:shifted_rows"


def test_value_oracle_catches_shifted_rows_and_shrinks_to_minimal_batch(cpu_pool, ci_settings,
                                                                        tmp_path):
    res = driver.fuzz(cpu_pool, SHIFTED, ci_settings, max_examples=300, seed=0,
                      corpus_dir=tmp_path)
    assert res.failure is not None and res.failure.kind == "value"
    assert "sent wrong drafts" in res.failure.message
    shrunk = res.scenario
    # The smallest case the bug needs: one step of three requests in a table of three.
    assert (len(shrunk.steps), shrunk.max_num_reqs) == (1, 3)
    assert shrunk.steps[0].idx_mapping == (0, 1, 2)
    entry = corpus.load(res.corpus_path)
    assert entry.scenario == shrunk and entry.kind == "value" and entry.target == SHIFTED
    assert entry.found_on["world_size"] == 2
    # The saved case is a regression: it fails again, and the correct design passes it.
    assert not driver.replay(cpu_pool, entry).ok
    assert driver.replay(cpu_pool, entry, target="main-gather").ok


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_three_request_value_bug_shrinks_to_slots_0_1_2_on_other_seeds(cpu_pool, ci_settings,
                                                                          seed):
    res = driver.fuzz(cpu_pool, SHIFTED, ci_settings, max_examples=300, seed=seed)
    assert res.failure is not None and res.failure.kind == "value"
    assert res.scenario.max_num_reqs == 3
    assert [s.idx_mapping for s in res.scenario.steps] == [(0, 1, 2)]


def test_correct_target_is_clean(cpu_pool, ci_settings):
    res = driver.fuzz(cpu_pool, "main-gather", ci_settings, max_examples=60, seed=1)
    assert res.failure is None and res.examples == 60


def test_killed_rank_is_a_crash_nothing_lost_and_campaign_goes_on(ci_settings, tmp_path):
    with RankPool(2, "cpu", timeout=20.0) as pool:
        before = pool.restarts
        # Few steps and slots: every failing example costs a restart of the world.
        narrow = scenarios(world_size=2, max_steps=2, max_num_reqs=st.just(3))
        res = driver.fuzz(pool, "tests.targets:kills_rank", ci_settings, max_examples=100,
                          seed=0, corpus_dir=tmp_path, strategy=narrow)
        assert res.failure is not None and res.failure.kind == "crash"
        assert "killed by SIGKILL" in res.failure.message
        assert pool.restarts > before
        assert max(s.num_reqs for s in res.scenario.steps) == 2
        assert corpus.load(res.corpus_path).kind == "crash"
        after = driver.fuzz(pool, "main-gather", ci_settings, max_examples=20, seed=0)
        assert after.failure is None and after.examples == 20


def test_hung_rank_is_a_hang_and_ranks_are_replaced(ci_settings):
    step = Step(idx_mapping=(0, 1, 2, 3), final=(True,) * 4, num_sampled=(1,) * 4,
                num_rejected=(0,) * 4)
    scn = Scenario(world_size=2, max_num_reqs=4, steps=(step,))
    with RankPool(2, "cpu", timeout=8.0) as pool:
        pids = pool.pids
        res = driver.fuzz(pool, "tests.targets:hangs", ci_settings, max_examples=1,
                          strategy=st.just(scn))
        assert res.failure is not None and res.failure.kind == "hang"
        assert set(pool.pids).isdisjoint(pids)
        pool.timeout = 120.0  # the replacement world must answer; a loaded machine may be slow
        after = driver.evaluate(pool, "main-gather", scn)
        assert after.ok, after.summary()


def test_shrink_budget_saves_the_best_case_so_far_without_calling_it_flaky(cpu_pool, ci_settings,
                                                                           tmp_path):
    res = driver.fuzz(cpu_pool, SHIFTED, ci_settings, max_examples=300, seed=0,
                      shrink_budget_s=1e-6, corpus_dir=tmp_path)
    assert res.failure is not None and res.shrink_truncated and not res.flaky
    entry = corpus.load(res.corpus_path)
    assert not driver.replay(cpu_pool, entry).ok


def test_a_failure_whose_shrinking_was_cut_short_is_shrunk_on_by_the_next_run(cpu_pool,
                                                                               tmp_path):
    # The database keeps the failure as shrunk so far. Hypothesis took that
    # entry for one shrunk to the end and never shrank it again: a soak's
    # rounds found the same half-shrunk case at their first example, forever.
    settings = profiles.get("default", tmp_path / "db")
    cut = driver.fuzz(cpu_pool, SHIFTED, settings, max_examples=300, shrink_budget_s=0.0)
    assert cut.failure is not None and cut.shrink_truncated
    again = driver.fuzz(cpu_pool, SHIFTED, settings, max_examples=300, shrink_budget_s=None)
    assert again.failure is not None and not again.shrink_truncated
    assert again.first_failure_examples == 1  # the database's case, replayed first
    assert again.examples > 2, "the replayed case was not shrunk again"
    # Smaller than where the first run stopped, down to the 3 requests the bug
    # needs. Not always to one step: from some starts Hypothesis's shrinker
    # settles in a local minimum of several steps (seen once in about 60 runs).
    shrunk, before = again.scenario, cut.scenario
    assert shrunk != before
    assert len(shrunk.steps) <= len(before.steps) and shrunk.max_num_reqs == 3
