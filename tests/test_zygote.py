"""Ranks forked from a zygote: who their parent is, replacements, the GPU
count that keeps it fork-safe, and the fallback to spawned ranks when the
zygote is off, gone or never started."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamfuzz.fuzz import driver, host, zygote
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.zygote import early as early_ranks
from streamfuzz.fuzz.zygote import serve
from tests.helpers import ROOT, parent_pid

_STEP = Step(idx_mapping=(0, 1), final=(True, True), num_sampled=(1, 1), num_rejected=(0, 0))
_SCN = Scenario(world_size=2, max_num_reqs=2, steps=(_STEP,))


def _gone(pids: list[int], within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(zygote._exists(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_ranks_and_their_replacements_are_forked_from_one_zygote():
    with RankPool(2, "cpu", timeout=60.0) as pool:
        forker = pool._zygote
        assert forker is not None and forker.alive
        first = pool.pids
        assert [parent_pid(p) for p in first] == [forker.proc.pid] * 2
        assert driver.evaluate(pool, "main-gather", _SCN).ok
        pool.restart()
        assert set(pool.pids).isdisjoint(first)
        assert [parent_pid(p) for p in pool.pids] == [forker.proc.pid] * 2
        assert driver.evaluate(pool, "main-gather", _SCN).ok
        zpid = forker.proc.pid
    assert _gone([zpid])


def test_a_zygote_killed_under_a_world_costs_one_crash_then_ranks_are_spawned():
    with RankPool(2, "cpu", timeout=60.0) as pool:
        os.killpg(pool._zygote.proc.pid, signal.SIGKILL)
        assert _gone(pool.pids)  # its ranks die with it
        out = pool.run("main-gather", _SCN)
        assert out.failure is not None and out.failure.kind == "crash"
        assert "killed by SIGKILL" in out.failure.message
        assert pool.restarts == 1
        assert [parent_pid(p) for p in pool.pids] == [os.getpid()] * 2
        assert driver.evaluate(pool, "main-gather", _SCN).ok


def test_the_off_switch_spawns_every_rank(monkeypatch):
    monkeypatch.setenv(zygote.ENV, "0")
    with RankPool(2, "cpu", timeout=60.0) as pool:
        assert pool._zygote is None
        assert [parent_pid(p) for p in pool.pids] == [os.getpid()] * 2
        assert driver.evaluate(pool, "main-gather", _SCN).ok


def test_a_run_starts_its_zygote_early_and_its_pool_adopts_it_only_if_the_env_matches(
        monkeypatch):
    for argv in (["run", "--help"], ["replay", "x.json"], []):
        zygote.prestart(argv)
        assert zygote._early is None, argv
    zygote.prestart(["run", "--target", "pre-fix", "--device", "cuda"])
    assert zygote._early is not None  # CUDA ranks fork from it too
    zygote._discard()
    zygote.prestart(["run", "--target", "pre-fix", "--device", "cpu"])
    early = zygote._early
    assert early is not None
    try:
        # It answers the GPU probe (a throwaway process answers the same) and is
        # kept for the pool, unless it had to touch CUDA to count a GPU.
        gpus = host.probe_gpus()
        kept, zygote._early = zygote._early, None
        assert host.probe_gpus() == gpus  # a throwaway process counts the same
        assert kept is (early if early.forks else None)
        if gpus:
            return
        zygote._early = early
        assert zygote.adopt(dict(os.environ, STREAMFUZZ_ANYTHING="x")) is early
        zygote._early = early
        assert zygote.adopt(dict(os.environ, OMP_NUM_THREADS="7")) is None
        assert zygote._early is None and not early.alive
    finally:
        early.close()


def test_a_driver_killed_with_9_takes_its_zygote_and_ranks_with_it(tmp_path):
    code = ("import os, sys; from streamfuzz.fuzz.ranks import RankPool\n"
            "pool = RankPool(2, 'cpu', timeout=60.0); pool.start()\n"
            "print(pool._zygote.proc.pid, *pool.pids, flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        proc.kill()
        proc.wait()
    assert _gone(pids)


def test_ctrl_c_while_the_command_line_starts_is_exit_130_and_one_line(monkeypatch, capsys):
    from streamfuzz.fuzz import __main__ as entry

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(zygote, "prestart", interrupted)
    monkeypatch.setattr(sys, "argv", ["streamfuzz", "run", "--device", "cpu", "--worlds", "1"])
    assert entry.main() == 130
    assert capsys.readouterr().err == "streamfuzz: interrupted\n"


@pytest.mark.parametrize(("compiled", "nvml", "cuda", "expect"), [
    (False, 3, 3, (0, True)),  # a CPU build counts nothing, touches nothing
    (True, 2, 2, (2, True)),  # NVML counts: CUDA untouched, CUDA ranks still fork
    (True, 0, 0, (0, True)),
    (True, -1, 1, (1, False)),  # NVML cannot: CUDA counted, and it is started now
    (True, -1, 0, (0, True)),  # ... no device there: CPU ranks still fork
])
def test_the_gpu_count_says_whether_the_zygote_still_forks(monkeypatch, compiled, nvml, cuda,
                                                             expect):
    import torch

    touched = []
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: compiled)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: touched.append(1) or cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
    assert serve._count_gpus() == expect
    assert bool(touched) == (compiled and nvml < 0)


def _children(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_pid(int(entry)) == pid:
                    out.add(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_early_ranks_become_the_first_world_and_the_surplus_is_ended(monkeypatch):
    # Three started early (no GPU here: their contexts fail and torch is left
    # to start the device, as in a forked rank), a world of two takes two.
    early = zygote.Zygote(dict(os.environ), cuda_ranks=3)
    deadline = time.monotonic() + 30
    while len(_children(early.proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = _children(early.proc.pid)
    assert len(started) == 3
    monkeypatch.setattr(zygote, "_early", early)
    with RankPool(2, "cpu", timeout=60.0) as pool:
        assert pool._zygote is early
        assert set(pool.pids) < started  # the ranks are early ones, not forks
        assert driver.evaluate(pool, "main-gather", _SCN).ok
        (surplus,) = started - set(pool.pids)
        deadline = time.monotonic() + 30
        while surplus not in early.codes and time.monotonic() < deadline:
            early.reap(0.5)
        assert surplus in early.codes  # ended and reaped, not left waiting
        pool.restart()  # a later world is forked after the imports
        assert set(pool.pids).isdisjoint(started)
        assert driver.evaluate(pool, "main-gather", _SCN).ok


@pytest.mark.parametrize(("argv", "env", "gpus", "want"), [
    (["run"], {}, 4, 4),
    (["run", "--device", "cpu"], {}, 4, 0),
    (["run", "--device=cuda", "--world-size", "2"], {}, 4, 2),
    (["run", "--world-size=8"], {}, 4, 4),
    (["run"], {"CUDA_VISIBLE_DEVICES": "1,3"}, 4, 2),
    (["run"], {"CUDA_VISIBLE_DEVICES": "0,-1,2"}, 4, 1),
    (["run"], {"CUDA_VISIBLE_DEVICES": ""}, 4, 0),
    (["run"], {zygote.EARLY_ENV: "0"}, 4, 0),
    (["run"], {}, None, 0),
])
def test_how_many_ranks_start_early(monkeypatch, argv, env, gpus, want):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    real = os.listdir

    def listdir(path):
        if str(path) == "/proc/driver/nvidia/gpus":
            if gpus is None:
                raise FileNotFoundError(path)
            return [f"0000:{i:02x}:00.0" for i in range(gpus)]
        return real(path)

    monkeypatch.setattr(zygote.os, "listdir", listdir)
    assert zygote._cuda_ranks(argv) == want


class _FakeNccl:
    """libnccl as ctypes would hand it over: loaded after ``loads_after`` looks."""

    def __init__(self, loads_after: int, init_result: int = 0) -> None:
        self.looks, self.loads_after, self.init_result = 0, loads_after, init_result
        self.calls: list[tuple] = []

    def cdll(self, name, mode=0):
        assert name == "libnccl.so.2" and mode & os.RTLD_NOLOAD  # never loads one itself
        self.looks += 1
        if self.looks <= self.loads_after:
            raise OSError("not loaded")
        return self

    def ncclCommInitAll(self, comm, n, devices):
        self.calls.append(("init", n, list(devices)))
        return self.init_result

    def ncclCommDestroy(self, comm):
        self.calls.append(("destroy",))
        return 0


@pytest.mark.parametrize(("loads_after", "init_result", "calls"), [
    (3, 0, [("init", 1, [2]), ("destroy",)]),  # torch's import loads it: one comm of device 2
    (10**9, 0, []),  # never loaded (no CUDA torch, NCCL linked in): nothing, once imported
    (0, 5, [("init", 1, [2])]),  # NCCL refuses: nothing to destroy, nothing timed
])
def test_an_early_rank_starts_nccl_with_the_library_torch_loaded(monkeypatch, loads_after,
                                                                  init_result, calls):
    import ctypes
    import threading

    fake = _FakeNccl(loads_after, init_result)
    monkeypatch.setattr(ctypes, "CDLL", fake.cdll)
    imported, took = threading.Event(), []
    thread = threading.Thread(target=lambda: took.append(early_ranks._start_nccl(2, imported)))
    thread.start()
    deadline = time.monotonic() + 30  # the import runs: it looks until the library is there
    while fake.looks <= min(loads_after, 5) and time.monotonic() < deadline:
        time.sleep(0.01)
    if loads_after > 100:
        assert thread.is_alive()  # not loaded, and the import not over: it keeps looking
    imported.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert fake.calls == calls
    assert (took[0] is not None) == bool(calls and init_result == 0)


@pytest.mark.parametrize(("switch", "pieces"), [
    ("1", ["early_context", "early_nccl"]),
    ("context", ["early_context"]),
])
def test_the_early_start_pieces_follow_the_switch(monkeypatch, switch, pieces):
    import threading

    monkeypatch.setenv(zygote.EARLY_ENV, switch)
    monkeypatch.setattr(early_ranks, "_make_context", lambda index: 0.1)
    monkeypatch.setattr(early_ranks, "_start_nccl", lambda index, imported: 0.2)
    took: dict[str, float] = {}
    early_ranks._start_beside(0, took, threading.Event())
    assert list(took) == pieces
