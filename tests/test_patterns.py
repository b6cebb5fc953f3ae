"""The correct patterns of ``bench/patterns.py`` are correct: clean on CPU, both
sides of the broadcast run (their speed on a GPU is the bench's to measure)."""

import os
import subprocess
import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT))

from bench.patterns import PATTERNS  # noqa: E402


def test_every_pattern_is_clean_on_simulated_streams(tmp_path):
    targets = [a for name in PATTERNS
               for a in ("--target", f"{ROOT}/bench/patterns.py:{PATTERNS[name].__name__}")]
    res = subprocess.run([sys.executable, "-m", "streamfuzz", "run", "--device", "cpu",
                          "--max-examples", "25", "--seed", "3", "--corpus",
                          str(tmp_path / "corpus"), *targets],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    for name in PATTERNS:
        assert f"{PATTERNS[name].__name__}: clean over 25 examples" in res.stdout, res.stdout


def test_the_bench_runs_every_pattern_and_writes_its_table(tmp_path):
    res = subprocess.run([sys.executable, "bench/patterns.py", "--device", "cpu",
                          "--examples", "5", "--seeds", "1", "--out", str(tmp_path)],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    table = (tmp_path / "patterns.md").read_text()
    for name in ["main-gather", *PATTERNS]:
        assert f"| {name} | " in table, table
