"""Coverage in every verdict: which of the protocol's handler methods ran, how
often and on which ranks, counted on the ranks; a clean line says what never ran."""

from __future__ import annotations

import json

from streamfuzz.fuzz import cli, driver
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.coverage import Coverage

DRAFT = protocols.get("draft-broadcast")
WEIGHTS = protocols.get("weight-sync")


def test_what_never_ran_is_named_with_why():
    one = Coverage(DRAFT, world_size=1, device="cuda")
    one.add({0: {"broadcast_drafts": 3}})
    assert one.never_ran() == {"receive_drafts": "world size 1",
                               "apply_received": "world size 1"}
    assert one.note() == (" (receive_drafts never ran: world size 1; "
                          "apply_received never ran: world size 1)")
    assert "--device cpu --world-size 2" in one.unchecked()
    assert "receive_drafts, apply_received" in one.unchecked()
    # Two ranks, and a consumer whose handler never called the load callback.
    two = Coverage(WEIGHTS, world_size=2)
    for _ in range(4):
        two.add({0: {"send": 1}, 1: {"receive": 1}})
    assert two.never_ran() == {"load": "not called on the other ranks in 4 examples"}
    assert two.unchecked() is None
    assert two.to_dict()["calls"] == {"send": {"0": 4}, "receive": {"1": 4}, "load": {}}


def test_the_counts_are_the_calls_each_rank_made(cpu_pool, ci_settings):
    res = driver.fuzz(cpu_pool, "main-gather", ci_settings, max_examples=15, seed=0)
    calls = res.coverage.calls
    # The last rank sends, the other receives: each count comes from its own rank.
    assert set(calls["broadcast_drafts"]) == {1} and set(calls["receive_drafts"]) == {0}
    assert calls["broadcast_drafts"][1] == calls["receive_drafts"][0] >= res.examples
    assert 0 < calls["apply_received"][0] <= calls["receive_drafts"][0]
    assert res.coverage.never_ran() == {} and res.coverage.examples == res.examples
    ws = driver.fuzz(cpu_pool, "weight-sync-ordered", ci_settings, max_examples=10, seed=0)
    assert set(ws.coverage.calls) == {"send", "receive", "load"}
    assert set(ws.coverage.calls["load"]) == {1} and ws.coverage.never_ran() == {}


def test_a_clean_run_at_world_size_one_says_the_receivers_never_ran(tmp_path, capsys):
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--target", "receiver-no-record", "--world-size", "1", "--device",
                   "cpu", "--max-examples", "20", "--seed", "0", "--profile", "ci",
                   "--corpus", str(tmp_path / "c"), "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("receiver-no-record: clean"))
    assert "clean over 20 examples (receive_drafts never ran: world size 1;" in line
    assert "the receiver side (receive_drafts, apply_received" in out
    assert "is unchecked" in out and "--world-size 2" in out
    cov = json.loads(report.read_text())["coverage"]["receiver-no-record"]
    assert cov["calls"]["broadcast_drafts"]["0"] >= 20 and cov["calls"]["receive_drafts"] == {}
    assert cov["never_ran"] == {"receive_drafts": "world size 1",
                                "apply_received": "world size 1"}
