"""What a finding reads like: the user's lines, paths a reader can open, no harness noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hypothesis

from streamfuzz.fuzz.sites import display_path, source_line
from tests.helpers import ROOT


def test_a_file_outside_the_project_is_shown_from_its_import_root():
    core = str(Path(hypothesis.__file__).parent / "core.py")
    assert display_path(core) == os.path.join("hypothesis", "core.py")
    assert display_path(str(ROOT / "fuzz" / "sites.py")) == os.path.join("fuzz", "sites.py")


def test_a_site_shows_its_line_of_code():
    assert source_line(__file__, 1) == '"""What a finding reads like: the user\'s lines, paths a ' \
                                       'reader can open, no harness noise."""'
    assert source_line("/no/such/file.py", 3) == ""


def test_hypothesis_explains_a_failure_with_the_users_lines_only(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--streamfuzz-device", "cpu", "--hypothesis-verbosity=verbose",
                          str(ROOT / "examples" / "check_overlap.py")],
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    explained = res.stdout.split("always and only run by failing test cases:")[1]
    explained = explained.split("\n\n")[0]
    assert "check_overlap.py:" in explained, res.stdout
    for ours in ("fuzz/", "streamfuzz/", "strategies/"):
        assert f"{ROOT}/{ours}" not in explained, explained


def test_an_uncaught_error_after_a_checked_block_has_no_rank_prefix(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import torch, streamfuzz\n"
                      "with streamfuzz.checked(device='cpu'):\n"
                      "    x = torch.ones(2, device='cuda')\n"
                      "raise ValueError('the user code failed')\n")
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    assert "ValueError: the user code failed" in res.stderr
    assert "[rank0]" not in res.stderr, res.stderr
