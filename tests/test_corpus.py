import json

import pytest

from fuzz import corpus
from fuzz.scenario import Scenario, Step


def _entry():
    scn = Scenario(world_size=2, steps=(Step(idx_mapping=(1,), final=(True,), num_sampled=(1,),
                                             num_rejected=(0,)),))
    return corpus.Entry(target="pre-fix", kind="value", message="m", scenario=scn,
                        found_on={"device": "cpu"})


def test_save_load_round_trip_and_name_is_content_hash(tmp_path):
    p1 = corpus.save(tmp_path, _entry())
    p2 = corpus.save(tmp_path, _entry())
    assert p1 == p2 and p1.parent.name == "pre-fix" and p1.name.startswith("value-")
    back = corpus.load(p1)
    assert back.scenario == _entry().scenario and back.target == "pre-fix"
    assert [p.name for p in tmp_path.rglob("*")] == ["pre-fix", p1.name]  # no temp files left


def test_user_target_directory_is_a_safe_name():
    assert corpus.target_dir("my.pkg:make_handler") == "my.pkg-make_handler"


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[]", "must be a JSON object"),
    (json.dumps({"schema": 99}), "newer than this streamfuzz"),
    (json.dumps({"schema": 1, "target": "pre-fix", "kind": "value", "message": "x"}), "scenario"),
    (json.dumps({"schema": 1, "target": "pre-fix", "kind": "odd", "message": "x",
                 "scenario": {}}), "unknown failure kind"),
    (json.dumps({"schema": 1, "target": "pre-fix", "kind": "value", "message": "x",
                 "scenario": {"max_num_reqs": 0}}), "bad scenario"),
])
def test_bad_files_name_the_file(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(corpus.CorpusError, match=message) as err:
        corpus.load(p)
    assert str(p) in str(err.value)
