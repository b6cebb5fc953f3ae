"""On simulated streams the root of a broadcast goes on at once, and no example
ends with one of its sends unmatched (CPU ranks, real gloo)."""

from streamfuzz.fuzz import driver, profiles
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.ranks.world import World

_STEP = Step(idx_mapping=(0, 1), final=(True, True), num_sampled=(1, 1), num_rejected=(0, 0))
_SCENARIO = Scenario(world_size=2, max_num_reqs=2, steps=(_STEP, _STEP))


def test_the_root_goes_on_before_its_receivers_get_there(tmp_path):
    mark = tmp_path / "root-sent"
    with RankPool(2, "cpu", timeout=120.0, env={"STREAMFUZZ_TEST_ROOT_MARK": str(mark)}) as pool:
        verdict = driver.evaluate(pool, "tests.targets:root_runs_ahead", _SCENARIO)
        # The receivers waited for the file before receiving, and the values
        # they got are right: the root's copies were sent while it went on.
        assert verdict.ok, verdict.summary()
        assert pool.restarts == 0


def test_a_send_nobody_receives_ends_the_world_not_the_next_example():
    """The receiver raises before it receives: the root must not finish its
    example with the sends pending (the next example's receives would match
    them). It hangs instead, as on a GPU, and the world is replaced."""
    with RankPool(2, "cpu", timeout=20.0) as pool:
        bad = driver.evaluate(pool, "tests.targets:receiver_raises", _SCENARIO)
        assert not bad.ok and bad.first.kind == "crash"
        assert "receiver gave up" in bad.first.message
        assert pool.restarts == 1
        pool.timeout = 120.0  # the replacement world must answer; a loaded host may be slow
        after = driver.evaluate(pool, "main-gather", _SCENARIO)
        assert after.ok, after.summary()


def test_once_a_rank_raised_a_peer_still_out_is_not_waited_for():
    """Every crashing step of a shrink waited 2 s for a peer blocked in its
    collective, which never answers: a 30-second shrink ran 10 steps and
    saved a case far from minimal. The peer here is only late (it works on
    for a second after its broadcast); it is not waited for either: its
    world is replaced, and the verdict is the raise."""
    one = Scenario(world_size=2, max_num_reqs=2, steps=(_STEP,))
    with RankPool(2, "cpu", timeout=60.0) as pool:
        bad = driver.evaluate(pool, "tests.targets:raises_while_root_works", one)
        assert not bad.ok and bad.first.kind == "crash"
        assert "receiver gave up after its receive" in bad.first.message
        assert pool.restarts == 1
        assert driver.evaluate(pool, "main-gather", one).ok



def test_a_crash_while_the_peer_waits_shrinks_to_one_step(monkeypatch):
    """The broadcasting rank raises on a batch of 5 requests while its peer
    waits to receive. Each crashing example asked the blocked peer where it
    was stuck, for a hang message nobody used (10 s an example: a 30-second
    shrink ran 6 examples and saved 5 steps); and a peer that did answer was
    left with its collectives out of step, so the next example hung for the
    whole timeout. Now no crash asks, every raise replaces the world, and the
    shrink reaches the smallest case: one step of 5 requests."""
    asked: list[int] = []
    where_stuck = World.where_stuck

    def counted(self: World, rank: int, wait_s: float = 5.0) -> str:
        asked.append(rank)
        return where_stuck(self, rank, wait_s)

    monkeypatch.setattr(World, "where_stuck", counted)
    with RankPool(2, "cpu", timeout=60.0) as pool:
        res = driver.fuzz(pool, "tests.targets:root_raises_on_five", profiles.get("ci"),
                          max_examples=100, seed=0, shrink_budget_s=240.0)
    assert res.failure is not None and res.failure.kind == "crash"
    assert "root gave up on a batch of 5" in res.failure.message
    assert asked == []
    assert not res.shrink_truncated
    assert [len(step.idx_mapping) for step in res.scenario.steps] == [5]
