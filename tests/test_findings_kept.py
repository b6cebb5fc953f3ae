"""Findings are never lost and always say where: Ctrl-C while shrinking, a
crash in a user's handler, a hung rank. Real ranks, real gloo; every decision
is made on events (an interrupt after the first failure, a rank that never
answers), never on speed."""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from hypothesis import strategies as st

from streamfuzz.fuzz import cli, corpus, driver, profiles, ranks
from streamfuzz.fuzz.commands import run as run_cmd
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool
from tests.helpers import ROOT


def test_ctrl_c_while_shrinking_saves_the_failure_and_writes_the_report(
        tmp_path, monkeypatch, capsys):
    real = run_cmd.Progress.__call__

    def progress(self, examples, elapsed, failed):
        real(self, examples, elapsed, failed)
        if self.failures and not failed or self.failures > 1:
            raise KeyboardInterrupt  # the first example after the failure: shrinking

    monkeypatch.setattr(run_cmd.Progress, "__call__", progress)
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--device", "cpu", "--target", "pre-fix", "--target", "pr-fix",
                   "--oracle", "lifetime", "--seed", "1", "--profile", "ci",
                   "--corpus", str(tmp_path / "corpus"), "--report", str(report)])
    out, err = capsys.readouterr()
    assert rc == 130
    assert "interrupted while shrinking: saved as shrunk so far" in out
    assert "\n  shrunk so far: " in out and "as found" not in out
    # Shrinking is never silent, even on a pipe: one line when it starts.
    assert "[pre-fix] found a failure after" in err and "shrinking it, at most 120s" in err
    (saved,) = (tmp_path / "corpus").rglob("*.json")
    assert corpus.load(saved).kind == "lifetime" and f"saved {saved}" in err
    data = json.loads(report.read_text())
    assert data["interrupted"] and data["target"] == "pre-fix"  # pr-fix never started
    (failure,) = data["failures"]
    assert failure["shrinking_interrupted"] and failure["corpus_path"] == str(saved)


_USER_TARGET = textwrap.dedent('''
    from streamfuzz.fuzz.draft.targets.pp_draft import main_gather


    def _check(batch):
        if batch.num_reqs >= 2:
            raise ValueError(f"cannot handle {batch.num_reqs} requests")


    class Handler:
        def __init__(self, ctx):
            self.inner = main_gather(ctx)

        def broadcast_drafts(self, draft_table, batch):
            _check(batch)
            return self.inner.broadcast_drafts(draft_table, batch)

        def receive_drafts(self, batch):
            _check(batch)
            return self.inner.receive_drafts(batch)

        def apply_received(self, draft_table):
            return self.inner.apply_received(draft_table)


    def make(ctx):
        return Handler(ctx)
''')


def test_a_crash_in_a_users_handler_shows_the_users_frames(tmp_path):
    (tmp_path / "user_handler.py").write_text(_USER_TARGET)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    out = subprocess.run([sys.executable, "-m", "streamfuzz", "run", "--device", "cpu",
                          "--target", "user_handler:make", "--seed", "0", "--profile", "ci",
                          "--corpus", "corpus"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "raised ValueError: cannot handle 2 requests" in out.stdout
    frames = [ln.strip() for ln in out.stdout.splitlines() if "user_handler.py:" in ln]
    assert frames[0].startswith("user_handler.py:7 _check: raise ValueError(")
    assert frames[1].startswith("user_handler.py:15 broadcast_drafts: _check(batch)") \
        or frames[1].startswith("user_handler.py:19 receive_drafts: _check(batch)")
    # Trimmed to the user's code: no harness, torch or standard library frames.
    crash = out.stdout.split("FOUND crash", 1)[1].split("shrunk:", 1)[0]
    assert "fuzz/draft/runner.py" not in crash and "rank_main" not in crash
    assert "torch/" not in crash
    (saved,) = (tmp_path / "corpus").rglob("*.json")
    assert "user_handler.py:7 _check" in corpus.load(saved).message


def _four_requests() -> Scenario:
    step = Step(idx_mapping=(0, 1, 2, 3), final=(True,) * 4, num_sampled=(1,) * 4,
                num_rejected=(0,) * 4)
    return Scenario(world_size=2, max_num_reqs=4, steps=(step,))


def test_a_hang_says_where_the_stuck_rank_is_and_rank_logs_are_removed(tmp_path):
    with RankPool(2, "cpu", timeout=10.0) as pool:
        logdir = pool.logdir
        res = driver.fuzz(pool, "tests.targets:hangs", profiles.get("ci"), max_examples=5,
                          corpus_dir=tmp_path, strategy=st.just(_four_requests()))
        assert any(logdir.iterdir())
    assert res.failure is not None and res.failure.kind == "hang"
    msg = res.failure.message
    # The hanging rank (the last one, sending) and where: time.sleep in Hangs._send.
    line = next(ln for ln in msg.splitlines() if "rank 1 is stuck at:" in ln)
    assert line.split("stuck at: ")[1].startswith("tests/targets.py:"), line
    assert " _send <- " in line and "broadcast_drafts" in line
    assert corpus.load(res.corpus_path).message == msg
    assert not logdir.exists()


def test_ctrl_c_before_any_finding_reports_what_ran(tmp_path, monkeypatch, capsys):
    real = run_cmd.Progress.__call__

    def progress(self, examples, elapsed, failed):
        real(self, examples, elapsed, failed)
        if self.target == "main-gather" and examples == 3:
            raise KeyboardInterrupt  # the third example of the second target

    monkeypatch.setattr(run_cmd.Progress, "__call__", progress)
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--device", "cpu", "--target", "main-gather-synced",
                   "--target", "main-gather", "--target", "pre-fix", "--seed", "1",
                   "--profile", "ci", "--max-examples", "5",
                   "--corpus", str(tmp_path / "corpus"), "--report", str(report)])
    out, err = capsys.readouterr()
    assert rc == 130
    # The fourth example was already with the ranks (sent before the third's
    # verdict was read): its verdict, in within the Ctrl-C's patience, counts.
    ran = 4 if "main-gather: interrupted after 4 examples" in out else 3
    assert f"main-gather: interrupted after {ran} examples" in out
    assert "streamfuzz: interrupted" in err and f"report in {report}" in err
    data = json.loads(report.read_text())
    assert data["interrupted"] and data["failures"] == []
    assert data["target"] == ["main-gather-synced", "main-gather"]  # pre-fix never started
    first, second = data["targets"]
    assert (first["target"], first["examples"], first["interrupted"]) == (
        "main-gather-synced", 5, False)
    assert (second["target"], second["examples"], second["interrupted"]) == ("main-gather", ran,
                                                                           True)
    assert data["examples"] == 5 + ran
    assert not list(tmp_path.glob(".r.json*"))  # written atomically, no temp file left


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_python_swallows_still_ends_the_run(tmp_path, monkeypatch, capsys,
                                                      sigint_raises):
    """A KeyboardInterrupt raised inside a gc callback (Hypothesis times its
    collections with one) is only printed by Python; the run must end anyway."""
    import gc

    real = run_cmd.Progress.__call__
    swallowed: list[bool] = []

    def ctrl_c_in_a_gc_callback():
        def callback(phase, info):
            if phase == "start":
                gc.callbacks.remove(callback)
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, in the callback

        gc.callbacks.append(callback)
        gc.collect()
        swallowed.append(True)  # reached: the interrupt did not come out of the collection

    def progress(self, examples, elapsed, failed):
        real(self, examples, elapsed, failed)
        if examples == 3:
            ctrl_c_in_a_gc_callback()

    monkeypatch.setattr(run_cmd.Progress, "__call__", progress)
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--device", "cpu", "--target", "main-gather", "--seed", "1",
                   "--profile", "ci", "--max-examples", "200",
                   "--corpus", str(tmp_path / "corpus"), "--report", str(report)])
    out, err = capsys.readouterr()
    assert swallowed == [True]  # Python swallowed the interrupt ...
    assert rc == 130, (out, err)  # ... and the run ended at its next example
    data = json.loads(report.read_text())
    assert data["interrupted"] and data["targets"][0]["examples"] <= 5


def test_ctrl_c_while_the_ranks_start_reports_that_no_target_ran(tmp_path, monkeypatch, capsys,
                                                                 sigint_raises):
    """A real SIGINT once the ranks are spawned and the driver waits for them:
    the report is written (no target ran), the ranks and their logs are gone."""
    real = ranks.World.accept
    seen = []

    def accept(self, world_size, timeout):
        seen.append((list(self.procs), self.logs[0].parent))
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return real(self, world_size, timeout)

    monkeypatch.setattr(ranks.World, "accept", accept)
    data = _interrupted_before_any_target(tmp_path, capsys, "cpu",
                                          "interrupted while the 2 ranks were starting")
    assert data["device"] == "cpu"
    ((procs, logdir),) = seen
    assert all(p.poll() is not None for p in procs) and not logdir.exists()


def test_ctrl_c_while_gpus_are_counted_reports_that_no_target_ran(tmp_path, monkeypatch, capsys,
                                                                  sigint_raises):
    """``--device auto`` waits for the zygote's torch import to count GPUs: a
    real SIGINT then still leaves a report (no target ran, nothing on disk lost)."""
    def probe():
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(5)
        return 0

    from streamfuzz.fuzz.commands import checks

    monkeypatch.setattr(checks, "probe_gpus", probe)
    data = _interrupted_before_any_target(tmp_path, capsys, "auto",
                                          "interrupted while counting GPUs")
    assert data["device"] == "auto"


def _interrupted_before_any_target(tmp_path, capsys, device, said):
    """Run main-gather on ``device`` (the test interrupts it): exit 130, ``said``,
    and a report that says no target ran. Returns the report."""
    report = tmp_path / "r.json"
    rc = cli.main(["run", "--device", device, "--target", "main-gather", "--seed", "1",
                   "--profile", "ci", "--corpus", str(tmp_path / "corpus"),
                   "--report", str(report)])
    out, err = capsys.readouterr()
    assert rc == 130
    assert f"{said}: no target ran" in out
    assert "streamfuzz: interrupted" in err and f"report in {report}" in err
    data = json.loads(report.read_text())
    assert data["interrupted"] and data["examples"] == 0
    assert data["failures"] == [] and data["targets"] == [] and data["target"] == []
    return data



def _cli(tmp_path, hook, *args, **popen):
    """``python -m streamfuzz``'s main in a fresh process, after ``hook`` (Python
    source) has run in it."""
    code = ("import os, signal, sys\nfrom streamfuzz.fuzz import cli, driver\n"
            f"from streamfuzz.fuzz.commands import run as run_cmd\n{hook}\n"
            "sys.exit(cli.main(sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


_SHIFTED = ["run", "--device", "cpu", "--target", "tests.targets:shifted_rows", "--seed", "3",
            "--profile", "ci"]


def test_a_failure_is_on_disk_before_shrinking_so_a_kill_loses_nothing(tmp_path):
    """``run`` killed (-9) once the replay reaches its first failure, before
    any shrinking: the failure is in the corpus, unshrunk, as ``soak`` keeps it."""
    store = tmp_path / "corpus"
    hook = "driver._found = lambda verdict: os.kill(os.getpid(), signal.SIGKILL)"
    proc = _cli(tmp_path, hook, *_SHIFTED, "--corpus", store)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err
    (path,) = store.rglob("*.json")
    entry = corpus.load(path)
    assert entry.kind == "value" and max(s.num_reqs for s in entry.scenario.steps) >= 3


def test_the_first_sight_gives_way_to_the_shrunk_entry_but_an_entry_already_there_stays(
        tmp_path, monkeypatch):
    store = tmp_path / "corpus"
    args = [*_SHIFTED, "--corpus", str(store)]
    seen = []
    real = corpus.FirstSight.save

    def save(self, entry):
        seen.append(entry)
        return real(self, entry)

    monkeypatch.setattr(corpus.FirstSight, "save", save)
    assert cli.main(args) == 1
    (shrunk,) = store.rglob("*.json")  # the first sight was saved, then removed
    assert len(seen) == 1 and corpus.load(shrunk).scenario != seen[0].scenario
    # The same run again, with its first sight already a corpus entry: it stays.
    older = corpus.save(store, seen[0])
    assert cli.main(args) == 1
    assert sorted(store.rglob("*.json")) == sorted({shrunk, older})


def test_sigterm_is_handled_as_ctrl_c(tmp_path):
    """A job's time limit or ``kill``: the report is written and says
    interrupted, and the exit status is Ctrl-C's."""
    report, mark = tmp_path / "r.json", tmp_path / "running"
    hook = textwrap.dedent(f"""
        real = run_cmd.Progress.__call__
        def progress(self, examples, elapsed, failed):
            real(self, examples, elapsed, failed)
            if examples == 5:
                open({str(mark)!r}, "w").close()
        run_cmd.Progress.__call__ = progress
        """)
    proc = _cli(tmp_path, hook, "run", "--device", "cpu", "--target", "main-gather",
                "--max-examples", "1000000", "--budget", "600", "--profile", "ci",
                "--corpus", tmp_path / "corpus", "--report", report)
    try:
        deadline = time.monotonic() + 240
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    data = json.loads(report.read_text())
    assert data["interrupted"] and data["targets"][0]["examples"] >= 5
    assert not list(tmp_path.glob(".r.json*"))


def test_the_progress_line_follows_the_shrinking_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    term = Tty()
    monkeypatch.setattr(sys, "stderr", term)
    progress = run_cmd.Progress("t", 30.0)
    for examples, elapsed, failed in ((1, 1.0, 0), (2, 2.0, 1), (9, 12.0, 1)):
        progress.line.last = 0.0  # each call draws (the line is drawn at most every 0.2 s)
        progress(examples, elapsed, failed)
    frames = term.getvalue().split("\r\033[K")[1:]
    assert frames[0].startswith("[t] 1 examples") and "0 failures" in frames[0]
    assert frames[-1] == "[t] shrinking: 7 examples tried in 10s, 2 failing", frames
    assert "\n" not in term.getvalue()  # one line that updates, on a terminal


def test_a_hang_names_the_collective_and_the_users_frames_and_no_absolute_path(tmp_path):
    with RankPool(2, "cpu", timeout=5.0) as pool:
        res = driver.fuzz(pool, "tests.targets:receiver_skips_drafts", profiles.get("ci"),
                          max_examples=5, corpus_dir=tmp_path, shrink_budget_s=0.1,
                          strategy=st.just(_four_requests()))
    assert res.failure is not None and res.failure.kind == "hang", res.failure
    msg = res.failure.message
    line = next(ln for ln in msg.splitlines() if "rank 1 waits" in ln)
    assert "broadcast" in line and "tests/targets.py:" in line and "_bcast" in line, msg
    saved = corpus.load(res.corpus_path).message
    assert not [w for w in saved.split() if w.startswith("/")], saved
