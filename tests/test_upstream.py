"""vLLM's own PPHandler as a target: reading sources, the AST edit, bad input, real runs.

The tests that run vLLM's code need its wheel in the cache (``.ci/run`` fetches
it; ``python -m streamfuzz.vllm fetch 0.32.0 0.34.0`` does it by hand) and skip,
saying so, without it. The rest use small handler files written here that
only have the shape of vLLM's API.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from streamfuzz.fuzz import corpus, driver, targets, upstream
from streamfuzz.fuzz.draft.reference import expected_applied
from streamfuzz.fuzz.draft.scenario import Scenario, Step
from streamfuzz.fuzz.draft.targets import vllm_standins
from streamfuzz.fuzz.options import RunOptions
from tests.helpers import ROOT
from tests.helpers import fuzz_cli as _cli

# The shape of each API (signatures only): enough for reading and the AST edit.
_TABLE_API = '''
class PPHandler:
    def __init__(self, max_num_reqs, num_speculative_steps, device): pass
    def broadcast(self, sampled_token_ids, num_sampled, num_rejected, input_batch): pass
    def broadcast_drafts(self, draft_tokens, input_batch):
        with ctx():
            send = draft_tokens[input_batch.idx_mapping]
            input_batch.idx_mapping.record_stream(self.side)
    def receive(self, input_batch): pass
    def get_prev_sampled_outputs(self, draft_tokens_to_update=None): pass
'''
_GATHERED_API = (_TABLE_API.replace("def receive(self, input_batch)",
                                    "def receive(self, input_batch, recv_drafts)")
                 .replace("draft_tokens_to_update=None", "")
                 .replace("def broadcast_drafts(self, draft_tokens, input_batch):",
                          "def broadcast_drafts(self, draft_tokens):")
                 .replace("            input_batch.idx_mapping.record_stream(self.side)\n", ""))


def _wheel(path: Path, version: str, text: str | None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
        zf.writestr("vllm/__init__.py", "")
        if text is not None:
            zf.writestr(upstream.FILE, text)
    return path


def _real(name: str):
    try:
        return targets.upstream_of(name)
    except targets.TargetError as exc:
        pytest.skip(f"vLLM's wheel is not cached ({exc})")


# -- reading ---------------------------------------------------------------------

def test_wheel_sdist_and_tree_give_the_same_file(tmp_path):
    whl = _wheel(tmp_path / "vllm-9.1.0-py3-none-any.whl", "9.1.0", _TABLE_API)
    sdist = tmp_path / "vllm-9.1.0.tar.gz"
    tree = tmp_path / "src"
    (tree / Path(upstream.FILE).parent).mkdir(parents=True)
    (tree / upstream.FILE).write_text(_TABLE_API)
    (tree / "PKG-INFO").write_text("Version: 9.1.0\n")
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(tree, arcname="vllm-9.1.0")
    got = [upstream.read(str(p)) for p in (whl, sdist, tree, tree / "vllm")]
    assert {u.sha256 for u in got} == {got[0].sha256}
    assert [u.kind for u in got] == ["wheel", "sdist", "tree", "tree"]
    assert {u.version for u in got} == {"9.1.0"} and {u.api for u in got} == {"table"}


def test_api_variants_are_told_apart(tmp_path):
    assert upstream.read(str(_wheel(tmp_path / "a.whl", "9.2.0", _GATHERED_API))).api == \
        "gathered"


def test_the_pre_pr_edit_removes_exactly_the_idx_mapping_record(tmp_path):
    up = upstream.read(str(_wheel(tmp_path / "b.whl", "9.3.0", _TABLE_API)))
    edited = upstream.pre_pr(up)
    assert edited.sha256 == up.sha256  # the file as shipped; the edit is named beside it
    assert edited.edit == ("removed `input_batch.idx_mapping.record_stream(self.side)` "
                           "(line 8) from PPHandler.broadcast_drafts")
    assert edited.provenance()["edit"] == edited.edit and up.provenance()["edit"] is None
    gathered = upstream.read(str(_wheel(tmp_path / "c.whl", "9.4.0", _GATHERED_API)))
    with pytest.raises(upstream.UpstreamError, match="0 idx_mapping.record_stream calls"):
        upstream.pre_pr(gathered)


def test_stand_ins_answer_vllm_imports_only_and_leave_sys_modules_alone():
    imp = vllm_standins.builtins()["__import__"]
    envs = imp("vllm.envs", None, None, None, 0).envs
    assert envs.VLLM_XPU_PP_MICROBATCH is False
    with pytest.raises(ImportError, match="not vllm.model_executor"):
        imp("vllm.model_executor", None, None, ("x",), 0)
    assert "vllm" not in sys.modules or not sys.modules["vllm"].__doc__.startswith("streamfuzz")
    assert imp("json", None, None, None, 0) is json


def test_reference_leaves_non_final_rows_alone_when_the_handler_does():
    step = Step(idx_mapping=(0, 1), final=(True, False), num_sampled=(1, 0),
                num_rejected=(0, 0))
    scn = Scenario(world_size=2, max_num_reqs=2, num_spec_steps=1, steps=(step,))
    assert expected_applied(scn)[0].table == [[100000], [100016]]
    assert expected_applied(scn, non_final=False)[0].table == [[100000], [0]]


# -- bad input: one line on stderr, exit 2, before any work ------------------------

@pytest.mark.parametrize("case", ["missing", "no-file", "unknown-api", "pre-pr-on-0.34"])
def test_bad_upstream_is_one_line_and_exit_2(case, tmp_path):
    if case == "missing":
        args = ["--upstream", str(tmp_path / "nowhere.whl")]
        want = "no such file or directory"
    elif case == "no-file":
        args = ["--upstream", str(_wheel(tmp_path / "vllm-0.20.0.whl", "0.20.0", None))]
        want = f"vLLM 0.20.0 has no {upstream.FILE}"
    elif case == "unknown-api":
        odd = _TABLE_API.replace("def receive(self, input_batch)",
                                 "def receive(self, input_batch, stream, extra)")
        args = ["--upstream", str(_wheel(tmp_path / "vllm-0.40.0.whl", "0.40.0", odd))]
        want = "PPHandler has an API the runner model does not know"
    else:
        whl = _wheel(tmp_path / "vllm-0.34.9.whl", "0.34.9", _GATHERED_API)
        args = ["--upstream", str(whl), "--target", "vllm-pp-pre-pr"]
        want = "the pre-PR code derives only from 0.30.0, 0.31.0 or 0.32.0"
    res = _cli("run", "--device", "cpu", "--corpus", str(tmp_path / "corpus"), *args)
    assert res.returncode == 2, res.stderr
    assert res.stdout == "" and res.stderr.count("\n") == 1, res.stderr
    assert want in res.stderr
    if case != "pre-pr-on-0.34":
        assert "0.30.0, 0.31.0, 0.32.0" in res.stderr and "0.34.0" in res.stderr
    assert not (tmp_path / "corpus").exists()


def test_a_version_not_cached_says_how_to_get_it(tmp_path):
    env = {**__import__("os").environ, "STREAMFUZZ_VLLM_CACHE": str(tmp_path)}
    res = _cli("run", "--device", "cpu", "--target", "vllm-pp@0.32.0", env=env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "python -m streamfuzz.vllm fetch 0.32.0" in res.stderr


# -- vLLM's code, when its wheel is cached -----------------------------------------

def test_released_files_are_the_known_ones():
    for name, version in (("vllm-pp@0.32.0", "0.32.0"), ("vllm-pp@0.34.0", "0.34.0")):
        up = _real(name)
        assert version in upstream.KNOWN[up.sha256]
    edited = _real("vllm-pp-pre-pr@0.32.0")
    assert "input_batch.idx_mapping.record_stream(self.broadcast_stream)" in edited.edit


def test_real_vllm_on_cpu_race_lifetime_and_clean(cpu_pool, ci_settings, tmp_path):
    """0.32.0's handler races on the draft table, the derived pre-PR code frees
    idx_mapping under the side stream's read, 0.34.0's is clean."""
    for name in ("vllm-pp@0.32.0", "vllm-pp-pre-pr@0.32.0", "vllm-pp@0.34.0"):
        _real(name)
    opts = RunOptions(oracles=["lifetime"])
    res = driver.fuzz(cpu_pool, "vllm-pp@0.32.0", ci_settings, max_examples=200, seed=0,
                      corpus_dir=tmp_path, options=opts)
    assert res.failure is not None and res.failure.kind == "race", res.failure
    assert "on draft_table" in res.failure.message
    assert "vllm-0.32.0/vllm/v1/worker/gpu/pp_utils.py" in res.failure.message
    entry = corpus.load(res.corpus_path)
    assert entry.target == "vllm-pp@0.32.0"
    assert entry.found_on["upstream"]["sha256"] == _real("vllm-pp@0.32.0").sha256
    assert entry.found_on["upstream"]["edit"] is None
    fixed = driver.replay(cpu_pool, entry, target="vllm-pp@0.34.0")
    assert fixed.ok, fixed.summary()

    res = driver.fuzz(cpu_pool, "vllm-pp-pre-pr@0.32.0", ci_settings, max_examples=200, seed=0,
                      corpus_dir=tmp_path, options=opts)
    assert res.failure is not None and res.failure.kind == "lifetime", res.failure
    assert res.failure.message.startswith("idx_mapping ")
    assert corpus.load(res.corpus_path).found_on["upstream"]["edit"].startswith("removed")

    res = driver.fuzz(cpu_pool, "vllm-pp@0.34.0", ci_settings, max_examples=60, seed=0,
                      options=RunOptions(oracles=["value", "lifetime"]))
    assert res.failure is None and res.examples == 60


def test_an_installed_vllm_is_found_without_importing_it(tmp_path):
    site = tmp_path / "site"
    (site / Path(upstream.FILE).parent).mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('vllm must not be imported')\n")
    (site / upstream.FILE).write_text(_GATHERED_API)
    (site / "vllm-9.5.0.dist-info").mkdir()
    (site / "vllm-9.5.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 9.5.0\n")
    code = ("from streamfuzz.fuzz import targets; up = targets.upstream_of('vllm-pp@9.5.0'); "
            "print(up.kind, up.version, up.api)")
    env = {**__import__("os").environ, "PYTHONPATH": f"{site}:{ROOT}"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["installed", "9.5.0", "gathered"]


def test_an_unsupported_version_is_refused_before_any_download(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STREAMFUZZ_VLLM_CACHE", str(tmp_path / "cache"))

    def no_download(*args, **kwargs):
        raise AssertionError(f"downloaded: {args}")

    monkeypatch.setattr(upstream.subprocess, "run", no_download)
    assert upstream.main(["fetch", "0.29.0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "vLLM 0.29.0 is not a supported version, so it is not fetched" in line
    assert not (tmp_path / "cache").exists()
    # Nor does a run tell the user to fetch it.
    with pytest.raises(upstream.UpstreamError, match="not a supported version") as info:
        upstream.resolve("0.29.0")
    assert "streamfuzz.vllm fetch" not in str(info.value)
