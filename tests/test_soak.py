"""Soak campaigns: crashes, hangs and kills lose no failure; stops are clean.

Budgets are seconds here; the 30-minute run is behind ``-m slow``.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from streamfuzz.fuzz import corpus, rank_main, soak_report
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.soak import Soak, SoakConfig, parse_budget, read_samples
from tests.helpers import ROOT

PY = sys.executable


def _scenario(num_reqs: int) -> Scenario:
    step = Step(idx_mapping=tuple(range(num_reqs)), final=(True,) * num_reqs,
                num_sampled=(1,) * num_reqs, num_rejected=(0,) * num_reqs)
    return Scenario(world_size=2, max_num_reqs=max(num_reqs, 1), steps=(step,))


def _cfg(tmp_path, targets, budget, **kw):
    kw.setdefault("stats_every_s", 1.0)
    return SoakConfig(targets=targets, budget_s=budget, out=tmp_path / "out",
                      corpus=tmp_path / "corpus", database=tmp_path / "db", **kw)


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo")


def _soak_cli(*args):
    return [PY, "-m", "streamfuzz", "soak", "--device", "cpu", *map(str, args)]


def _no_partial_files(*dirs):
    for d in dirs:
        leftovers = [p for p in Path(d).rglob(".*") if p.is_file()]
        assert not leftovers, leftovers


def _wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("10m", 600), ("8h", 28800),
                                           ("1.5h", 5400), ("45", 45)])
def test_budget_parsing(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("bad", ["", "8x", "-1h", "0s", "h", "10 minutes"])
def test_bad_budget_is_rejected(bad):
    with pytest.raises(ValueError):
        parse_budget(bad)


def test_bad_budget_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run(_soak_cli("--budget", "8x", "--out", tmp_path), env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'8x' is not a duration" in lines[0]


def test_killed_rank_is_recorded_and_the_campaign_goes_on(tmp_path):
    narrow = st.sampled_from([_scenario(1), _scenario(2), _scenario(3)])
    # One round each, bounded by examples (the times only guard the test): the
    # crash round ends once its failure is shrunk, however slow restarts are.
    cfg = _cfg(tmp_path, ["tests.targets:kills_rank", "main-gather"], 1800.0, round_s=600.0,
               round_examples=30, shrink_s=600.0, max_rounds=2, strategy=narrow)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
        assert pool.restarts >= 1
    assert rep["stop_reason"] == "rounds done"
    assert rep["failures_by_kind"].get("crash", 0) >= 1
    crash = next(f for f in rep["failures"] if f["kind"] == "crash" and f["shrunk"])
    assert "killed by SIGKILL" in crash["message"] and not crash["flaky"]
    entry = corpus.load(Path(crash["path"]))
    assert entry.kind == "crash" and entry.scenario.steps[0].num_reqs == 2  # shrunk
    # After the crash the other target still ran.
    assert rep["targets"]["main-gather"]["examples"] > 0
    assert rep["rank_restarts"] >= 1
    _no_partial_files(tmp_path)


def test_hung_rank_is_recorded_and_the_ranks_replaced(tmp_path):
    cfg = _cfg(tmp_path, ["tests.targets:hangs", "main-gather"], 1800.0, round_s=600.0,
               round_examples=30, shrink_s=600.0, max_rounds=2,
               strategy=st.just(_scenario(4)))
    with RankPool(2, "cpu", timeout=6.0) as pool:
        first = pool.pids
        rep = Soak(pool, cfg, stream=sys.stdout).run()
        assert set(pool.pids).isdisjoint(first)
    hang = next(f for f in rep["failures"] if f["kind"] == "hang")
    assert corpus.load(Path(hang["path"])).kind == "hang"
    assert rep["targets"]["main-gather"]["examples"] > 0
    _no_partial_files(tmp_path)


def test_failure_that_does_not_reproduce_is_kept_as_flaky(tmp_path):
    cfg = _cfg(tmp_path, ["tests.targets:fails_once"], 20.0,
               strategy=st.sampled_from([_scenario(1), _scenario(3)]))
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
    assert rep["flaky"] >= 1
    (d,) = rep["distinct_failures"]
    assert d["flaky_occurrences"] >= 1 and corpus.load(Path(d["path"])).flaky


def test_the_heap_is_released_at_most_once_a_minute_not_after_every_round(
        tmp_path, monkeypatch):
    from streamfuzz.fuzz.soak import campaign as soak_mod

    released = []
    monkeypatch.setattr(soak_mod, "_release_heap", lambda: released.append(time.monotonic()))
    with RankPool(2, "cpu", timeout=20.0) as pool:
        cfg = _cfg(tmp_path / "a", ["main-gather"], 600.0, round_examples=3, max_rounds=4)
        Soak(pool, cfg, stream=sys.stdout).run()
        assert released == []  # four rounds in well under a minute
        monkeypatch.setattr(soak_mod, "_RELEASE_EVERY_S", 0.0)
        cfg = _cfg(tmp_path / "b", ["main-gather"], 600.0, round_examples=3, max_rounds=4)
        Soak(pool, cfg, stream=sys.stdout).run()
    assert len(released) == 4


def test_a_target_that_never_ran_is_named_in_the_summary_and_both_reports(tmp_path):
    # One round, two targets: the second never runs, and a bare "0 failures"
    # would be a false clean for it.
    import io

    term = io.StringIO()
    cfg = _cfg(tmp_path, ["main-gather", "tests.targets:shifted_rows"], 600.0,
               round_examples=3, max_rounds=1)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=term).run()
    *_, per_target, summary = term.getvalue().strip().splitlines()
    assert "1 of 2 targets ran (never ran: tests.targets:shifted_rows)" in summary, summary
    assert per_target == ("soak: examples per target: main-gather 3, "
                          "tests.targets:shifted_rows 0 (never ran)"), per_target
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["never_ran"] == ["tests.targets:shifted_rows"] and data["targets_ran"] == 1
    assert data["targets"]["tests.targets:shifted_rows"]["examples"] == 0
    assert data["targets"]["main-gather"]["examples"] == rep["examples"] == 3
    md = (tmp_path / "out" / "report.md").read_text()
    failures = next(ln for ln in md.splitlines() if ln.startswith("- failures: 0"))
    before = md.splitlines()[md.splitlines().index(failures) - 1]
    assert before.startswith("- 1 of 2 targets ran (never ran: tests.targets:shifted_rows)")
    assert "| tests.targets:shifted_rows | 0 | never ran |" in md, md


def test_a_short_soak_of_several_targets_gives_each_a_round(tmp_path):
    # Rounds of 5 minutes (the default) in a 16-second budget: the round is cut
    # to the budget's share per target, so the buggy second target runs and is found.
    import io

    term = io.StringIO()
    cfg = _cfg(tmp_path, ["main-gather", "tests.targets:shifted_rows"], 16.0,
               round_examples=10**6, stats_every_s=5.0)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=term).run()
    assert rep["targets"].get("tests.targets:shifted_rows", {}).get("examples"), term.getvalue()
    assert rep["never_ran"] == [] and rep["targets_ran"] == 2
    assert rep["failures_by_kind"], rep["targets"]
    assert rep["config"]["round_s"] == 8.0
    assert "rounds of 0:00:08, the budget's share per target" in term.getvalue()


def test_a_failure_found_every_round_keeps_state_json_bounded_and_its_count(tmp_path):
    # A buggy target is found again every round (the database replays it
    # first): state.json keeps the first few occurrences in full, counts the
    # rest, and the report's counts are those of every occurrence.
    from streamfuzz.fuzz.soak import KEPT_OCCURRENCES

    rounds = KEPT_OCCURRENCES + 5
    cfg = _cfg(tmp_path, ["tests.targets:shifted_rows"], 900.0, round_examples=20,
               max_rounds=rounds, strategy=st.sampled_from([_scenario(2), _scenario(3)]))
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
    (d,) = rep["distinct_failures"]
    assert d["occurrences"] == rounds and sum(rep["failures_by_kind"].values()) == rounds
    assert d["message"]  # the first occurrence's, kept
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert [f["path"] for f in state["failures"]] == [d["path"]] * KEPT_OCCURRENCES
    assert state["repeats"][d["path"]]["occurrences"] == rounds - KEPT_OCCURRENCES
    assert len(rep["failures"]) == KEPT_OCCURRENCES
    assert rep["failures_not_listed"] == rounds - KEPT_OCCURRENCES


def test_a_failure_found_again_every_round_does_not_rewrite_state_json_each_round(
        tmp_path, monkeypatch):
    # state.json was written whole and synced three times in every round of a
    # buggy target (its first sight, its settled record, the round's end),
    # and it grows to ~100 KB until every failure has its kept occurrences.
    # A failure seen before is only counted until the next due write; the
    # counts stay whole.
    from streamfuzz.fuzz.soak import state as soak_module

    written = []
    real = soak_module.write_json_atomic

    def counting(path, data):
        if Path(path).name == "state.json":
            written.append(data["rounds"])
        real(path, data)

    monkeypatch.setattr(soak_module, "write_json_atomic", counting)
    rounds = 8
    cfg = _cfg(tmp_path, ["tests.targets:shifted_rows"], 900.0, round_examples=20,
               max_rounds=rounds, stats_every_s=3600.0,
               strategy=st.sampled_from([_scenario(2), _scenario(3)]))
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
    (d,) = rep["distinct_failures"]
    assert d["occurrences"] == rounds
    assert len(written) < rounds, f"state.json written {len(written)} times in {rounds} rounds"
    state = json.loads((tmp_path / "out" / "state.json").read_text())
    assert state["rounds"] == rounds and written[-1] == rounds
    assert len(state["failures"]) + sum(r["occurrences"] for r in state["repeats"].values()) \
        == rounds


def test_a_saved_failure_is_one_whole_line_in_the_soak_output(tmp_path):
    # pre-fix's lifetime finding has frames under its first line: the
    # terminal line once cut them mid-word ("    main: fuz").
    import io

    term = io.StringIO()
    cfg = _cfg(tmp_path, ["pre-fix"], 600.0, round_examples=20, max_rounds=1)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=term).run()
    (d,) = rep["distinct_failures"]
    lines = term.getvalue().splitlines()
    i = next(i for i, ln in enumerate(lines) if " saved to " in ln)
    assert lines[i + 1].startswith("soak: "), lines[i:i + 3]
    first = d["message"].splitlines()[0]
    said = lines[i].split("reproduces: ", 1)[1]
    assert said == first or (said.endswith(" ...") and first.startswith(said[:-4])
                             and first[len(said) - 4] == " "), said


def test_memory_is_sampled_for_every_rank_and_report_files_are_written(tmp_path):
    cfg = _cfg(tmp_path, ["main-gather"], 6.0)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
    out = tmp_path / "out"
    samples = read_samples(out / "stats.jsonl")
    assert len(samples) >= 3
    assert all(len(s["ranks"]) == 2 and all(m["rss"] > 10 * 2**20 for m in s["ranks"])
               for s in samples)
    assert {"rank0_rss", "rank1_rss", "driver_rss"} <= set(rep["memory"])
    assert json.loads((out / "report.json").read_text())["examples"] == rep["examples"] > 0
    assert "# streamfuzz soak report" in (out / "report.md").read_text()
    assert "- streams held by (examples): " in (out / "report.md").read_text()
    assert set(rep["held_by"]) <= {"gate", "gate-timeout", "rerun", "spin", "none"}
    assert all(0 < n <= rep["examples"] for n in rep["held_by"].values())
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rep["behaviours"]["distinct"] >= 3
    assert not (out / "journal.json").exists()
    _no_partial_files(tmp_path)


def _leaking_soak(tmp_path, recycle_mib):
    # Counted, not timed: one round of 600 examples (the budget only guards the
    # test), a sample every 4 examples. A world lives 64 examples (8 MiB at
    # 128 KiB each), so it yields a slope of 16 samples; without recycling the
    # ranks grow 75 MiB. The same at 5 examples a second or at 500.
    cfg = _cfg(tmp_path, ["tests.targets:leaks"], 3600.0, recycle_mib=recycle_mib,
               stats_every_s=3600.0, stats_every_examples=4, round_s=3600.0,
               round_examples=600, max_rounds=1,
               strategy=st.integers(0, 2**30).map(lambda _: _scenario(2)))
    with RankPool(2, "cpu", timeout=60.0) as pool:
        first = pool.pids
        rep = Soak(pool, cfg, stream=sys.stdout).run()
        last = pool.pids  # read before the pool closes: a closed pool has none
    assert rep["stop_reason"] == "rounds done" and rep["examples"] == 600
    return rep, pool, first, last


def test_a_leaking_rank_is_recycled_and_its_memory_bounded(tmp_path):
    rep, pool, first, last = _leaking_soak(tmp_path, recycle_mib=8)
    assert pool.recycles >= 1 and pool.restarts == 0 and not rep["failures"]
    assert len(last) == 2 and set(last).isdisjoint(first)
    assert rep["rank_recycles"] == pool.recycles and rep["rank_restarts"] == 0
    samples = read_samples(tmp_path / "out" / "stats.jsonl")
    assert len({s["world"] for s in samples}) >= 4  # 600 examples, recycled every ~64
    # No world got far past its limit (one stats period of growth at most).
    assert max(s["ranks"][0]["rss"] for s in samples[1:]) < samples[1]["ranks"][0]["rss"] \
        + 64 * 2**20
    # (The driver's own warm-up is not the point here.)
    assert not [k for k in rep["memory_growing"] if k.startswith("rank")], rep["memory"]
    # Seconds of samples are too short to project: judged on the quarters, not the cap
    # (a long run's capped projection: test_a_steady_slope_is_bounded_when_...recycled).
    assert rep["memory"]["rank1_rss"]["projected_growth"] is None and not rep["projected"]
    assert "recycling the ranks: rank" in (tmp_path / "out" / "soak.log").read_text()


def test_the_same_leak_without_recycling_is_measured_and_a_short_run_not_judged(tmp_path):
    rep, pool, first, last = _leaking_soak(tmp_path, recycle_mib=0)
    assert last == first
    assert pool.recycles == 0 and rep["rank_recycles"] == 0
    # The last rank is the one that leaks (it runs the drafter's rows): the
    # table shows it. Seconds of samples are too short to tell a leak from
    # warm-up, so nothing is called growing (the long run's verdicts:
    # test_a_steady_slope_is_growing_even_when_ten_minutes_show_little).
    memory = rep["memory"]
    assert memory["rank1_rss"]["growth"] > soak_report.GROWTH_LIMIT, memory
    assert memory["rank1_rss"]["growth"] > 5 * (memory["rank0_rss"]["growth"] or 0), memory
    assert rep["memory_growing"] == [] and not rep["memory_judged"], memory
    assert "- memory: not judged" in (tmp_path / "out" / "report.md").read_text()


def test_bad_recycle_limit_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run(_soak_cli("--budget", "1m", "--recycle-mib", "-1", "--out", tmp_path),
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'-1' must be >= 0" in lines[0], lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_cleanly_with_the_summary_and_exit_130(tmp_path, sig):
    out = tmp_path / "out"
    proc = subprocess.Popen(_soak_cli("--budget", "10m", "--target", "main-gather",
                                      "--out", out, "--corpus", tmp_path / "corpus",
                                      "--stats-every", "1s"),
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for(lambda: len(read_samples(out / "stats.jsonl")) >= 3, 120, "samples")
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr  # interrupted, as the README's exit statuses say
    assert f"stopped ({sig.name})" in stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["stop_reason"] == sig.name and rep["examples"] > 0
    assert (out / "report.png").exists() and (out / "report.md").exists()
    assert not (out / "journal.json").exists()
    _no_partial_files(tmp_path)


def test_driver_killed_mid_example_loses_nothing_on_restart(tmp_path):
    """The driver dies (-9) while a hanging example is in flight; the next start
    replays the journaled example first and records the hang."""
    out = tmp_path / "out"
    args = ["--target", "tests.targets:hangs", "--out", out, "--corpus", tmp_path / "corpus",
            "--stats-every", "1s"]

    def in_flight_hangs():
        try:
            data = json.loads((out / "journal.json").read_text())
        except (OSError, ValueError):
            return False
        return any(len(s["idx_mapping"]) >= 4 for sc in data["scenarios"] for s in sc["steps"])

    proc = subprocess.Popen(_soak_cli("--budget", "10m", "--timeout", "600", *args),
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(in_flight_hangs, 180, "a hanging example in flight")
        time.sleep(0.5)
    finally:
        proc.kill()  # SIGKILL: no handler, no cleanup
        proc.wait()
    # The first in flight that hangs (one may be queued behind it).
    journaled = next(sc for sc in json.loads((out / "journal.json").read_text())["scenarios"]
                     if any(len(s["idx_mapping"]) >= 4 for s in sc["steps"]))
    assert not list((tmp_path / "corpus").rglob("*.json"))  # nothing was found before the kill

    # Same campaign directory: it resumes; a short remaining budget ends it quickly.
    state = json.loads((out / "state.json").read_text())
    budget = f"{int(state['elapsed_s']) + 12}s"
    res = subprocess.run(_soak_cli("--budget", budget, "--timeout", "5", *args), env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stderr
    assert "replaying the example in flight" in res.stderr
    rep = json.loads((out / "report.json").read_text())
    recovered = [f for f in rep["failures"] if f["recovered"]]
    assert recovered and recovered[0]["kind"] == "hang"
    assert corpus.load(Path(recovered[0]["path"])).scenario.to_dict() == journaled
    assert rep["starts"] == 2
    _no_partial_files(tmp_path)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TORCHRUN = ("import faulthandler, signal, sys; "
             "faulthandler.register(signal.SIGUSR1, all_threads=True); "
             "from torch.distributed.run import main; sys.exit(main())")
"""torchrun itself, answering SIGUSR1 with its stacks as the ranks do."""


def _torchrun(port, authkey):
    env = dict(_env(), STREAMFUZZ_DRIVER=f"127.0.0.1:{port}", STREAMFUZZ_AUTHKEY=authkey,
               STREAMFUZZ_DEVICE="cpu")
    return subprocess.Popen([PY, "-c", _TORCHRUN, "--standalone", "--nproc-per-node", "2",
                             "-m", "streamfuzz.fuzz.rank_main"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _tree(pid):
    """``pid`` and every process under it, each as ``(pid, "state command")``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            out.append((p, f"{state} {cmd}"))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _pipe_writers(stream):
    """Processes other than this one that hold the pipe behind ``stream``."""
    pipe = f"pipe:[{os.fstat(stream.fileno()).st_ino}]"
    holders = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            if os.readlink(fd) == pipe and int(fd.parts[2]) != os.getpid():
                holders.add(int(fd.parts[2]))
    return sorted(holders)


def _ended(torchrun, timeout, driver_err):
    """torchrun's output once it ends; if it does not, fail with where it and
    its ranks are (SIGUSR1 makes each print every thread's stack), each
    process's state, and who still holds its output open."""
    try:
        return torchrun.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        status = torchrun.poll()
        procs = _tree(torchrun.pid)
        for pid, _ in procs:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(3)
        holders = _pipe_writers(torchrun.stdout)
        for pid, _ in reversed(procs):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            out = torchrun.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            out = "(the output stayed open)"
        table = "\n".join(f"  {pid} {what}" for pid, what in procs)
        state = "alive" if status is None else f"exited {status}"
        pytest.fail(f"torchrun's ranks did not end {timeout}s after the driver did (torchrun "
                    f"{state}; its output held open by {holders})\nprocesses:\n{table}\n"
                    f"driver:\n{driver_err[-2000:]}\nranks:\n{out[-8000:]}")


@pytest.mark.parametrize("target, lost", [("main-gather", None),
                                          ("tests.targets:kills_rank", "crash"),
                                          ("tests.targets:hangs", "hang")])
def test_ranks_launched_by_torchrun(tmp_path, target, lost):
    """One campaign over ranks that torchrun started (its own rendezvous). A
    world that dies or hangs cannot be replaced from here: the campaign stops
    with its summary, and the ranks end (a hung one too), so torchrun's
    --max-restarts could start a new group."""
    port, key = _free_port(), os.urandom(8).hex()
    out = tmp_path / "out"
    driver = subprocess.Popen(_soak_cli("--budget", "12s", "--target", target, "--out", out,
                                        "--corpus", tmp_path / "corpus", "--listen",
                                        f"127.0.0.1:{port}", "--ranks-external", "2",
                                        "--timeout", "8"),
                              env=dict(_env(), STREAMFUZZ_AUTHKEY=key),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks = _torchrun(port, key)
    try:
        _, stderr = driver.communicate(timeout=240)
        ranks_out = _ended(ranks, 120, stderr)
    finally:
        driver.kill()
        ranks.kill()
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["external_ranks"] and rep["examples"] > 0
    if lost:
        assert driver.returncode == 3, stderr
        assert "external ranks are gone" in stderr and rep["stop_reason"] == "ranks lost"
        assert rep["failures_by_kind"] == {lost: 1}
        assert ranks.returncode != 0  # torchrun saw a worker fail
    else:
        assert driver.returncode == 0, stderr
        assert rep["stop_reason"] == "budget spent" and not rep["failures"]
        assert ranks.returncode == 0, ranks_out[-2000:]


def test_external_ranks_stuck_in_an_example_end_once_told_to_stop(tmp_path, sigint_raises):
    """A driver interrupted mid-example (a second Ctrl-C) says stop and closes
    while its ranks are stuck in that example: one sleeps, the other waits for
    it in a collective. Ranks that torchrun started cannot be killed by the
    driver, so they must end by themselves, within ``LEAVE_S``, with their
    stacks where SIGUSR1's go: STREAMFUZZ_STACKS (rank 0 here), else their
    output (rank 1); otherwise torchrun waits for them forever."""
    port, master, key = _free_port(), _free_port(), os.urandom(8)
    env = dict(_env(), STREAMFUZZ_DRIVER=f"127.0.0.1:{port}", STREAMFUZZ_AUTHKEY=key.hex(),
               STREAMFUZZ_DEVICE="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master),
               WORLD_SIZE="2")
    env.pop("STREAMFUZZ_PARENT", None)  # started by someone else, as torchrun does
    env.pop("STREAMFUZZ_STACKS", None)
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    stacks = tmp_path / "rank0.stacks"
    ranks = [subprocess.Popen([PY, "-m", "streamfuzz.fuzz.rank_main"], cwd=ROOT,
                              stdout=log.open("w"),
                              stderr=subprocess.STDOUT,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r),
                                       **({"STREAMFUZZ_STACKS": str(stacks)} if r == 0
                                          else {})))
             for r, log in enumerate(logs)]
    try:
        with RankPool(2, "cpu", timeout=300, listen=("127.0.0.1", port), authkey=key) as pool:
            # Ctrl-C mid-example, to the main thread (it wakes the driver's wait)
            timer = threading.Timer(2.0, signal.pthread_kill,
                                    (threading.main_thread().ident, signal.SIGINT))
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                pool.run("tests.targets:hangs", _scenario(4))
            timer.join()
        codes = [p.wait(timeout=rank_main.LEAVE_S + 60) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert codes == [1, 1], codes  # the stuck example never finished: not a clean exit
    for text in (stacks.read_text(), logs[1].read_text()):
        assert "Timeout (0:00:" in text and "in serve" in text, text[-3000:]
    assert "Timeout (0:00:" not in logs[0].read_text()


class _SilentListener:
    """A port that takes connections (the kernel's backlog) and never says a word."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self):
        self.sock.close()


class _OtherKeyListener:
    """A real driver-side listener with another key, accepting on a thread."""

    def __init__(self):
        from multiprocessing.connection import Listener

        self.listener = Listener(("127.0.0.1", 0), authkey=b"another key")
        self.address = "{}:{}".format(*self.listener.address)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(Exception):
            self.listener.accept()

    def close(self):
        self.listener.close()


@pytest.mark.parametrize("listener, says", [
    (_SilentListener, "gave no streamfuzz handshake within 2s"),
    (_OtherKeyListener, "refused this rank's key")])
def test_an_external_rank_pointed_at_a_wrong_listener_ends_with_one_line(listener, says):
    """A rank whose STREAMFUZZ_DRIVER is not the driver's (another program that
    never answers, or a driver with another key) ends with one line and
    status 2 instead of waiting forever in the handshake."""
    other = listener()
    rank = _lone_external_rank(other.address, "00ff", STREAMFUZZ_HANDSHAKE_TIMEOUT="2")
    try:
        out, err = rank.communicate(timeout=300)
    finally:
        rank.kill()
        other.close()
    _assert_ended_with_one_line(rank, err, says)
    assert "Traceback" not in err, err


def _lone_external_rank(driver: str, authkey: str, **env: str) -> subprocess.Popen:
    """A one-rank world's rank started as torchrun would, pointed at ``driver``."""
    env = dict(_env(), STREAMFUZZ_DRIVER=driver, STREAMFUZZ_AUTHKEY=authkey,
               STREAMFUZZ_DEVICE="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", **env)
    env.pop("STREAMFUZZ_PARENT", None)
    return subprocess.Popen([PY, "-m", "streamfuzz.fuzz.rank_main"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_ended_with_one_line(rank: subprocess.Popen, err: str, says: str) -> None:
    assert rank.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("streamfuzz rank")]
    assert len(lines) == 1 and says in lines[0], err


def test_an_external_rank_that_cannot_read_its_drivers_message_ends_with_one_line(tmp_path):
    """A message the rank cannot unpickle (a driver of another streamfuzz) ends
    the rank with one line and status 2; the thread that reads the driver must
    not die quietly and leave the main thread waiting for it forever (torchrun
    would then wait forever too)."""
    from multiprocessing.connection import Listener

    key = os.urandom(8)
    with Listener(("127.0.0.1", 0), authkey=key) as listener:
        rank = _lone_external_rank("{}:{}".format(*listener.address), key.hex())
        try:
            listener._listener._socket.settimeout(300)  # accept() has no timeout of its own
            with listener.accept() as conn:
                conn.recv()  # the rank's hello
                conn.send_bytes(b"not a pickle of any message")
                _, err = rank.communicate(timeout=300)
        finally:
            rank.kill()
            rank.wait()
    _assert_ended_with_one_line(rank, err, "a message from the driver could not be read")


@pytest.mark.slow
def test_thirty_minute_soak_memory_and_throughput_flat(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run(_soak_cli("--budget", "30m", "--round", "60s", "--timeout", "15",
                                   "--target", "main-gather", "tests.targets:kills_rank",
                                   "--out", out, "--corpus", tmp_path / "corpus"),
                         env=_env(), capture_output=True, text=True, timeout=3000)
    assert res.returncode == 1, res.stderr
    rep = json.loads((out / "report.json").read_text())
    assert not rep["memory_growing"], rep["memory"]
    tp = rep["throughput"]["by_target"]["main-gather"]
    assert tp["end"] > 0.7 * tp["start"]


def _samples(rss_at, n=60, restarts_at=None, world_at=None):
    out = []
    for i in range(n):
        t = 10.0 * i
        out.append({"t": t, "rate": 40.0, "driver_rss": 500 * 2**20,
                    "restarts": int(restarts_at is not None and i >= restarts_at),
                    "world": f"1.{world_at(i) if world_at else 1}",
                    "ranks": [{"rss": int(rss_at(i) * 2**20)}]})
    return out


def _memory_verdict(samples, recycle_mib=None):
    state = {"failures": [], "elapsed_s": 600.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    return soak_report.summarize(state, samples, config={"recycle_mib": recycle_mib},
                                 stop_reason=None)


def test_a_steady_slope_is_growing_even_when_ten_minutes_show_little():
    # +3% in 10 minutes, steadily (what an H200 rank did): about +140% in 8 hours.
    rep = _memory_verdict(_samples(lambda i: 1100 + 0.6 * i))
    assert rep["memory_growing"] == ["rank0_rss"], rep["memory"]
    assert rep["memory"]["rank0_rss"]["growth"] < soak_report.GROWTH_LIMIT


def test_a_steady_slope_is_bounded_when_the_ranks_are_recycled():
    # The H200 rank's slope, recycled every 32 MiB: a sawtooth that never passes +32 MiB.
    rep = _memory_verdict(_samples(lambda i: 1100 + 0.6 * (i % 50), n=120,
                                   world_at=lambda i: i // 50), recycle_mib=32)
    assert rep["memory_growing"] == [], rep["memory"]
    assert rep["memory"]["rank0_rss"]["bounded_by_recycling"]
    rss = rep["memory"]["rank0_rss"]
    assert rss["projected_growth"] == round(32 * 2**20 / rss["start"], 4)
    # The driver is not recycled: its own slope is still judged in full.
    leaky_driver = _samples(lambda i: 1100, n=120)
    for i, s in enumerate(leaky_driver):
        s["driver_rss"] = int((500 + 0.6 * i) * 2**20)
    rep = _memory_verdict(leaky_driver, recycle_mib=32)
    assert rep["memory_growing"] == ["driver_rss"], rep["memory"]


_STEPPED_DRIVER = [38, 49, 61, 71, 82, 94, 94, 521, 518, 528, 538, 547, 556, 549, 551, 553,
                   555, 558, 568, 564, 561, 559, 562, 564, 568, 563, 562, 561, 563, 566, 571,
                   564, 563, 564, 567, 569, 575, 567, 567, 568, 570, 573, 578, 564, 566, 567,
                   569, 571, 574, 563, 565, 567, 569, 571, 574, 563, 565, 567, 563]
"""A driver's RSS in MiB every 10 s, one of 24 worlds on a 16-core GPU node for
10 minutes: its heap stepped up 70 s in (its targets' modules and caches),
later than with fewer worlds, then held."""


def test_a_driver_that_steps_up_in_its_first_quarter_and_holds_is_flat():
    samples = _samples(lambda i: 900, n=len(_STEPPED_DRIVER))
    for s, mib in zip(samples, _STEPPED_DRIVER):
        s["driver_rss"] = mib * 2**20
    rep = _memory_verdict(samples)
    assert rep["memory_growing"] == [], rep["memory"]["driver_rss"]
    # The same step at the end of a run is growth.
    for s, mib in zip(samples, reversed(_STEPPED_DRIVER)):
        s["driver_rss"] = (600 - mib) * 2**20 + 500 * 2**20
    assert _memory_verdict(samples)["memory_growing"] == ["driver_rss"]


_DRIVER_ACROSS_RECYCLES = [38, 63, 93, 521, 534, 556, 553, 559, 564, 567, 572, 565, 568, 574, 567,
                           572, 565, 566, 573, 563, 568, 560, 565, 569, 562, 568, 561, 567, 574,
                           567, 572, 564, 568, 571, 566, 572, 566]
"""A driver's RSS in MiB every 10 s (16 worlds, 6 minutes), its ranks recycled
after samples 4 and 20: the longest stretch of one set of ranks, 13 samples,
happened to rise by a few MiB from quarter to quarter."""


def test_a_drivers_memory_is_judged_over_its_whole_life_not_its_ranks():
    samples = _samples(lambda i: 900, n=len(_DRIVER_ACROSS_RECYCLES),
                       world_at=lambda i: 1 if i < 4 else 2 if i < 20 else 3)
    for s, mib in zip(samples, _DRIVER_ACROSS_RECYCLES):
        s["driver_rss"] = mib * 2**20
    rep = _memory_verdict(samples)
    assert rep["memory_growing"] == [], rep["memory"]["driver_rss"]
    # A driver that leaks across the same recycles still grows.
    for i, s in enumerate(samples):
        s["driver_rss"] = int((560 + 0.6 * i) * 2**20)
    assert _memory_verdict(samples)["memory_growing"] == ["driver_rss"]


def test_worlds_that_start_bigger_each_time_are_growing_despite_recycling():
    rep = _memory_verdict(_samples(lambda i: 1100 + 0.6 * (i % 20) + 40 * (i // 20), n=120,
                                   world_at=lambda i: i // 20), recycle_mib=32)
    assert rep["memory_growing"] == ["rank0_rss"], rep["memory"]


_CPU_RANK_KIB = [173940, 184288, 184476, 188828, 188888, 189040, 189140, 189140, 189140, 189140,
                 189164, 189164, 189172, 189248, 189384, 189384, 189384, 189384, 189384, 189404,
                 189404, 189460, 189460, 189460, 189460, 189472, 189476, 189476, 189476, 189476,
                 189476, 189476, 189476, 189476, 189480, 189480, 189480, 189480, 189480, 189480,
                 189480, 189480, 189480, 189480, 189720, 189720, 189720, 189720, 189720, 189736,
                 189736, 189736, 189736, 189736, 189736, 189736, 189736, 189736, 189736, 189736,
                 189736]
"""A gloo rank's RSS in KiB every 10 s: a 10-minute one-world CPU soak of every
built-in, recycling at the default 32 MiB (never reached). Its fitted slope,
+3 MiB an hour, projects to +14% in 8 hours: less than the 32 MiB that
recycling lets it grow, which is 17% of so small a rank."""


def test_a_cpu_rank_rising_within_the_recycling_limit_is_bounded_not_growing(tmp_path):
    samples = _samples(lambda i: _CPU_RANK_KIB[i] / 1024, n=len(_CPU_RANK_KIB))
    rep = _memory_verdict(samples, recycle_mib=32)
    rss = rep["memory"]["rank0_rss"]
    assert rep["memory_growing"] == [] and rss["bounded_by_recycling"], rss
    assert soak_report.GROWTH_LIMIT < rss["projected_growth"] < 32 * 2**20 / rss["start"]
    state = {"failures": [], "elapsed_s": 600.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    cfg = {"targets": ["main-gather"], "device": "cpu", "world_size": 2, "budget_s": 600.0,
           "recycle_mib": 32}
    soak_report.write(tmp_path, state, samples, config=cfg, stop_reason="budget spent")
    md = (tmp_path / "report.md").read_text()
    assert "- memory: flat (rank0_rss would grow, and are bounded by recycling" in md, md
    # Without recycling nothing bounds it: the same series is growing.
    assert _memory_verdict(samples)["memory_growing"] == ["rank0_rss"]
    # A CPU rank whose worlds each start bigger than the last still grows, cap or not.
    rep = _memory_verdict(_samples(lambda i: 185 + 0.3 * (i % 20) + 12 * (i // 20), n=120,
                                   world_at=lambda i: i // 20), recycle_mib=32)
    assert rep["memory_growing"] == ["rank0_rss"], rep["memory"]


def test_noise_and_a_rank_restart_are_not_growth():
    noisy = _memory_verdict(_samples(lambda i: 300 + (i * 7919 % 5) * 0.2))
    assert noisy["memory_growing"] == [], noisy["memory"]
    # A replaced rank starts small again: the stretch after it is flat.
    restarted = _memory_verdict(_samples(lambda i: 400 if i < 10 else 300, restarts_at=10))
    assert restarted["memory_growing"] == [], restarted["memory"]


def test_a_short_run_is_not_projected_and_says_so(tmp_path):
    # 90 s of a driver warming up (+4%): eight hours of that slope would be +1500%.
    samples = _samples(lambda i: 300, n=10)
    for i, s in enumerate(samples):
        s["driver_rss"] = int((250 + i) * 2**20)
    rep = _memory_verdict(samples)
    assert rep["memory_growing"] == [] and not rep["projected"], rep["memory"]
    assert rep["memory"]["driver_rss"]["projected_growth"] is None
    state = {"failures": [], "elapsed_s": 90.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    cfg = {"targets": ["main-gather"], "device": "cpu", "world_size": 2, "budget_s": 90.0}
    soak_report.write(tmp_path, state, samples, config=cfg, stop_reason="budget spent")
    md = (tmp_path / "report.md").read_text()
    assert "- memory: not judged: under 5 min of samples" in md


def test_a_short_soak_whose_driver_rises_before_its_first_release_calls_nothing_growing(
        tmp_path):
    # 75 s of a driver rising 14% before its first heap release (what a
    # newcomer's first soak showed): too short to tell a leak from warm-up.
    samples = _samples(lambda i: 300, n=8)
    for i, s in enumerate(samples):
        s["driver_rss"] = int((265 + 8 * i) * 2**20)
    rep = _memory_verdict(samples)
    assert rep["memory_growing"] == [] and not rep["memory_judged"], rep["memory"]
    assert rep["memory"]["driver_rss"]["growth"] > soak_report.GROWTH_LIMIT  # still measured
    state = {"failures": [], "elapsed_s": 75.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    cfg = {"targets": ["main-gather"], "device": "cpu", "world_size": 2, "budget_s": 75.0}
    soak_report.write(tmp_path, state, samples, config=cfg, stop_reason="budget spent")
    md = (tmp_path / "report.md").read_text()
    assert "GROWING" not in md and "- memory: not judged: under 5 min of samples" in md, md
    assert "| driver_rss | " in md  # the numbers are still there to read


@pytest.mark.parametrize("rank_mib, slope_mib, gpu_mib", [
    (181.3, 0.06, None),   # a CPU rank: the 32 MiB cap alone is 18% of it
    (96.0, 0.06, 640.0),   # a CUDA rank (host side small): the cap is a third of it
], ids=["cpu", "cuda"])
def test_a_two_minute_soak_with_flat_memory_is_not_growing_whatever_the_cap(
        tmp_path, rank_mib, slope_mib, gpu_mib):
    # Two minutes sampled every 10 s, the ranks growing 0.4% (a warm-up): a
    # slope that, projected over 8 h, would pass the recycle cap. Too short to
    # project comes first: no projection, no cap, judged on the quarters alone.
    samples = _samples(lambda i: rank_mib + slope_mib * i, n=13)
    for i, s in enumerate(samples):
        if gpu_mib is not None:
            s["ranks"][0]["gpu_reserved"] = int((gpu_mib + 0.1 * i) * 2**20)
    rep = _memory_verdict(samples, recycle_mib=32)
    assert rep["memory_growing"] == [] and not rep["projected"], rep["memory"]
    rss = rep["memory"]["rank0_rss"]
    assert rss["projected_growth"] is None and not rss["bounded_by_recycling"], rss
    state = {"failures": [], "elapsed_s": 120.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    cfg = {"targets": ["main-gather"], "device": "cuda" if gpu_mib else "cpu",
           "world_size": 1, "budget_s": 120.0, "recycle_mib": 32}
    soak_report.write(tmp_path, state, samples, config=cfg, stop_reason="budget spent")
    md = (tmp_path / "report.md").read_text()
    assert "GROWING" not in md and "- memory: not judged: under 5 min" in md, md


def test_the_plot_title_fits_and_a_resumed_start_is_marked():
    pytest.importorskip("matplotlib")
    samples = _samples(lambda i: 300, n=20)
    for i, s in enumerate(samples):
        s["world"] = "1.1" if i < 12 else "2.1"  # the campaign was resumed at sample 12
    title = "streamfuzz soak: " + ", ".join(f"tests.targets:target_{i}" for i in range(12))
    fig = soak_report.figure(samples, title)
    try:
        fig.canvas.draw()
        box = fig.axes[0].title.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1
        marks = [ln for ax in fig.axes for ln in ax.get_lines()
                 if list(ln.get_xdata()) == [samples[12]["t"] / 60] * 2]
        assert len(marks) == 3  # one per panel
        assert "resumed" in fig.axes[1].get_legend_handles_labels()[1]
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_example_database_is_written_and_replays_a_failure_first(tmp_path):
    cfg = _cfg(tmp_path, ["pre-fix"], 1800.0, round_s=600.0, round_examples=200,
               shrink_s=600.0, max_rounds=2)
    with RankPool(2, "cpu", timeout=60.0) as pool:
        rep = Soak(pool, cfg, stream=sys.stdout).run()
    assert rep["stop_reason"] == "rounds done"
    assert [p for p in (tmp_path / "db").rglob("*") if p.is_file()]
    first, second = [f for f in rep["failures"] if f["shrunk"]]
    assert first["path"] == second["path"]
    # The second round starts from the database: its first example is the failure.
    assert second["examples_to_find"] == 1 and first["examples_to_find"] >= 1


@pytest.mark.parametrize("journal, replayed, found", [
    # Two in flight: replayed in order until one fails; one behind it is dropped.
    ({"scenarios": [2, 3, 4]}, 2, 3),
    ({"scenarios": [1, 2]}, 2, None),
    # The one-example journal of earlier versions.
    ({"scenario": 3}, 1, 3),
])
def test_recovery_replays_the_journaled_examples_in_order_until_one_fails(
        tmp_path, journal, replayed, found):
    out = tmp_path / "out"
    out.mkdir()
    data = {"target": "tests.targets:shifted_rows", "round": 0, "replays": 0}
    for key, reqs in journal.items():
        as_dicts = [_scenario(n).to_dict() for n in (reqs if isinstance(reqs, list) else [reqs])]
        data[key] = as_dicts if key == "scenarios" else as_dicts[0]
    (out / "journal.json").write_text(json.dumps(data))
    cfg = _cfg(tmp_path, ["main-gather"], 1.0, max_rounds=1)
    log = []
    with RankPool(2, "cpu", timeout=20.0) as pool:
        soak = Soak(pool, cfg, stream=sys.stdout)
        soak._say = log.append
        soak._recover()
    assert sum("replaying the example in flight" in line for line in log) == replayed
    recovered = [f for f in soak.state["failures"] if f.get("recovered")]
    if found is None:
        assert not recovered
    else:
        (f,) = recovered
        assert f["kind"] == "value"
        assert corpus.load(Path(f["path"])).scenario.steps[0].num_reqs == found
    assert not (out / "journal.json").exists()


def test_recovery_after_dying_twice_records_the_first_and_drops_the_rest(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "journal.json").write_text(json.dumps({
        "target": "main-gather", "round": 0, "replays": 1,
        "scenarios": [_scenario(2).to_dict(), _scenario(3).to_dict()]}))
    cfg = _cfg(tmp_path, ["main-gather"], 1.0, max_rounds=1)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        soak = Soak(pool, cfg, stream=sys.stdout)
        soak._recover()
    (f,) = [f for f in soak.state["failures"] if f.get("recovered")]
    assert f["kind"] == "crash" and "driver died twice" in f["message"]
    assert corpus.load(Path(f["path"])).scenario.steps[0].num_reqs == 2
    assert not (out / "journal.json").exists()


def test_a_driver_whose_heap_wanders_within_its_band_is_not_projected():
    # A 16-world GPU soak's driver: warm-up to ~560 MiB in 2.5 minutes, then
    # 560-573 MiB, up and down again as each round's heap is trimmed. Its fitted
    # slope (+80 MiB/h) is the wander, not a leak: it does not rise quarter
    # over quarter.
    # (One world's driver, every 50 s.)
    every_50s = [524, 550, 565, 561, 563, 568, 567, 569, 571, 566, 563, 565]
    samples = _samples(lambda i: 900, n=60)
    for i, s in enumerate(samples):
        s["driver_rss"] = int(every_50s[i // 5] * 2**20)
    rep = _memory_verdict(samples)
    assert rep["memory"]["driver_rss"]["slope_per_h"] > 0
    assert rep["memory"]["driver_rss"]["projected_growth"] is None
    assert rep["memory_growing"] == [], rep["memory"]
    # The same run rising steadily after its warm-up is still projected, and growing.
    for i, s in enumerate(samples):
        s["driver_rss"] = int((every_50s[i // 5] if i < 15 else 561 + 0.25 * (i - 15)) * 2**20)
    rep = _memory_verdict(samples)
    assert rep["memory_growing"] == ["driver_rss"], rep["memory"]


def test_the_journal_reads_whole_after_a_shorter_rewrite_and_after_removal(tmp_path):
    from streamfuzz.fuzz.draft.scenario import Scenario, Step
    from streamfuzz.fuzz.soak import Journal

    long = Scenario(steps=tuple(Step(idx_mapping=(0, 1, 2)) for _ in range(5)))
    short = Scenario()
    journal = Journal(tmp_path / "journal.json")
    journal.write("main-gather", 3, [short, long])
    journal.write("main-gather", 3, [long])
    data = json.loads((tmp_path / "journal.json").read_text())
    assert data == {"target": "main-gather", "round": 3, "scenarios": [long.to_dict()],
                    "replays": 0}
    journal.write("main-gather", 4, [short])  # shorter than the file: padded, still whole
    assert json.loads((tmp_path / "journal.json").read_text())["scenarios"] == [short.to_dict()]
    journal.remove()
    assert not (tmp_path / "journal.json").exists()
    journal.write("pre-fix", 5, [long], replays=1)  # a fresh file after a removal
    data = json.loads((tmp_path / "journal.json").read_text())
    assert (data["target"], data["replays"], len(data["scenarios"])) == ("pre-fix", 1, 1)
    # A later start finds the file and opens it as it is.
    Journal(tmp_path / "journal.json").write("pre-fix", 6, [short])
    assert json.loads((tmp_path / "journal.json").read_text())["round"] == 6


_HOUR_DRIVER = [34, 85, 263, 282, 302, 298, 294, 302, 298, 304, 299, 298, 306, 301, 311, 304, 301,
                298, 310, 337, 320, 314, 323, 314, 309, 316, 310, 316, 315, 313, 327, 317, 314,
                326, 321, 327, 324, 339, 333, 332, 331, 326, 344, 335, 344, 336, 325, 339, 328,
                344, 335, 330, 328, 327, 324, 343, 344, 342, 341, 338]
"""A driver's RSS in MiB every minute: an hour's one-world CPU soak of every
built-in. It rose 6.6% from the second quarter to the last, unsteadily
(its third quarter above its fourth), fitted about +40 MiB an hour."""


def test_a_driver_rising_unsteadily_for_an_hour_is_not_called_flat(tmp_path):
    samples = _samples(lambda i: 370, n=len(_HOUR_DRIVER))
    for i, (s, mib) in enumerate(zip(samples, _HOUR_DRIVER)):
        s["t"] = 60.0 * i
        s["driver_rss"] = mib * 2**20
    rep = _memory_verdict(samples)
    drv = rep["memory"]["driver_rss"]
    # Too unsteady to project over a night as a leak, too much to call flat.
    assert rep["memory_growing"] == [] and drv["projected_growth"] is None, drv
    assert rep["memory_rising"] == ["driver_rss"], drv
    assert drv["week_growth"] > 10, drv  # about 6.7 GB on ~330 MiB
    text = soak_report.memory_text(rep)
    assert text.startswith("rising: driver_rss +") and "MiB/h" in text and "week" in text, text
    state = {"failures": [], "elapsed_s": 3600.0, "examples": 1, "rounds": 1, "starts": 1,
             "restarts": 0}
    cfg = {"targets": ["main-gather"], "device": "cpu", "world_size": 2, "budget_s": 3600.0}
    soak_report.write(tmp_path, state, samples, config=cfg, stop_reason="budget spent")
    md = (tmp_path / "report.md").read_text()
    assert "- memory: rising: driver_rss" in md and "- memory: flat" not in md, md
    # The same hour held level after its warm-up is flat.
    for s in samples[4:]:
        s["driver_rss"] = (320 + (hash(s["t"]) % 7)) * 2**20
    level = _memory_verdict(samples)
    assert level["memory_rising"] == [] and soak_report.memory_text(level) == "flat", level


def test_a_rounds_examples_are_freed_when_it_ends_not_rounds_later(tmp_path, monkeypatch):
    """Hypothesis's engine and examples are cycles: left to the collector's own
    schedule, a round's outlived the rounds after it (a full collection waits
    until a quarter of every long-lived object is new), and the driver's heap
    rose 40 MiB an hour around them. Counted at each round's start: the
    examples the earlier rounds made, still in memory."""
    import gc

    from hypothesis.internal.conjecture.data import ConjectureData

    from streamfuzz.fuzz.soak import campaign as soak_mod

    left: list[int] = []
    real_round = soak_mod.Soak._round

    def counted(self, *args, **kwargs):
        left.append(sum(isinstance(o, ConjectureData) for o in gc.get_objects()))
        return real_round(self, *args, **kwargs)

    monkeypatch.setattr(soak_mod.Soak, "_round", counted)
    monkeypatch.setattr(soak_mod, "_RELEASE_EVERY_S", 3600.0)
    cfg = _cfg(tmp_path, ["main-gather", "tests.targets:shifted_rows"], 600.0,
               round_examples=20, max_rounds=8)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        Soak(pool, cfg, stream=sys.stdout).run()
    assert len(left) == 8 and max(left) == 0, left
