"""The worlds' private MPS server (``streamfuzz.fuzz.mps``): when it is wanted,
its start and stop through a stand-in control program, and what the worlds
do where it cannot start. The real server's run is a GPU test (test_gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from streamfuzz.fuzz import mps
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.worlds import Controller

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FAKE = textwrap.dedent("""\
    #!{python}
    # A stand-in for the MPS control program: -f makes the control pipe and waits
    # for a client's "quit"; without -f it is that client.
    import os, sys, time
    pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
    if sys.argv[1:] == ["-f"]:
        time.sleep(float(os.environ.get("FAKE_MPS_DELAY", "0")))
        if os.environ.get("FAKE_MPS_FAIL"):
            sys.exit("cannot open the GPU")
        open(os.path.join(pipe, "control"), "w").close()
        with open(os.path.join(pipe, "pid"), "w") as fh:
            fh.write(str(os.getpid()))
        while not os.path.exists(os.path.join(pipe, "quit")):
            time.sleep(0.01)
    elif sys.stdin.read().strip() == "quit":
        open(os.path.join(pipe, "quit"), "w").close()
    """)


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / mps.CONTROL
    prog.write_text(_FAKE.format(python=sys.executable))
    prog.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(mps, "_PROBE", "pass")  # no GPU here: a client that always starts
    return prog


def _gone(pid: int) -> bool:
    for _ in range(200):
        try:
            os.kill(pid, 0)
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.01)
    return False


def test_auto_wants_a_server_only_for_worlds_of_one_rank_sharing_a_gpu(monkeypatch):
    monkeypatch.delenv(mps.PIPE_ENV, raising=False)
    monkeypatch.setattr(mps, "_SYSTEM_PIPE", mps.Path("/nonexistent-mps"))
    assert mps.wanted("auto", "cuda", 16, 1)
    assert not mps.wanted("auto", "cuda", 1, 1)  # one world shares with nobody
    assert not mps.wanted("auto", "cuda", 4, 2)  # ranks of several GPUs talk through NCCL
    assert not mps.wanted("auto", "cpu", 4, 1)
    assert not mps.wanted("off", "cuda", 16, 1)
    assert mps.wanted("on", "cuda", 4, 2)
    monkeypatch.setenv(mps.PIPE_ENV, "/somewhere")  # the user's own MPS: theirs to run
    assert not mps.wanted("auto", "cuda", 16, 1)


def test_the_server_starts_private_and_stops_with_the_campaign(tmp_path, fake_control):
    server = mps.Server(tmp_path / "shared")
    server.start()
    assert server.env == {mps.PIPE_ENV: str(tmp_path / "shared" / "mps-pipe"),
                          mps.LOG_ENV: str(tmp_path / "shared" / "mps-log")}
    pid = int((server.pipe / "pid").read_text())
    server.stop()
    assert (server.pipe / "quit").exists(), "stopped by the control program's quit"
    assert _gone(pid)


def test_a_server_that_cannot_start_says_why(tmp_path, fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(mps.MpsUnavailable, match="cannot open the GPU"):
        mps.Server(tmp_path).start()
    monkeypatch.delenv("FAKE_MPS_FAIL")
    monkeypatch.setattr(mps, "_PROBE", "import sys; sys.exit('CUDA error 805')")
    server = mps.Server(tmp_path / "again")
    with pytest.raises(mps.MpsUnavailable, match="CUDA error 805"):
        server.start()
    assert (server.pipe / "quit").exists(), "a server whose clients fail is stopped"


def test_no_control_program_means_time_slices_under_auto_and_an_error_under_on(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no control program anywhere
    argv = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_MPS_PIPE_DIRECTORY'))"]

    def per_world(i, shared):
        return []

    ctl = Controller([], 1, per_world, mps_mode="auto")
    ctl.worlds[0].argv = argv
    assert ctl.run() == [0]
    ctl.cleanup()
    out, err = capsys.readouterr()
    assert "time slices (no MPS server: nvidia-cuda-mps-control is not on PATH)" in err
    assert "None" in out  # the world was not pointed at any server
    ctl = Controller([], 1, per_world, mps_mode="on")
    with pytest.raises(BadInput, match="--mps on: no MPS server"):
        ctl.run()
    ctl.cleanup()
    assert ctl.worlds[0].proc is None, "no world starts"


def test_worlds_run_pointed_at_the_private_server(tmp_path, fake_control, capsys):
    ctl = Controller([], 2, lambda i, shared: [], mps_mode="auto")
    for w in ctl.worlds:
        w.argv = [sys.executable, "-c",
                  "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"]
    assert ctl.run() == [0, 0]
    out, err = capsys.readouterr()
    assert "share the GPU by a private MPS server" in err
    assert out.count(str(ctl.shared / "mps-pipe")) == 2
    assert (ctl.shared / "mps-pipe" / "quit").exists(), "stopped when the worlds ended"
    ctl.cleanup()


def test_mps_on_without_a_gpu_is_refused_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "streamfuzz", "run", "--device", "cpu",
                           "--mps", "on", "--target", "main-gather", "--max-examples", "1",
                           "--corpus", str(tmp_path / "c")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "streamfuzz: error: --mps on shares a GPU between worlds, but the ranks run on cpu"]
    assert not (tmp_path / "c").exists()


def test_a_ctrl_c_while_the_server_starts_starts_no_world(tmp_path, fake_control, monkeypatch):
    import signal
    import threading

    monkeypatch.setenv("FAKE_MPS_DELAY", "1.0")
    ctl = Controller([], 2, lambda i, shared: [], mps_mode="on")
    for w in ctl.worlds:
        w.argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    assert ctl.run() == [130, 130]
    assert time.monotonic() - t0 < 20
    assert ctl.signals == [signal.SIGINT]
    assert all(w.proc is None for w in ctl.worlds)
    assert (ctl.shared / "mps-pipe" / "quit").exists(), "the server it started is stopped"
    ctl.cleanup()
