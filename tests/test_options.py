"""One RunOptions from the command line to every rank: each command sends the
oracles it was asked for (``all`` is every oracle), and corpus entries record
them so that a replay judges the same way."""

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamfuzz.fuzz import cli, corpus
from streamfuzz.fuzz.commands import run as run_cmd
from streamfuzz.fuzz.options import DEFAULT, Hold, OptionsError, Oracle, RunOptions, parse_oracles
from tests.helpers import ROOT, fuzz_cli

ALL = frozenset(o.value for o in Oracle)
ON_CPU = ALL - {"reuse"}
"""What ``all`` runs on CPU ranks, as they report it: the reuse watch needs CUDA."""

def test_all_is_every_oracle_and_names_are_validated_in_one_place():
    assert parse_oracles("all") == frozenset(Oracle) == DEFAULT.oracles
    assert parse_oracles("value,lifetime") == {Oracle.VALUE, Oracle.LIFETIME}
    assert parse_oracles(["reuse", "value"]) == {Oracle.REUSE, Oracle.VALUE}
    assert RunOptions(oracles=["lifetime"], hold="spin") == \
        RunOptions(oracles={Oracle.LIFETIME}, hold=Hold.SPIN)
    with pytest.raises(OptionsError, match="unknown oracle 'valu': use all, value"):
        RunOptions(oracles=["valu"])
    with pytest.raises(OptionsError, match="unknown hold 'wait'"):
        RunOptions(hold="wait")


def test_options_cross_the_process_boundary_and_the_corpus_unchanged():
    opts = RunOptions(oracles={Oracle.LIFETIME, Oracle.REUSE}, hold=Hold.SPIN)
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert RunOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    # An entry written before oracles were recorded was found by the value oracle.
    assert RunOptions.from_dict({}).oracles == {Oracle.VALUE}


def test_a_bad_oracle_on_the_command_line_is_one_line_and_exit_2():
    out = fuzz_cli("run", "--oracle", "lifetime,nope", timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "unknown oracle 'nope'" in out.stderr


def _ran(seen, target=None):
    return {o for t, o in seen if target is None or t == target}


def test_run_sends_every_oracle_by_default_and_replay_judges_with_them(rank_oracles,
                                                                       tmp_path, capsys):
    report = tmp_path / "r.json"
    code = cli.main(["run", "--target", "pre-fix", "--device", "cpu", "--max-examples", "200",
                     "--seed", "0", "--profile", "ci", "--corpus", str(tmp_path / "c"),
                     "--report", str(report)])
    assert code == 1
    assert _ran(rank_oracles) == {ON_CPU}
    data = json.loads(report.read_text())
    # The report says what ran, as the ranks and the corpus entry do: no reuse on CPU.
    assert data["oracles"] == sorted(ON_CPU) and data["hold"] == "gate"
    (failure,) = data["failures"]
    assert failure["kind"] == "lifetime"
    entry = corpus.load(failure["corpus_path"])
    assert set(entry.found_on["oracles"]) == ON_CPU and entry.found_on["hold"] == "gate"

    rank_oracles.clear()
    capsys.readouterr()
    assert cli.main(["replay", "--device", "cpu", failure["corpus_path"]]) == 0
    assert "still fails (lifetime" in capsys.readouterr().out
    assert _ran(rank_oracles, "pre-fix") == {ON_CPU}


@pytest.mark.parametrize("device, ran", [("cpu", ON_CPU), ("cuda", ALL)])
def test_the_run_report_lists_the_oracles_that_run_on_its_device(tmp_path, device, ran):
    report = tmp_path / "r.json"
    run_cmd.write_report(report, [], device, 2, 0, DEFAULT)
    assert json.loads(report.read_text())["oracles"] == sorted(ran)


def test_run_and_replay_send_only_the_oracles_asked_for(rank_oracles, tmp_path):
    assert cli.main(["run", "--target", "main-gather", "--device", "cpu", "--max-examples",
                     "3", "--seed", "0", "--profile", "ci", "--oracle", "lifetime",
                     "--corpus", str(tmp_path)]) == 0
    assert _ran(rank_oracles) == {frozenset({"lifetime"})}


def test_replay_of_an_entry_without_recorded_oracles_uses_the_value_oracle(rank_oracles,
                                                                          tmp_path):
    (path,) = sorted((ROOT / "corpus" / "pre-fix").glob("lifetime-*.json"))[:1]
    entry = corpus.load(path)
    legacy = corpus.Entry(target=entry.target, kind=entry.kind, message=entry.message,
                          scenario=entry.scenario,
                          found_on={k: v for k, v in entry.found_on.items() if k != "oracles"})
    # The value oracle cannot see pre-fix's bug on CPU: the replay disagrees.
    assert cli.main(["replay", "--device", "cpu", str(corpus.save(tmp_path, legacy))]) == 1
    assert _ran(rank_oracles) == {frozenset({"value"})}


def test_matrix_all_column_sends_every_oracle(rank_oracles, capsys):
    assert cli.main(["matrix", "--device", "cpu", "--oracle", "all", "--oracle", "value",
                     "--target", "main-gather", "--max-examples", "3"]) == 0
    assert _ran(rank_oracles) == {ON_CPU, frozenset({"value"})}
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert ["main-gather", "all"] in [r[:2] for r in rows]


def _soak_args(out, *more):
    return ["soak", "--device", "cpu", "--out", str(out), "--corpus", str(out / "corpus"),
            "--stats-every", "1s", "--recycle-mib", "0", *map(str, more)]


def test_soak_sends_every_oracle_and_its_entries_record_them(rank_oracles, tmp_path):
    out = tmp_path / "soak"
    code = cli.main(_soak_args(out, "--budget", "6s", "--round", "3s", "--shrink", "3s",
                               "--target", "pre-fix"))
    assert code == 1
    assert _ran(rank_oracles) == {ON_CPU}
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["oracles"] == sorted(ALL)
    assert rep["failures"] and all(f["kind"] == "lifetime" for f in rep["failures"])
    for f in rep["failures"]:
        assert set(corpus.load(Path(f["path"])).found_on["oracles"]) == ON_CPU


def test_soak_recovery_replays_the_example_in_flight_with_the_runs_oracles(
        rank_oracles, tmp_path, monkeypatch):
    """The driver is killed (-9) while its first broadcasting example hangs; the
    next start replays that example with every oracle, finds pre-fix's lifetime
    bug in it (the value oracle alone cannot, on CPU) and saves it."""
    out, marker = tmp_path / "soak", tmp_path / "hung"
    monkeypatch.setenv("STREAMFUZZ_TEST_HANG_ONCE", str(marker))
    args = _soak_args(out, "--target", "tests.targets:hangs_once_then_pre_fix")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "streamfuzz", *args, "--budget", "10m",
                             "--timeout", "600"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():  # the example that hangs is now in flight
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.kill()  # no handler, no cleanup
        proc.wait()
    journaled = json.loads((out / "journal.json").read_text())["scenarios"]

    state = json.loads((out / "state.json").read_text())
    monkeypatch.chdir(ROOT)
    code = cli.main([*args, "--budget", f"{int(state['elapsed_s']) + 4}s", "--round", "2s",
                     "--shrink", "2s"])
    assert code == 1
    assert rank_oracles[0][1] == ON_CPU  # the replay of the example in flight
    rep = json.loads((out / "report.json").read_text())
    recovered = [f for f in rep["failures"] if f["recovered"]]
    assert [f["kind"] for f in recovered] == ["lifetime"], rep["failures"]
    entry = corpus.load(Path(recovered[0]["path"]))
    assert entry.scenario.to_dict() in journaled and set(entry.found_on["oracles"]) == ON_CPU


def test_a_run_that_cannot_judge_is_refused_in_one_place():
    with pytest.raises(OptionsError, match="no oracle given"):
        RunOptions(oracles=()).judging("cpu")
    with pytest.raises(OptionsError, match="reuse sees nothing on cpu"):
        RunOptions(oracles={Oracle.REUSE}).judging("cpu")
    assert RunOptions(oracles={Oracle.REUSE}).judging("cuda") == []
    (note,) = RunOptions(oracles={Oracle.REUSE, Oracle.LIFETIME}).judging("cpu")
    assert "reuse" in note and "lifetime judge alone" in note and "\n" not in note
    assert DEFAULT.judging("cpu") == []  # all: every oracle that applies here


@pytest.mark.parametrize("oracle, says", [("", "no oracle given"), (",", "no oracle given"),
                                          ("reuse", "reuse sees nothing on cpu")])
def test_a_run_with_no_working_oracle_is_bad_input(oracle, says, tmp_path):
    out = fuzz_cli("run", "--target", "pre-fix", "--device", "cpu", "--max-examples", "5",
                   "--oracle", oracle, "--corpus", tmp_path / "c", "--report", tmp_path / "r.json",
                   timeout=120)
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "c").exists()


def test_an_oracle_blind_on_the_device_beside_others_gets_a_note(tmp_path):
    out = fuzz_cli("run", "--target", "pre-fix", "--device", "cpu", "--max-examples", "50",
                   "--seed", "0", "--profile", "ci", "--oracle", "reuse,lifetime",
                   "--corpus", tmp_path / "c", timeout=300)
    assert out.returncode == 1, out
    notes = [ln for ln in out.stderr.splitlines() if "sees nothing on cpu" in ln]
    assert len(notes) == 1 and "lifetime judge alone" in notes[0], out.stderr
