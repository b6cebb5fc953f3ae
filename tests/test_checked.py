"""streamfuzz.checked() and the pytest plugin, as a user's test suite meets them.

Plugin behaviour is checked by running pytest on small test files in a
subprocess, the way a user runs it (the plugin loads through its entry point).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import streamfuzz
from streamfuzz import _group
from streamfuzz.fuzz.errors import BadInput, CheckArgumentError, FuzzError
from tests.helpers import ROOT

# Plain torch.cuda code with the pre-PR bug, written as an engine's test would.
_PRE_PR = '''
import torch
import torch.distributed as dist

def send(n):
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    table = torch.arange(4 * n, device="cuda").view(n, 4)
    idx_mapping = torch.arange(n).to("cuda", non_blocking=True)
    with torch.cuda.stream(side):
        side.wait_stream(main)
        rows = table[idx_mapping]
        dist.broadcast(rows, src=0)
    del idx_mapping
    total = torch.zeros((), dtype=torch.int64, device="cuda")  # main allocates before it waits
    main.wait_stream(side)
    return (rows.sum() + total).item()
'''


@pytest.fixture(autouse=True)
def _own_group():
    """A one-rank group started by a check here must not outlive the test."""
    yield
    _group.close()


def _pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_user.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_collectives_in_a_block_run_on_a_one_rank_group():
    with streamfuzz.checked(device="cpu") as check:
        t = torch.arange(4)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    assert t.tolist() == [0, 1, 2, 3] and check.findings == []


def test_a_group_the_user_started_is_kept():
    _group.close()  # the one an earlier block in this process started, if any
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        with streamfuzz.checked(device="cpu"):
            dist.all_reduce(torch.ones(2))
        assert dist.is_initialized() and dist.group.WORLD is group
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"device": "tpu"}, "device must be one of cpu, cuda, auto, not 'tpu'"),
    ({"oracles": ["lifetime", "speed"]}, "unknown oracle(s) speed; choose from lifetime, race"),
])
def test_bad_arguments_say_what_is_allowed(kwargs, error):
    with pytest.raises(ValueError) as info:
        streamfuzz.checked(**kwargs)
    assert str(info.value) == error


def test_blocks_do_not_nest():
    with streamfuzz.checked(device="cpu"):
        with pytest.raises(RuntimeError, match="do not nest") as info:
            with streamfuzz.checked(device="cpu"):
                pass
    assert isinstance(info.value, BadInput) and "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs, says", [
    ({"device": "tpu"}, "device must be one of"),
    ({"device": torch.device("cpu")}, "device must be one of"),
    ({"oracles": ["x"]}, "unknown oracle(s) x; choose from lifetime, race"),
    ({"oracles": "lifetme"}, "unknown oracle(s) lifetme; choose from lifetime, race"),
    ({"oracles": 3}, "oracles must be a name or a list of names"),
    ({"pending_polls": 99}, "pending_polls must be an integer in 0..64, not 99"),
    ({"pending_polls": "2"}, "pending_polls must be an integer"),
    ({"collect": "yes"}, "collect must be True or False"),
])
def test_every_bad_argument_is_bad_input_in_one_line(kwargs, says):
    with pytest.raises(BadInput) as info:
        with streamfuzz.checked(**kwargs):
            pass
    assert isinstance(info.value, FuzzError) and isinstance(info.value, ValueError)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_a_bare_string_names_one_oracle():
    assert streamfuzz.checked(oracles="lifetime").oracles == ("lifetime",)
    with streamfuzz.checked(device="cpu", oracles="race", collect=True) as check:
        pass
    assert check.oracles == ("race",) and check.findings == []


@pytest.mark.parametrize("empty", [[], (), ""], ids=["list", "tuple", "string"])
def test_an_empty_oracle_list_is_refused_not_a_block_that_judges_nothing(empty):
    # An unset setting in config-driven code comes through as an empty list:
    # checking with no oracle would pass any code, so it is refused, as the
    # command line refuses it.
    with pytest.raises(CheckArgumentError) as info:
        streamfuzz.checked(oracles=empty)
    assert "no oracle given" in str(info.value) and "\n" not in str(info.value)


def test_an_empty_oracle_list_on_the_marker_fails_the_test(tmp_path):
    out = _pytest(tmp_path, """
        import pytest
        import torch

        @pytest.mark.streamfuzz(oracles=[], device="cpu")
        def test_no_oracles():
            torch.ones(2)
    """)
    assert "1 failed" in out.stdout and "passed" not in out.stdout, out.stdout
    assert "CheckArgumentError: no oracle given" in out.stdout, out.stdout


def test_bad_marker_and_fixture_arguments_are_bad_input(tmp_path):
    out = _pytest(tmp_path, """
        import pytest

        @pytest.mark.streamfuzz("cpu")
        def test_positional():
            pass

        @pytest.mark.streamfuzz(devise="cpu")
        def test_misspelt():
            pass

        @pytest.mark.streamfuzz(device="tpu")
        def test_bad_device(stream_checker):
            pass

        @pytest.mark.streamfuzz(oracles="lifetime", device="cpu")
        def test_one_oracle(stream_checker):
            assert stream_checker.oracles == ("lifetime",)
    """)
    assert "1 passed, 3 errors" in out.stdout, out.stdout
    errors = [ln for ln in out.stdout.splitlines() if ln.startswith("E ")]
    assert len(errors) == 3 and all("streamfuzz.fuzz.errors.CheckArgumentError: " in ln
                                    for ln in errors), errors
    assert any("takes keyword arguments only" in ln for ln in errors)
    assert any("takes no devise" in ln for ln in errors)
    assert any("device must be one of" in ln for ln in errors)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_a_gpu_is_refused_before_the_block_runs():
    ran = []
    with pytest.raises(ValueError, match="needs a CUDA GPU and none is visible"):
        with streamfuzz.checked(device="cuda"):
            ran.append(1)
    assert ran == []


def test_the_device_option_is_validated_by_pytest(tmp_path):
    res = _pytest(tmp_path, "def test_x():\n    pass\n", "--streamfuzz-device", "tpu")
    assert res.returncode == 4
    assert "argument --streamfuzz-device: invalid choice: 'tpu'" in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_the_cuda_device_option_without_a_gpu_is_one_usage_error(tmp_path):
    res = _pytest(tmp_path, "def test_x():\n    pass\n", "--streamfuzz-device", "cuda")
    assert res.returncode == 4
    assert "--streamfuzz-device cuda: no CUDA GPU is visible here" in res.stderr
    assert "Traceback" not in res.stderr


# -- plain torch.cuda code on simulated streams (no GPU needed) ------------------

# The marker form of examples/check_overlap.py: each example is its own block.
_MARKED = '''
import pytest
from hypothesis import given, settings, strategies as st

from examples.check_overlap import my_engine_step

@pytest.mark.streamfuzz
@settings(database=None, deadline=None)
@given(st.integers(1, 64))
def test_marker(n):
    assert my_engine_step(n).shape[0] == n
'''


def _plain(out: str) -> str:
    """pytest's failure sections without their ``E`` margins.

    The short summary is cut off: on CI (``CI`` set) pytest prints whole messages there too,
    so counting over it would depend on where the test runs.
    """
    return re.sub(r"(?m)^E? +", "", out.split("short test summary info")[0])


def _shrunk_to(out: str, test: str, example: str) -> bool:
    # "Falsifying example" in older Hypothesis versions, "Failing test case" in newer ones.
    return re.search(rf"(Falsifying example|Failing test case): {test}\(\n{example},\n\)",
                     out) is not None


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _shrink_run(tmp_path: Path, device: str) -> tuple[subprocess.CompletedProcess, str, str]:
    """examples/check_overlap.py and its marker form; the frames a finding must show."""
    (tmp_path / "test_user.py").write_text(_MARKED)
    example = ROOT / "examples" / "check_overlap.py"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--streamfuzz-device", device, str(example), "test_user.py"],
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=600)
    read = f"examples/check_overlap.py:{_line(example, 'rows = table[idx_mapping]')} my_engine_step"
    block = f"{read} <- examples/check_overlap.py:{_line(example, 'out = my_engine_step(n)')}"
    return res, f"{block} test_my_overlap\n", f"{read} <- test_user.py:11 test_marker\n"


def test_hypothesis_shrinks_a_finding_to_the_smallest_failing_example(tmp_path):
    res, block_frames, marker_frames = _shrink_run(tmp_path, "cpu")
    out = _plain(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "2 failed" in res.stdout, res.stdout
    # Both forms (a block in the test, the marker around each example) shrink to n=9.
    assert _shrunk_to(out, "test_my_overlap", "n=9") and _shrunk_to(out, "test_marker", "n=9")
    assert out.count("streamfuzz.StreamfuzzError: streamfuzz: 1 finding(s) in a checked block "
                     "(device cpu)\nlifetime: a tensor int64[9] made by aten._to_copy was freed "
                     "while stream side may still use it") == 2, out
    # The oracle's own message, with the user's frames and no test runner's.
    assert f"used on side:   {block_frames}" in out, out
    assert f"used on side:   {marker_frames}" in out, out
    # docs/pytest.md shows this example verbatim; what it prints there is
    # checked against a real run by tests/test_docs.py ("check-overlap").
    page = (ROOT / "docs" / "pytest.md").read_text()
    assert (ROOT / "examples" / "check_overlap.py").read_text().strip() in page
    assert "<!-- output: check-overlap -->" in page


def test_the_fixture_checks_the_whole_test_and_collect_keeps_findings(tmp_path):
    body = _PRE_PR + '''
import pytest
import streamfuzz

def test_fixture(stream_checker):
    assert send(2) == 28

def test_fixture_clean(stream_checker):
    x = torch.ones(3, device="cuda")
    assert x.sum().item() == 3

@pytest.mark.streamfuzz(collect=True)
def test_marker_collects():
    assert send(1) == 6

def test_collect():
    with streamfuzz.checked(collect=True) as check:
        send(3)
    assert [f.kind for f in check.findings] == ["lifetime"]

def test_oracle_choice():
    with streamfuzz.checked(oracles=["race"]) as check:
        send(3)
    assert check.findings == []

from hypothesis import given, strategies as st

@pytest.mark.streamfuzz(collect=True)
@given(st.integers(1, 4))
def test_collect_on_hypothesis(n):
    send(n)
'''
    res = _pytest(tmp_path, body, "--streamfuzz-device", "cpu", "-rA")
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert "1 failed, 4 passed, 1 error" in out, out
    assert "(collect=True) would drop every example's findings" in out
    assert "FAILED test_user.py::test_fixture - streamfuzz.StreamfuzzError" in out
    assert "freed (seen at):  test_user.py:" in out
    collected = out.split("Captured streamfuzz call")[1].split("\n\n")[0]
    assert "lifetime: a tensor int64[1] made by aten._to_copy was freed" in collected, out


def test_the_examples_pass_and_xfail_under_xdist():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "2", "--streamfuzz-device", "cpu", "-rxX",
                          "examples/test_user_code.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 1 xfailed" in res.stdout, res.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_examples_on_real_streams():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--streamfuzz-device", "cuda", "-rxX", "examples/test_user_code.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 1 xfailed" in res.stdout, res.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hypothesis_shrinks_a_finding_on_real_streams(tmp_path):
    res, block_frames, marker_frames = _shrink_run(tmp_path, "cuda")
    out = _plain(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert _shrunk_to(out, "test_my_overlap", "n=9") and _shrunk_to(out, "test_marker", "n=9")
    assert out.count("(device cuda)\nlifetime: a tensor int64[9] made by ") == 2, out
    assert block_frames in out and marker_frames in out, out


def broadcast_then_write(wait: bool) -> None:
    """The root's async broadcast reads ``x`` on the backend's stream: a write
    on main before waiting for it races with that read."""
    x = torch.ones(1 << 16, device="cuda")
    work = dist.broadcast(x, src=0, async_op=True)
    if wait:
        work.wait()
    x.add_(1)
    work.wait()


def waited_on_side_then_freed(record: bool) -> None:
    """An async broadcast waited for on a side stream only, of a tensor made on
    main: once the wait lets NCCL drop it, its free on main must be ordered
    after the side stream (``record_stream``)."""
    side = torch.cuda.Stream()
    x = torch.ones(1 << 16, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.broadcast(x, src=0, async_op=True).wait()
        if record:
            x.record_stream(side)
    del x


def async_collective_findings(device: str) -> dict[str, list[str]]:
    """Each form's findings, as ``kind: first line``."""
    out = {}
    for name, body in (("write after wait", lambda: broadcast_then_write(True)),
                       ("write before wait", lambda: broadcast_then_write(False)),
                       ("freed recorded", lambda: waited_on_side_then_freed(True)),
                       ("freed unrecorded", lambda: waited_on_side_then_freed(False))):
        with streamfuzz.checked(device=device, collect=True) as check:
            body()
        out[name] = [f"{f.kind}: {f.message.splitlines()[0]}" for f in check.findings]
    return out


def check_async_collective_findings(found: dict[str, list[str]]) -> None:
    assert found["write after wait"] == [] and found["freed recorded"] == [], found
    race = found["write before wait"]
    assert len(race) == 1 and race[0].startswith("race:") and "nccl(" in race[0], found
    freed = found["freed unrecorded"]
    assert len(freed) == 1 and freed[0].startswith("lifetime:") and "nccl(" in freed[0], found
    assert "record_stream of a stream that waited for nccl(" in freed[0], found


def test_an_async_collective_runs_on_the_backends_stream_until_waited_for():
    check_async_collective_findings(async_collective_findings("cpu"))


@streamfuzz.opaque(reads=["x"], writes=["out"])
def _launch(x, out):
    pass


def test_an_opaque_access_is_quoted_at_the_users_call_not_the_decorators_wrapper():
    with streamfuzz.checked(device="cpu", collect=True) as check:
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        out = torch.empty(4, device="cuda")
        with torch.cuda.stream(side):
            _launch(x, out)
        del out
    finding = next(f for f in check.findings if "used on side:" in f.message)
    used = finding.message.split("used on side:", 1)[1].splitlines()
    assert used[0].strip().startswith("tests/test_checked.py:"), finding.message
    assert used[1].strip() == "> _launch(x, out)", finding.message
