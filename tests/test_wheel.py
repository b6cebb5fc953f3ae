"""The wheel owns one import name, ``streamfuzz``, and works installed.

Built from a copy of the tree (a stale ``build/`` cannot leak into it) and
installed into a fresh virtualenv that sees this interpreter's third-party
packages (torch, Hypothesis, pytest) but not the checkout, then used from an
empty folder as a user would. Slow (a wheel, a venv, ranks): ``make
wheel-check``, which CI runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, checkout_outputs

pytestmark = pytest.mark.slow

_FOLDERS = {"streamfuzz": "streamfuzz", "fuzz": "streamfuzz/fuzz",
            "strategies": "streamfuzz/strategies"}
"""Each folder of the repository, and where the wheel puts it."""

_USER_TEST = '''
import pytest
import torch


def step(n):
    main = torch.cuda.current_stream()
    idx = torch.arange(n).to("cuda", non_blocking=True)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        side.wait_stream(main)
        rows = idx * 2  # the side stream reads idx...
    del idx  # ...and main frees it
    main.wait_stream(side)
    return rows


@pytest.mark.streamfuzz
def test_marked_block_finds_the_free():
    step(4)


def test_fixture_block_is_clean(stream_checker):
    assert torch.ones(4, device="cuda").sum().item() == 4
'''


def _shipped() -> list[str]:
    """The files of the three folders that the wheel must carry."""
    listed = subprocess.run(["git", "ls-files", "--", *_FOLDERS], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        names = listed.stdout.split()
    else:  # not a git checkout
        names = [p.relative_to(ROOT).as_posix() for d in _FOLDERS for p in (ROOT / d).rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts]
    return sorted(n for n in names if (ROOT / n).is_file())


def _build(out: Path) -> Path:
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=checkout_outputs)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w", str(out)],
                           cwd=src, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("streamfuzz-*.whl")
    return wheel


def _fresh_venv(where: Path, wheel: Path) -> Path:
    """A venv with the wheel installed; this interpreter's site directories are
    plain lines of a .pth file (their own .pth files, such as an editable
    install's finder, are not run), so the checkout is nowhere on its path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip()
    sites = [p for p in sys.path
             if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
    Path(purelib, "_third_party.pth").write_text("".join(p + "\n" for p in sites))
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install",
                                "--no-deps", "--no-index", "-q", str(wheel)],
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return py


def test_the_wheel_owns_only_streamfuzz_and_works_installed(tmp_path):
    wheel = _build(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"streamfuzz", dist_info}
    top_level = zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split()
    assert top_level == ["streamfuzz"]
    missing = [f for f in _shipped()
               if f"{_FOLDERS[f.split('/')[0]]}/{f.partition('/')[2]}" not in names]
    assert not missing, f"pyproject.toml's package list leaves these out of the wheel: {missing}"

    py = _fresh_venv(tmp_path / "venv", wheel)
    user = tmp_path / "user"
    user.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], cwd=user, env=env, capture_output=True,
                              text=True, timeout=300)

    for other in ("fuzz", "strategies"):  # names of other projects: never installed by us
        r = run(py, "-c", f"import {other}")
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, r.stdout + r.stderr
    r = run(py, "-c", "import sys, streamfuzz, streamfuzz.fuzz.cli, streamfuzz.strategies; "
                      "print(streamfuzz.__file__); print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    where, torch_loaded = r.stdout.split()
    assert Path(where).is_relative_to(tmp_path / "venv"), where
    assert torch_loaded == "False"  # the command line still starts its ranks before torch

    for cmd in ([py, "-m", "streamfuzz", "run", "--help"],
                [tmp_path / "venv" / "bin" / "streamfuzz", "--help"]):
        r = run(*cmd)
        assert r.returncode == 0 and "usage: streamfuzz" in r.stdout, r.stdout + r.stderr

    # Two gloo ranks started from the installed package; the finding names the
    # built-in target's lines where the wheel put them.
    r = run(py, "-m", "streamfuzz", "run", "--target", "pre-fix", "--device", "cpu",
            "--max-examples", "30", "--seed", "0", "--shrink-budget", "10", "--corpus", "corpus")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pre-fix: FOUND lifetime" in r.stdout, r.stdout + r.stderr
    assert "streamfuzz/fuzz/draft/targets/pp_draft.py" in r.stdout, r.stdout
    # Parallel worlds: each is a `python -m streamfuzz` of its own, started by the
    # installed package.
    r = run(py, "-m", "streamfuzz", "run", "--worlds", "2", "--target", "pre-fix", "--device",
            "cpu", "--max-examples", "20", "--seed", "0", "--corpus", "corpus-worlds")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pre-fix: FOUND lifetime" in r.stdout and "2 worlds" in r.stdout, r.stdout + r.stderr

    # The pytest plugin, from its entry point: option, marker and fixture.
    (user / "test_user.py").write_text(_USER_TEST)
    r = run(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--streamfuzz-device", "cpu",
            "test_user.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert "StreamfuzzError" in r.stdout and "test_user.py:" in r.stdout, r.stdout
