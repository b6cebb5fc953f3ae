"""On simulated streams a receiving rank goes on past its broadcast calls, and
what it receives lands before anything reads it (CPU ranks, real gloo)."""

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool

_STEP = Step(idx_mapping=(0, 1), final=(True, True), num_sampled=(1, 1), num_rejected=(0, 0))
_SCENARIO = Scenario(world_size=2, max_num_reqs=2, steps=(_STEP, _STEP))


def test_a_receiver_goes_on_before_the_data_arrives(tmp_path):
    mark = tmp_path / "received"
    with RankPool(2, "cpu", timeout=120.0,
                  env={"STREAMFUZZ_TEST_RECEIVE_MARK": str(mark)}) as pool:
        verdict = driver.evaluate(pool, "tests.targets:receiver_runs_ahead", _SCENARIO)
        # The last rank waited for the file before broadcasting, and the values
        # the receivers read are right: the data landed before the reads.
        assert verdict.ok, verdict.summary()
        assert pool.restarts == 0


def test_a_broadcast_received_through_a_dropped_view_lands_in_its_storage(cpu_pool):
    verdict = driver.evaluate(cpu_pool, "tests.targets:receives_through_a_view", _SCENARIO)
    assert verdict.ok, verdict.summary()

