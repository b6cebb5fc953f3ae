import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "fuzz", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args, message", [
    (["run", "--target", "no-such-target"], "unknown target 'no-such-target'"),
    (["run", "--target", "tests.nowhere:f"], "cannot import 'tests.nowhere'"),
    (["run", "--target", "tests.targets:not_callable"], "is not callable"),
    (["run", "--world-size", "0"], "must be >= 1"),
    (["run", "--max-examples", "many"], "is not an integer"),
    (["run", "--device", "tpu"], "invalid choice"),
    (["run", "--device", "cuda", "--target", "pre-fix"], "no CUDA GPU"),
])
def test_bad_usage_is_one_line_and_exit_2(args, message):
    if "cuda" in args:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible")
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr


def test_bad_corpus_file_is_named_and_nothing_is_touched(tmp_path):
    good = tmp_path / "keep.json"
    good.write_text("{}")
    bad = tmp_path / "future.json"
    bad.write_text(json.dumps({"schema": 7}))
    out = _cli("replay", bad)
    assert out.returncode == 2 and str(bad) in out.stderr and "newer" in out.stderr
    assert good.read_text() == "{}"


def test_run_finds_saves_and_reports_then_replay_confirms(tmp_path):
    report = tmp_path / "r.json"
    out = _cli("run", "--target", "tests.targets:shifted_rows", "--device", "cpu",
               "--max-examples", "200", "--seed", "3", "--profile", "ci",
               "--corpus", tmp_path / "corpus", "--report", report)
    assert out.returncode == 1, out.stderr + out.stdout
    data = json.loads(report.read_text())
    for key in ("target", "device", "world_size", "examples", "elapsed_s", "examples_per_s"):
        assert key in data
    assert data["device"] == "cpu" and data["world_size"] == 2
    (failure,) = data["failures"]
    assert failure["kind"] == "value" and Path(failure["corpus_path"]).exists()
    assert "FOUND value" in out.stdout
    rep = _cli("replay", failure["corpus_path"], "--device", "cpu")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "still fails" in rep.stdout


def test_replay_of_a_missing_path_is_one_line():
    out = _cli("replay", "no/such/dir")
    assert out.returncode == 2 and "no/such/dir: no such file or directory" in out.stderr


def test_matrix_prints_cells_and_fails_on_a_miss():
    ok = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--target", "pre-fix",
              "--target", "main-gather", "--max-examples", "30", "--seeds", "1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pre-fix" in ok.stdout and "found lifetime 1/1" in ok.stdout
    assert "clean 1/1" in ok.stdout
    # A buggy target the lifetime oracle cannot see (wrong values, no stream bug) is a miss.
    miss = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--target",
                "tests.targets:shifted_rows", "--max-examples", "20", "--seeds", "1")
    assert miss.returncode == 1 and "FAIL: tests.targets:shifted_rows x lifetime" in miss.stdout
