"""Point-to-point calls and async collectives on simulated streams (CPU
ranks, real gloo): the program waits for the work handle it gets, as it
would on a GPU, and the lifetime oracle follows them as NCCL runs them, on a
stream of the backend's own that a wait for the handle orders."""

import re

import pytest

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.draft.scenario import Scenario, Step

_STEP = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(2, 1), num_rejected=(0, 1))
_SCENARIO = Scenario(world_size=2, max_num_reqs=2, steps=(_STEP, _STEP), pipeline_depth=1)


@pytest.mark.parametrize("target", ["point_to_point", "point_to_point_async",
                                    "point_to_point_any_source", "async_broadcast",
                                    "async_broadcast_via_future"])
def test_drafts_sent_point_to_point_or_async_arrive_and_are_clean(cpu_pool, target):
    verdict = driver.evaluate(cpu_pool, f"tests.targets:{target}", _SCENARIO)
    assert verdict.ok, verdict.summary()


def test_a_send_on_a_side_stream_without_record_stream_is_a_lifetime_finding(cpu_pool):
    verdict = driver.evaluate(cpu_pool, "tests.targets:point_to_point_unrecorded", _SCENARIO)
    assert not verdict.ok
    first = verdict.failures[0]
    assert first.kind == "lifetime", verdict.summary()
    assert "sampled_tokens" in first.message and "c10d.send" in first.message, first.message


@pytest.mark.parametrize("target, op", [("receiver-async-unwaited", "c10d.broadcast_"),
                                        ("tests.targets:point_to_point_no_wait", "c10d.recv_")])
def test_a_receive_never_waited_for_races_with_the_apply_on_main(cpu_pool, target, op):
    verdict = driver.evaluate(cpu_pool, target, _SCENARIO)
    assert not verdict.ok
    first = verdict.failures[0]
    assert first.kind == "race" and first.rank == 0, verdict.summary()
    stream = r"nccl\(group [^,)]+, p2p 0-1\)" if "recv" in op else r"nccl\(group [^,)]+\)"
    assert re.search(f"{stream}'s write \\({op}", first.message), first.message
    # The access quoted is the target's call, not the wrapper that notes collectives.
    assert "collectives.py" not in first.message and "fn(*args" not in first.message, \
        first.message
