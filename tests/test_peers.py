"""bench/peers.py: the CPU line, bad input, the scenario set, and the table's
logic on synthetic cells; the workers' path on CPU; a short real run on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402 - bench/peers.py, a script beside its helpers

from streamfuzz.fuzz import protocol as protocols  # noqa: E402

DRAFT = protocols.get("draft-broadcast")
WEIGHTS = protocols.get("weight-sync")


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    got = _run("--out", str(tmp_path / "out"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().splitlines() == [peers.NO_GPU]


@pytest.mark.parametrize("args, line", [
    (["--examples", "0"], "bench-peers: --examples must be at least 1"),
    (["--reps", "-1"], "bench-peers: --reps must be at least 1"),
    (["--budget", "5"],
     "bench-peers: --budget must be at least 30 s and --sanitizer-s at least 16 s"),
    (["--checkers", "none,valgrind"], "bench-peers: unknown checker valgrind: use "
                                      + ", ".join(peers.CHECKERS)),
    (["--budget", "soon"], "bench-peers: argument --budget: invalid float value: 'soon'"),
    (["--frobnicate"], "bench-peers: unrecognized arguments: --frobnicate"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys, args, line):
    assert peers.main(["--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [line]
    assert not (tmp_path / "out").exists()


def test_an_unknown_target_is_one_line_and_exit_2_from_the_command_line(tmp_path):
    got = _run("--out", str(tmp_path / "out"), "--targets", "pre-fix,no-such-target")
    assert got.returncode == 2
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench-peers: unknown target 'no-such-target'")


# -- the scenario set --------------------------------------------------------------
def test_the_drawn_scenarios_are_the_same_for_a_seed_and_differ_between_seeds():
    for protocol in (DRAFT, WEIGHTS):
        a = [s.to_dict() for s in peers.drawn(protocol, 6, seed=3)]
        b = [s.to_dict() for s in peers.drawn(protocol, 6, seed=3)]
        assert a == b and len(a) == 6
        assert all(s["world_size"] == 1 for s in a)
        assert a != [s.to_dict() for s in peers.drawn(protocol, 6, seed=4)]


def test_the_plan_puts_corpus_entries_first_at_world_size_1_and_is_deterministic():
    names = ["pre-fix", "main-gather", "weight-sync-unordered", "receiver-no-wait"]
    first, notes = peers.plan(names, ROOT / "corpus", 4, 0)
    again, _ = peers.plan(names, ROOT / "corpus", 4, 0)
    assert [(t.name, t.scenarios) for t in first] == [(t.name, t.scenarios) for t in again]
    assert notes == []
    by = {t.name: t for t in first}
    corpus = sorted(p.stem for p in (ROOT / "corpus" / "pre-fix").glob("*.json"))
    labels = [label for label, _ in by["pre-fix"].scenarios]
    assert labels == [f"corpus {c}" for c in corpus] + [f"drawn {i}" for i in range(1, 5)]
    assert all(s["world_size"] == 1 for _, s in by["pre-fix"].scenarios)
    # The drawn part is the same for every target of a protocol.
    assert by["main-gather"].scenarios == by["pre-fix"].scenarios[len(corpus):]
    assert by["weight-sync-unordered"].protocol == "weight-sync"
    assert [t.truth for t in first] == ["bug", "correct", "bug", "receiver"]


def test_truth_follows_the_protocols_and_the_corpus():
    assert peers.truth("main-gather-synced", DRAFT, 0)[0] == "correct"
    assert peers.truth("weight-sync-consumer-no-drain", WEIGHTS, 0)[0] == "receiver"
    assert peers.truth("staging-buffer", DRAFT, 0)[0] == "bug"
    assert peers.truth("vllm-pp@0.32.0", DRAFT, 2)[0] == "bug"
    assert peers.truth("vllm-pp@0.34.0", DRAFT, 0)[0] == "correct"
    assert peers.truth("tests.targets:shifted_rows", DRAFT, 0)[0] == "unknown"


def test_without_holds_leaves_out_every_delay_and_hold_and_nothing_else():
    draft = peers.drawn(DRAFT, 12, seed=0)
    weights = peers.drawn(WEIGHTS, 12, seed=0)
    assert any(st.delays for s in draft for st in s.steps)
    assert any(sy.holds for s in weights for sy in s.syncs)
    for s in draft:
        bare = peers.without_holds(s)
        assert not any(st.delays for st in bare.steps)
        assert [st.churn for st in bare.steps] == [st.churn for st in s.steps]
        assert [st.idx_mapping for st in bare.steps] == [st.idx_mapping for st in s.steps]
    for s in weights:
        bare = peers.without_holds(s)
        assert not any(sy.holds for sy in bare.syncs) and bare.params == s.params


# -- the verdicts and the table, on synthetic cells ------------------------------------
def _cell(checker: str, **kw) -> dict:
    return {"checker": checker, "examples": 10, "found": 0, "first": None, "value": 0,
            "wall_s": 0.1, "cut": None, "error": None, **kw}


@pytest.mark.parametrize("truth, cell, want", [
    ("bug", _cell("csan", found=3, first=2), "found"),
    ("bug", _cell("csan"), "missed"),
    ("correct", _cell("stress", found=1, first=7), "false positive"),
    ("correct", _cell("stress"), "clean"),
    ("unknown", _cell("none", found=1, first=1), "found (no ground truth)"),
    ("unknown", _cell("none"), "clean (no ground truth)"),
    ("bug", _cell("memcheck", examples=0, error="killed before it started"), "error"),
    ("bug", _cell("streamfuzz", examples=0, cut="time"), "not run (time)"),
    ("bug", {"checker": "racecheck", "skipped": "budget"}, "not run (budget)"),
    ("bug", _cell("stress", found=1, first=4, error=None), "found"),
])
def test_verdicts(truth, cell, want):
    assert peers.verdict(truth, cell) == want


def _report(cells: list[dict]) -> dict:
    targets = [{"name": "pre-fix", "truth": "bug", "note": ""},
               {"name": "main-gather", "truth": "correct", "note": ""},
               {"name": "early-event", "truth": "receiver", "note": "receiving side"}]
    return {"device": "cuda", "device_name": "GPU", "torch": "t", "code": "c", "date": "d",
            "targets": targets, "notes": ["memcheck, racecheck: not on this node"],
            "cells": cells}


def test_rows_give_ratios_to_the_baseline_and_say_why_a_target_did_not_run():
    cells = [
        {"target": "pre-fix", **_cell("stress", examples=100, wall_s=1.0, found=2, first=40,
                                      kind="value", message="step 0: wrong")},
        {"target": "pre-fix", **_cell("none", examples=10, wall_s=0.05)},
        {"target": "pre-fix", **_cell("streamfuzz", examples=10, wall_s=0.2, found=10, first=1,
                                      kind="lifetime", message="idx_mapping freed")},
        {"target": "pre-fix", **_cell("csan", examples=10, wall_s=0.1, value=3)},
        {"target": "main-gather", **_cell("none", examples=10, wall_s=0.04)},
        {"target": "main-gather", **_cell("csan", found=1, first=3, kind="csan",
                                          message="Unsynchronized access")},
    ]
    rows = peers.rows(_report(cells))
    assert [r[:3] for r in rows] == [
        ["pre-fix", "none", "missed"], ["pre-fix", "streamfuzz", "found"],
        ["pre-fix", "csan", "missed"], ["pre-fix", "stress", "found"],
        ["main-gather", "none", "clean"], ["main-gather", "csan", "false positive"],
        ["early-event", "-", "not run"]]
    stress = rows[3]
    assert stress[3:7] == ["40", "100 reps", "10.00", "2.00"]  # 10 ms against 5 ms
    assert rows[1][5:7] == ["20.00", "4.00"]
    assert "value oracle: 3 wrong" in rows[2][7]
    assert rows[-1][7] == "receiving side"


def test_the_markdown_is_one_pasteable_table_and_names_a_peer_that_beat_streamfuzz():
    cells = [{"target": "pre-fix", **_cell("none")},
             {"target": "pre-fix", **_cell("streamfuzz")},
             {"target": "pre-fix", **_cell("stress", found=1, first=9, kind="value",
                                           message="a | b")}]
    text = peers.markdown(_report(cells))
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0].startswith("| target | checker | verdict |") and table[1].startswith("|---")
    assert len(table) == 2 + 3 + 1  # three cells, the receiver's row
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "- stress found a bug in `pre-fix` that streamfuzz missed: a bug for streamfuzz." in text
    assert "- memcheck, racecheck: not on this node" in text
    clean = peers.markdown(_report(cells[:2]))
    assert "No peer found a bug that streamfuzz missed." in clean


def _log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _ev(**kw) -> str:
    return peers.MARK + json.dumps(kw)


def test_compute_sanitizer_output_is_counted_and_placed_at_its_example():
    text = _log("========= COMPUTE-SANITIZER", _ev(event="ready"),
                _ev(event="example", checker="none", i=1),
                _ev(event="example", checker="none", i=2),
                "========= Invalid __global__ read of size 8 bytes",
                "=========     at index_kernel+0x10", _ev(event="example", checker="none", i=3),
                "========= ERROR SUMMARY: 2 errors")
    got = peers.sanitizer_verdict(text)
    assert got["tool_errors"] == 2 and got["first"] == 2
    assert got["message"] == "Invalid __global__ read of size 8 bytes"
    clean = peers.sanitizer_verdict(_log("========= COMPUTE-SANITIZER",
                                         "========= RACECHECK SUMMARY: 0 hazards displayed "
                                         "(0 errors, 0 warnings)"))
    assert clean["tool_errors"] == 0 and clean["first"] is None
    assert "RACECHECK SUMMARY 0" in clean["summary"]


def test_reports_before_the_first_example_are_the_processs_start_never_a_finding():
    start_only = peers.sanitizer_verdict(_log(
        "========= COMPUTE-SANITIZER", "========= Program hit cudaErrorInvalidValue on call",
        "========= Invalid __global__ read of size 4 bytes", "=========     at nccl_init+0x1",
        _ev(event="ready"), _ev(event="example", checker="none", i=1),
        "========= ERROR SUMMARY: 16 errors"))
    assert start_only["tool_errors"] == 0 and start_only["first"] is None
    assert "2 report(s) before the first example, not counted" in start_only["summary"]
    later = peers.sanitizer_verdict(_log(
        "========= Invalid __global__ read of size 4 bytes", _ev(event="example", i=1),
        _ev(event="example", i=2), "========= Invalid __global__ write of size 8 bytes",
        "========= ERROR SUMMARY: 2 errors"))
    assert later["tool_errors"] == 1 and later["first"] == 2


def test_a_process_that_dies_is_a_crash_where_crashes_count_and_an_error_elsewhere():
    events = [{"event": "ready"}, {"event": "start", "checker": "none"},
              {"event": "result", **_cell("none")}, {"event": "start", "checker": "stress"},
              {"event": "example", "checker": "stress", "i": 1},
              {"event": "example", "checker": "stress", "i": 2}]
    got = peers.settle(["none", "stress"], events, "boom\n", -6)
    assert [(r["checker"], r["found"], r.get("first")) for r in got] == [
        ("none", 0, None), ("stress", 1, 2)]
    assert got[1]["kind"] == "crash" and "exit -6" in got[1]["message"]
    csan = peers.settle(["csan"], [{"event": "start", "checker": "csan"},
                                   {"event": "example", "checker": "csan", "i": 1}], "", -6)
    assert csan[0]["found"] == 0 and "exit -6" in csan[0]["error"]
    killed = peers.settle(["streamfuzz"], [{"event": "start", "checker": "streamfuzz"}], "", None)
    assert killed[0]["error"].startswith("killed at its bound") and killed[0]["cut"] == "killed"
    # A checker after the one that crashed is left for the next process.
    assert peers.settle(["none", "stress"], events[:3] + [{"event": "start",
                                                           "checker": "none"}], "", 3)[1:] == []
    never = peers.settle(["none"], [], "ImportError: x\n", 1)
    assert never[0]["error"].startswith("the process did not start (exit 1)")


# -- the workers, for real, on CPU (streamfuzz and the baseline run there) --------------
def test_on_cpu_workers_run_cells_in_turn_and_a_killed_one_does_not_stop_the_bench(tmp_path):
    args = peers.parse(["--out", str(tmp_path), "--targets",
                        "pre-fix,tests.targets:kills_rank,main-gather,receiver-no-wait",
                        "--examples", "3", "--checkers", "none,streamfuzz", "--budget", "240"])
    report = peers.bench(args, "cpu")
    cells = {(c["target"], c["checker"]): c for c in report["cells"]}
    assert peers.verdict("bug", cells["pre-fix", "streamfuzz"]) == "found"
    assert cells["pre-fix", "streamfuzz"]["first"] == 1  # its corpus entry, first in line
    assert peers.verdict("correct", cells["main-gather", "streamfuzz"]) == "clean"
    assert peers.verdict("correct", cells["main-gather", "none"]) == "clean"
    kill = cells["tests.targets:kills_rank", "none"]
    assert kill["kind"] == "crash" and "exit -9" in kill["message"]
    assert cells["tests.targets:kills_rank", "streamfuzz"]["kind"] == "crash"  # a new process
    lines = (tmp_path / "peers.jsonl").read_text().splitlines()
    assert len(lines) == len(report["cells"]) == 6
    assert json.loads((tmp_path / "peers.json").read_text())["cells"] == report["cells"]
    assert "| receiver-no-wait | - | not run |" in (tmp_path / "peers.md").read_text()


# -- on a GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_short_real_run_on_a_gpu(tmp_path):
    got = _run("--out", str(tmp_path), "--targets", "pre-fix,main-gather", "--examples", "2",
               "--reps", "2", "--budget", "240", "--sanitizer-examples", "1",
               "--sanitizer-s", "60")
    assert got.returncode == 0, got.stdout + got.stderr
    report = json.loads((tmp_path / "peers.json").read_text())
    cells = {(c["target"], c["checker"]): c for c in report["cells"]}
    assert peers.verdict("bug", cells["pre-fix", "streamfuzz"]) == "found"
    assert peers.verdict("correct", cells["main-gather", "streamfuzz"]) == "clean"
    want = {"none", "streamfuzz", "csan", "stress"} | (
        set(peers.SANITIZERS) if report["sanitizer"] else set())
    for target in ("pre-fix", "main-gather"):
        assert {c for t, c in cells if t == target} == want
        for checker in ("none", "csan", "stress"):
            assert not cells[target, checker].get("skipped"), cells[target, checker]
    assert report["device_name"] and "| pre-fix | streamfuzz | found |" in got.stdout
