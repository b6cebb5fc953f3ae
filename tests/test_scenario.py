import json

import pytest
from hypothesis import given, settings

from streamfuzz.fuzz.draft.scenario import Scenario, ScenarioError
from streamfuzz.strategies import scenarios, weight_sync_scenarios


@settings(max_examples=100, deadline=None)
@given(scenarios(world_size=2))
def test_strategy_output_is_valid_and_round_trips_through_json(scn):
    scn.validate()
    again = Scenario.from_dict(json.loads(json.dumps(scn.to_dict())))
    assert again == scn


def _one_step(**step):
    base = {"idx_mapping": [0, 1], "idx_dtype": "int64", "final": [True, True],
            "num_sampled": [1, 1], "num_rejected": [0, 0]}
    base.update(step)
    return {"world_size": 1, "max_num_reqs": 4, "num_spec_steps": 2, "pipeline_depth": 1,
            "steps": [base]}


@pytest.mark.parametrize("step, message", [
    ({"idx_mapping": [0, 0]}, "distinct"),
    ({"idx_mapping": [0, 9]}, "max_num_reqs"),
    ({"final": [True]}, "one entry per request"),
    ({"num_sampled": [0, 9]}, "num_sampled"),
    ({"final": [True, False], "num_sampled": [1, 1]}, "non-final"),
    ({"churn": [{"dtype": "uint8", "fill": 300}]}, "fill"),
    ({"churn": [{"colour": "red"}]}, "unknown field"),
    ({"delays": [{"stream": "elsewhere"}]}, "stream"),
    ({"delays": [{"until": "whenever"}]}, "until"),
])
def test_bad_scenarios_name_the_field(step, message):
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(_one_step(**step))


def test_broadcasts_only_when_some_request_samples():
    scn = Scenario.from_dict(_one_step(final=[False, False], num_sampled=[0, 0]))
    assert not scn.steps[0].broadcasts


def test_delays_written_before_gates_still_load_as_spins():
    old = _one_step(delays=[{"point": "pre_call", "stream": "side", "cycles": 5_000_000}])
    (d,) = Scenario.from_dict(old).steps[0].delays
    assert (d.cycles, d.until) == (5_000_000, "")
    gate = _one_step(delays=[{"point": "pre_call", "stream": "side", "until": "after_churn"}])
    again = Scenario.from_dict(json.loads(json.dumps(Scenario.from_dict(gate).to_dict())))
    assert again.steps[0].delays[0].until == "after_churn"


@settings(max_examples=50, deadline=None)
@given(draft=scenarios(), sync=weight_sync_scenarios())
def test_to_dict_gives_what_asdict_gives_as_plain_json_values(draft, sync):
    import dataclasses

    def walk(value):
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    for scn in (draft, sync):
        assert scn.to_dict() == walk(dataclasses.asdict(scn))
        assert json.loads(json.dumps(scn.to_dict())) == scn.to_dict()
