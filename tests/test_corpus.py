import json
import os
import signal
import subprocess
import sys
import time

import pytest

from streamfuzz.fuzz import corpus
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from tests.helpers import ROOT


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


def test_an_entry_already_there_is_kept_as_it_is(tmp_path):
    """Finding a committed regression again must not rewrite it (nor its mode)."""
    path = corpus.save(tmp_path, _entry())
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    before = path.read_bytes()
    again = corpus.Entry(**{**_entry().__dict__, "message": "found again elsewhere",
                            "found_on": {"device": "cpu", "torch": "other"}})
    assert corpus.save(tmp_path, again) == path and path.read_bytes() == before
    flaky = corpus.Entry(**{**_entry().__dict__, "flaky": True})
    assert corpus.save(tmp_path, flaky) == path and corpus.load(path).flaky


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_save_sweeps(tmp_path):
    # A real kill between the temporary file's write and its rename.
    code = ("import os, signal, sys; from pathlib import Path; from streamfuzz.fuzz import corpus; "
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL); "
            "corpus.write_json_atomic(Path(sys.argv[1]), {'a': 1})")
    target = tmp_path / "pre-fix" / "value-0.json"
    target.parent.mkdir()
    out = subprocess.run([sys.executable, "-c", code, str(target)], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == -signal.SIGKILL
    (stale,) = [p for p in target.parent.iterdir() if p.name.startswith(".")]
    assert not target.exists()
    # A young one may be a live writer's on a shared corpus: kept.
    corpus.save(tmp_path, _entry())
    assert stale.exists()
    old = time.time() - corpus.STALE_TEMP_S - 1
    os.utime(stale, (old, old))
    legacy = target.parent / ".value-1.json.abc123"  # the name earlier versions used
    legacy.write_text("{")
    os.utime(legacy, (old, old))
    corpus.save(tmp_path, _entry())
    assert not stale.exists() and not legacy.exists()
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".")] == []
