"""Parallel worlds: claims across processes, the merged reports, and real
``fuzz run`` / ``fuzz soak`` campaigns of two worlds on CPU."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamfuzz.fuzz import host, worlds_report
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import pick_worlds
from streamfuzz.fuzz.worlds import (
    CUDA_WORLD_MIB,
    ENV_WORLDS,
    GPU_WORLDS_CAP,
    Claims,
    WorldOf,
    default_worlds,
)

ROOT = Path(__file__).resolve().parent.parent


def _take(shared: str, key: str, q: "multiprocessing.Queue[bool]") -> None:
    q.put(Claims(Path(shared)).take(key))


def test_a_claim_is_won_by_exactly_one_process(tmp_path):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_take, args=(str(tmp_path), "pre-fix", q)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    won = [q.get(timeout=5) for _ in procs]
    assert won.count(True) == 1


@pytest.mark.fast
def test_the_claim_pair_stops_the_losers_never_the_winner(tmp_path):
    a, b = Claims(tmp_path).pair("t"), Claims(tmp_path).pair("t")
    assert not a[1]() and not b[1]()  # nobody found anything yet
    assert a[0]() is True
    assert not a[1](), "the world that claimed the failure must go on shrinking it"
    assert b[1]() and b[0]() is False
    other = Claims(tmp_path).pair("another target")
    assert not other[1]()


def test_a_held_key_waits_for_its_release_and_a_dead_holder_holds_nothing(tmp_path):
    c = Claims(tmp_path)
    c.hold("t", give_up=lambda: False)
    t0 = time.monotonic()
    calls = []

    def give_up():
        calls.append(1)
        if len(calls) == 3:
            c.release("t")
        return False

    c.hold("t", give_up=give_up)  # waits until the release above
    assert len(calls) >= 3 and time.monotonic() - t0 < 10
    c.release("t")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    c._path("u").write_text(dead)  # a holder that is gone
    c.hold("u", give_up=lambda: False)
    assert c._path("u").read_text() == str(os.getpid())


@pytest.mark.fast
def test_world_of_round_trips_and_bad_text_is_refused(tmp_path):
    w = WorldOf(2, 8, tmp_path)
    assert WorldOf.parse(str(w)) == w
    for bad in ("2/8", "x/8:/tmp", "2:/tmp", ""):
        with pytest.raises(ValueError):
            WorldOf.parse(bad)


@pytest.mark.fast
def test_default_worlds_leave_a_core_per_process_on_cpu():
    cores = len(os.sched_getaffinity(0))
    n, why = default_worlds("cpu", 2)
    assert 1 <= n <= max(1, cores // 3) and "cores" in why


@pytest.mark.fast
def test_default_worlds_on_a_gpu_node_take_a_core_a_rank_and_fit_the_gpu_memory(monkeypatch):
    monkeypatch.setattr(host, "cores", lambda: 16)
    monkeypatch.setattr(host, "gpu_free_mib", lambda: 80_000.0)
    assert default_worlds("cuda", 1)[0] == 16
    assert default_worlds("cuda", 2)[0] == 8
    monkeypatch.setattr(host, "cores", lambda: 64)
    n, why = default_worlds("cuda", 1)
    assert n == GPU_WORLDS_CAP and "at most" in why
    monkeypatch.setattr(host, "gpu_free_mib", lambda: 3.5 * CUDA_WORLD_MIB)  # a small card
    n, why = default_worlds("cuda", 1)
    assert n == 3 and "free" in why
    monkeypatch.setattr(host, "gpu_free_mib", lambda: 100.0)  # a full card: still one world
    assert default_worlds("cuda", 1)[0] == 1
    monkeypatch.setattr(host, "gpu_free_mib", lambda: None)  # no NVML: cores and the cap
    monkeypatch.setattr(host, "cores", lambda: 6)
    assert default_worlds("cuda", 1)[0] == 6


@pytest.mark.fast
def test_the_environment_gives_the_default_the_flag_wins_and_a_bad_value_is_refused(
        monkeypatch):
    monkeypatch.setattr(host, "cores", lambda: 16)
    monkeypatch.setattr(host, "gpu_free_mib", lambda: 80_000.0)
    monkeypatch.delenv(ENV_WORLDS)
    assert pick_worlds(None, "off", "cuda", 1) == 16
    monkeypatch.setenv(ENV_WORLDS, " 3 ")
    assert pick_worlds(None, "off", "cuda", 1) == 3
    assert pick_worlds(2, "off", "cuda", 1) == 2
    monkeypatch.setenv(ENV_WORLDS, "")  # set but empty: as if unset
    assert pick_worlds(None, "off", "cuda", 1) == 16
    for bad in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv(ENV_WORLDS, bad)
        with pytest.raises(UsageError, match=f"{ENV_WORLDS}='{bad}': not a number of worlds"):
            pick_worlds(None, "off", "cuda", 1)
    monkeypatch.setenv(ENV_WORLDS, "100000")  # more CPU ranks than any machine holds
    with pytest.raises(UsageError, match=f"{ENV_WORLDS}=100000 of 2 ranks: this machine"):
        pick_worlds(None, "off", "cpu", 2)


def test_a_bad_worlds_variable_is_one_line_before_any_work(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), ENV_WORLDS: "many"}
    p = subprocess.run([sys.executable, "-m", "streamfuzz", "run", "--device", "cpu",
                        "--corpus", str(tmp_path / "corpus"), "--report",
                        str(tmp_path / "r.json")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and ENV_WORLDS in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def _world_report(examples, elapsed, targets, failures=()):
    return {"device": "cpu", "world_size": 2, "examples": examples, "elapsed_s": elapsed,
            "examples_per_s": examples / elapsed, "rank_restarts": 0, "interrupted": False,
            "failures": list(failures), "targets": targets, "errors": []}


def _target(name, examples, rate, failure=None, duplicate=False, first=None):
    return {"target": name, "examples": examples, "elapsed_s": examples / rate,
            "examples_per_s": rate, "failure": failure, "duplicate": duplicate,
            "corpus_path": f"corpus/{name}/x.json" if failure and not duplicate else None,
            "first_failure_examples": first, "first_failure_s": 0.5 if first else None,
            "first_failure_at": None, "held_by": ["gate"], "gate_timeouts": 0,
            "interrupted": False, "upstream": None, "coverage": None}


@pytest.mark.fast
def test_merged_run_report_gives_each_finding_once_and_every_worlds_rate():
    w0 = _world_report(110, 2.0, [_target("pre-fix", 10, 5.0, "reuse", duplicate=True, first=3),
                                  _target("main-gather", 100, 50.0)])
    w1 = _world_report(102, 2.0, [_target("pre-fix", 2, 4.0, "reuse", first=2),
                                  _target("main-gather", 100, 60.0)],
                       failures=[{"target": "pre-fix", "kind": "reuse"}])
    m = worlds_report.merge_run([w0, w1, None], [1, 1, 70], wall_s=3.0)
    assert m["worlds"] == 3 and m["examples"] == 212
    assert m["examples_per_s"] == pytest.approx(55.0 + 51.0)
    pre = next(t for t in m["targets"] if t["target"] == "pre-fix")
    assert pre["found_in_world"] == 1 and pre["found_by_worlds"] == 2
    assert pre["first_failure_examples"] == 2 and pre["corpus_path"] == "corpus/pre-fix/x.json"
    clean = next(t for t in m["targets"] if t["target"] == "main-gather")
    assert clean["failure"] is None and clean["examples"] == 200
    assert clean["examples_per_s"] == pytest.approx(110.0)
    assert m["failures"] == [{"target": "pre-fix", "kind": "reuse", "world": 1}]
    assert "world 2 exited 70 without a report" in m["errors"]
    table = "\n".join(worlds_report.run_table(m))
    assert "3 worlds" in table and "w1" in table and "total 106.0/s" in table


def _fuzz(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "streamfuzz", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kw)


def test_two_worlds_find_one_bug_once_and_merge_their_report(tmp_path):
    report = tmp_path / "reports" / "r.json"  # a folder that does not exist yet
    p = _fuzz(["run", "--device", "cpu", "--worlds", "2", "--target", "pre-fix",
               "--target", "main-gather", "--max-examples", "30", "--profile", "ci",
               "--corpus", str(tmp_path / "corpus"), "--report", str(report)], tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 worlds of 2 cpu rank(s)" in p.stderr and "FOUND" in p.stdout
    saved = list((tmp_path / "corpus").rglob("*.json"))
    assert len(saved) == 1 and saved[0].parent.name == "pre-fix", saved
    rep = json.loads(report.read_text())
    assert rep["worlds"] == 2 and sorted(w["exit"] for w in rep["per_world"]) == [0, 1]
    assert len(rep["failures"]) == 1 and rep["failures"][0]["corpus_path"] == str(saved[0])
    clean = next(t for t in rep["targets"] if t["target"] == "main-gather")
    # Each world runs its share of --max-examples.
    assert clean["failure"] is None and clean["examples"] == 30
    assert "2 worlds" in p.stdout and "total" in p.stdout
    assert "2 worlds, judged by lifetime, value:" in p.stdout, p.stdout


def test_a_soak_of_two_worlds_merges_their_reports(tmp_path):
    out = tmp_path / "soak"
    p = _fuzz(["soak", "--device", "cpu", "--worlds", "2", "--budget", "6s", "--target",
               "main-gather", "--stats-every", "1s", "--out", str(out), "--corpus",
               str(tmp_path / "corpus")], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["worlds"] == 2 and len(rep["worlds"]) == 2
    assert rep["examples"] == sum(w["examples"] for w in rep["worlds"]) > 0
    for i in range(2):  # one database, shared
        world = json.loads((out / f"world-{i}" / "report.json").read_text())
        assert world["config"]["database"] == str(out / "hypothesis-db")
    md = (out / "report.md").read_text()
    assert "## Worlds" in md and "| w1 |" in md
    assert rep["targets_ran"] == 1 and rep["never_ran"] == [] and "- 1 of 1 targets ran" in md
    assert "; 1 of 1 targets ran; " in p.stderr.strip().splitlines()[-1], p.stderr


def test_ctrl_c_reaches_every_world_and_the_report_is_written(tmp_path):
    report = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfuzz", "run", "--device", "cpu", "--worlds", "2", "--target",
         "main-gather", "--max-examples", "100000", "--corpus", str(tmp_path / "corpus"),
         "--report", str(report)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        # Both worlds' ranks are up once each has written its ranks' start; wait for work.
        while time.monotonic() < deadline and not _both_running(proc.pid):
            time.sleep(0.5)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    rep = json.loads(report.read_text())
    assert rep["interrupted"] and rep["worlds"] == 2
    # The worlds' own reports are temporary: only the merged one is named.
    assert "world-0.json" not in err and "world-1.json" not in err, err
    assert err.strip().splitlines()[-1] == f"streamfuzz: interrupted; report in {report}", err
    assert all(w["report"] for w in rep["per_world"]), rep["per_world"]


def _both_running(pid: int) -> bool:
    """Whether the controller ``pid`` has two world processes with ranks under them."""
    children = _children(pid)
    return len(children) == 2 and all(_children(c) for c in children)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _check_many(path, n):
    from streamfuzz.fuzz.commands.checks import check_dir

    for _ in range(n):
        check_dir(path, "--corpus")


def test_worlds_checking_one_new_corpus_folder_at_once_all_pass(tmp_path):
    # Each world tries the folder for real and removes it again if it made it
    # and it is still empty: another world's try must not see it vanish.
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_check_many, args=(tmp_path / "corpus", 300))
             for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6


@pytest.mark.fast
def test_only_a_run_of_one_world_starts_a_zygote_several_worlds_start_none(monkeypatch):
    # A zygote serves one world's driver. The controller of several worlds
    # started one (and early CUDA ranks on a GPU node) and then ended it unused.
    from streamfuzz.fuzz import __main__ as entry
    from streamfuzz.fuzz import cli, zygote

    started = []

    class Counted:
        forks = True

        def __init__(self, env, log=None, cuda_ranks=0):
            started.append(cuda_ranks)

        def close(self):
            pass

    monkeypatch.setattr(zygote, "Zygote", Counted)
    monkeypatch.setattr(host, "_first_counter", None)  # what prestart sets, undone after
    monkeypatch.setattr(cli, "main", lambda: 0)  # the command line as far as its start
    monkeypatch.setenv(zygote.ENV, "1")
    monkeypatch.delenv(ENV_WORLDS, raising=False)
    monkeypatch.setattr(host, "cores", lambda: 64)  # a node that holds several by default
    monkeypatch.setattr(host, "cpu_world_limit", lambda: (256, "patched"))
    cpu = ["run", "--device", "cpu", "--target", "pre-fix"]
    for argv, env, zygotes in (
            (cpu + ["--worlds", "3"], {}, 0),
            (cpu, {ENV_WORLDS: "2"}, 0),
            (cpu, {}, 0),  # default_worlds: several on 64 cores
            (cpu + ["--worlds", "1"], {}, 1),
            (cpu, {ENV_WORLDS: "1"}, 1),
            (cpu + ["--worlds", "1", "--world-of", "0/3:shared"], {}, 1),  # a world's own
    ):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, "argv", ["streamfuzz", *argv])
        started.clear()
        try:
            assert entry.main() == 0
        finally:
            zygote._discard()
            monkeypatch.delenv(ENV_WORLDS, raising=False)
        assert len(started) == zygotes, (argv, env)


@pytest.mark.fast
def test_a_world_is_handed_its_plan_not_a_command_line_to_parse_again(tmp_path, monkeypatch):
    # Each world rebuilt its command line, then resolved its targets, probed the
    # device and decided its worlds again from it.
    from streamfuzz.fuzz import targets
    from streamfuzz.fuzz.commands import checks
    from streamfuzz.fuzz.commands import plan as plans
    from streamfuzz.fuzz.commands.grammar import parser
    from streamfuzz.fuzz.worlds import child, controller

    monkeypatch.setattr(checks, "cpu_world_limit", lambda: (64, "patched"))
    argv = ["run", "--device", "cpu", "--worlds", "2", "--target", "pre-fix",
            "--max-examples", "9", "--seed", "5", "--corpus", str(tmp_path / "corpus")]
    plan = plans.for_run(parser().parse_args(argv), argv)
    seen = []

    class Started(Exception):
        pass

    def again(*args, **kwargs):
        raise AssertionError("a world resolved or decided its plan again")

    def run(ctl):  # what each world starts with, read before the shared folder goes
        with monkeypatch.context() as m:
            for name in ("check_importable", "resolve_target"):
                m.setattr(targets, name, again)
            m.setattr(plans, "pick_device", again)
            m.setattr(plans, "pick_worlds", again)
            for w in ctl.worlds:
                world_argv = w.argv[3:]
                seen.append((world_argv, plans.for_run(parser().parse_args(world_argv),
                                                       world_argv)))
        raise Started

    monkeypatch.setattr(controller.Controller, "run", run)
    monkeypatch.setattr(child, "end_with_parent", lambda: None)
    with pytest.raises(Started):
        controller.run_worlds(plan)
    assert [p.world_of.index for _, p in seen] == [0, 1]
    for i, (world_argv, p) in enumerate(seen):
        assert world_argv == argv + ["--worlds", "1", "--world-of", str(p.world_of)]
        assert p.targets == plan.targets and p.worlds == 1 and p.seed == 5 + i
        assert p.run.max_examples == 5 and p.run.report.name == f"world-{i}.json"
