from streamfuzz.fuzz.draft import DraftObservations
from streamfuzz.fuzz.draft.reference import draft_value, expected_applied, expected_sent
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.draft.value import check as check_values


def _scn(world=2):
    steps = (
        Step(idx_mapping=(2, 0), final=(True, True), num_sampled=(1, 2), num_rejected=(0, 1)),
        Step(idx_mapping=(1,), final=(False,), num_sampled=(0,), num_rejected=(0,)),
        Step(idx_mapping=(0,), final=(True,), num_sampled=(3,), num_rejected=(2,)),
    )
    return Scenario(world_size=world, max_num_reqs=3, num_spec_steps=2, pipeline_depth=1,
                    steps=steps)


def _perfect(scn):
    sent = [(i, rows) for i, rows in expected_sent(scn).items()]
    return [DraftObservations(rank=0, held=(), oracles=("value",), findings=(),
                              applied=expected_applied(scn)),
            DraftObservations(rank=1, held=(), oracles=("value",), findings=(), sent=sent)]


def test_reference_rows_read_as_step_slot_position():
    assert draft_value(2, 3, 1) == 300049
    assert expected_sent(_scn())[0] == [[100032, 100033], [100000, 100001]]
    assert 1 not in expected_sent(_scn())  # nothing samples: nothing is sent


def test_perfect_observations_pass():
    assert check_values(_scn(), _perfect(_scn())) == []


def test_wrong_sent_row_is_reported_with_step_rank_and_rows():
    obs = _perfect(_scn())
    obs[1].sent[1][1][0][1] = 7
    (f,) = check_values(_scn(), obs)
    assert (f.kind, f.rank, f.step) == ("value", 1, 2)
    assert "row 0 (slot 0): expected [300000, 300001] got [300000, 7]" in f.message


def test_wrong_receiver_table_is_reported():
    obs = _perfect(_scn())
    obs[0].applied[0].table[2] = [0, 0]
    (f,) = check_values(_scn(), obs)
    assert f.rank == 0 and f.step == 0 and "draft table" in f.message and "slot 2" in f.message


def test_missing_apply_is_reported():
    obs = _perfect(_scn())
    obs[0].applied.pop()
    (f,) = check_values(_scn(), obs)
    assert "applied steps [0], expected [0, 2]" in f.message
