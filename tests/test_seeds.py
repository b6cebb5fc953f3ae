"""The same seed gives the same run in two fresh driver processes: the same
examples in the same order, the same first failure, the same corpus file."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

_DRIVER = """
import hashlib, json, sys
from pathlib import Path
if sys.argv[2]:
    __import__(sys.argv[2])
from streamfuzz.fuzz import driver, profiles
from streamfuzz.fuzz.ranks import RankPool
out = {}
with RankPool(2, "cpu", timeout=60) as pool:
    for target in ("main-gather", "tests.targets:shifted_rows"):
        seen = []
        res = driver.fuzz(pool, target, profiles.get("ci"), max_examples=200, seed=7,
                          corpus_dir=Path(sys.argv[1]),
                          on_example=lambda f: seen.append(json.dumps(f[-1].to_dict(),
                                                                      sort_keys=True)))
        out[target] = {"examples": [hashlib.sha1(e.encode()).hexdigest() for e in seen],
                       "first": res.first_failure_examples,
                       "kind": res.failure.kind if res.failure else None,
                       "entry": res.corpus_path.read_text() if res.corpus_path else None,
                       "corpus": res.corpus_path.name if res.corpus_path else None}
print(json.dumps(out))
"""


def _run(tmp: Path, name: str, extra: str = "") -> dict:
    out = tmp / name
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp)]))
    res = subprocess.run([sys.executable, "-c", _DRIVER, str(out / "corpus"), extra],
                         cwd=out.mkdir() or out, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_same_seed_gives_the_same_run_in_two_fresh_processes(tmp_path):
    # The second process also imports a module of its own, with a few numbers
    # in it, as a longer target list, another command or another checkout
    # would: what it imports must not steer the examples.
    (tmp_path / "elsewhere.py").write_text("LIMITS = (120, 255, 1000, 4000, 30000, 65535)\n")
    one = _run(tmp_path, "one")
    two = _run(tmp_path, "two", extra="elsewhere")
    clean, found = one["main-gather"], one["tests.targets:shifted_rows"]
    assert clean["kind"] is None and len(clean["examples"]) == 200
    assert found["kind"] == "value" and found["corpus"]
    assert one == two
