"""``mutate``: sync sites by AST, one mutant each, caught or survived."""

from __future__ import annotations

import ast
import json

import pytest

from streamfuzz.fuzz import cli, mutate, sync_sites
from streamfuzz.fuzz.options import MUTATE
from streamfuzz.fuzz.targets import mutated

_SNIPPET = '''
import torch

class H:
    def send(self, t):
        with torch.cuda.stream(self.side):
            self.side.wait_stream(self.main)
            t.record_stream(self.side)
            ev = self.side.record_event()
        with self.streams.stream(self.side), open("f"):
            self.main.wait_event(ev)
        ev.synchronize()
        torch.cuda.synchronize()
        self.done.record(self.side)
        self.done.wait(self.main)
        self.side.wait_stream(self.main, 1)  # not a site: wrong shape
        print(t.record)

def make(ctx):
    return H()
'''


def _sites(src: str = _SNIPPET) -> list[sync_sites.Site]:
    tree = ast.parse(src)
    return sync_sites.find(sync_sites.scope(tree, "make"), "snippet.py")


def test_sites_match_by_name_and_shape_for_torch_cuda_and_stream_apis():
    got = [(s.line, s.rule) for s in _sites()]
    assert got == [(6, "stream context"), (7, "wait_stream"), (8, "record_stream"),
                   (9, "record_event"), (10, "stream context"), (11, "wait_event"),
                   (12, "synchronize"), (13, "synchronize"), (14, "Event.record"),
                   (15, "Event.wait")]


def test_scope_follows_the_factory_not_the_whole_module():
    src = _SNIPPET + "\nclass Other:\n    def f(self):\n        self.s.synchronize()\n"
    assert all(s.line < 20 for s in _sites(src))
    tree = ast.parse(src)
    assert any(s.line > 20 for s in sync_sites.find(sync_sites.scope(tree, "Other"), "x"))


def test_removing_a_stream_context_runs_its_body_on_the_enclosing_stream():
    tree = ast.parse(_SNIPPET)
    sites = _sites()
    plain = sync_sites.remove(tree, sites[0])
    text = ast.unparse(plain)
    assert "torch.cuda.stream" not in text and "self.side.wait_stream(self.main)" in text
    # The other item of a two-item with stays; the body keeps its lines.
    two = ast.unparse(sync_sites.remove(tree, sites[4]))
    assert "with open('f'):" in two and "self.streams.stream" not in two
    event = ast.unparse(sync_sites.remove(tree, sites[3]))
    assert f"ev = {sync_sites.HIT}(self.side)" in event
    fn = plain.body[1].body[0]
    assert fn.body[1].lineno == 7  # the wait stays on its line


def test_a_repeated_call_is_a_twin():
    src = "def f(s, m, t):\n    s.wait_stream(m)\n    t.record_stream(s)\n    s.wait_stream(m)\n"
    tree = ast.parse(src)
    waits = [s for s in sync_sites.find(tree.body, "x") if s.rule == "wait_stream"]
    assert [sync_sites.twin(tree.body, s) for s in waits] == [4, 2]
    sync = "s.wait_stream(m)\n    s.synchronize()\n"
    other = ast.parse(src.replace("s.wait_stream(m)\n", sync, 1))
    waits = [s for s in sync_sites.find(other.body, "x") if s.rule == "wait_stream"]
    assert sync_sites.twin(other.body, waits[0]) is None


def _run(target: str, lines: set[int], jobs: int = 1, corpus=None) -> mutate.Report:
    sites = [s for s in mutated.sites(target) if s.line in lines]
    assert {s.line for s in sites} == lines
    return mutate.run(target, sites, device="cpu", world_size=2, jobs=jobs, max_examples=30,
                      seed=0, options=MUTATE, timeout=30.0, shrink_budget_s=5.0,
                      corpus_dir=corpus, log=lambda _: None)


def _line_of(target: str, text: str) -> set[int]:
    src = mutated.source_of(target)
    return {s.line for s in sync_sites.find(sync_sites.scope(src.tree, src.root), src.path)
            if s.call == text}


def test_a_load_bearing_wait_is_caught():
    target = "tests.sync_targets:one_wait"
    report = _run(target, _line_of(target, "self.side.wait_stream(self.main)"))
    (row,) = report.rows
    assert row.verdict == "caught" and row.kind == "race", row
    assert 1 <= row.first_failure <= 30 and "race" in row.message


def test_a_redundant_second_wait_survives_and_is_called_redundant():
    target = "tests.sync_targets:two_waits"
    never = _line_of(target, "self.side.synchronize()")
    report = _run(target, _line_of(target, "self.side.wait_stream(self.main)") | never, jobs=2)
    assert [r.verdict for r in report.rows] == ["survived"] * 3
    assert all(r.examples == 30 for r in report.rows)
    unreached, *waits = report.rows
    assert all(r.reached and r.why.startswith("redundant") for r in waits)
    assert unreached.site.line in never and unreached.reached is False
    assert unreached.why.startswith("cannot tell: no example ran this line")


def test_cli_writes_json_and_markdown(tmp_path, capsys, rank_oracles):
    site = min(_line_of("tests.sync_targets:one_wait", "self.side.wait_stream(self.main)"))
    rc = cli.main(["mutate", "--target", "tests.sync_targets:one_wait", "--device", "cpu",
                   "--site", str(site), "--max-examples", "20", "--jobs", "1",
                   "--out", str(tmp_path), "--corpus", str(tmp_path / "corpus")])
    assert rc == 0
    assert {o for _, o in rank_oracles} == {frozenset({"lifetime"})}  # mutate's default
    data = json.loads((tmp_path / "tests.sync_targets-one_wait.json").read_text())
    assert [r["verdict"] for r in data["rows"]] == ["caught"]
    assert data["rows"][0]["site"]["line"] == site
    assert (tmp_path / "tests.sync_targets-one_wait.md").read_text().count("| caught |") == 1
    saved = list((tmp_path / "corpus").rglob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["target"].endswith(f"#{site}:12")


def test_bad_input_is_one_line_and_exit_2_before_work(capsys, tmp_path):
    for argv in (["--target", "no-such-target"],
                 ["--target", "no_such_module:make"],
                 ["--target", "tests.sync_targets:no_sync"],
                 ["--target", "tests.sync_targets:one_wait", "--site", "1"]):
        assert cli.main(["mutate", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("streamfuzz: error:") and "\n" not in err, err
    assert not list(tmp_path.iterdir())


def test_an_unclean_target_stops_before_any_mutant(capsys, tmp_path):
    rc = cli.main(["mutate", "--target", "pre-fix", "--device", "cpu", "--max-examples", "30",
                   "--out", str(tmp_path)])
    assert rc == 1
    err = capsys.readouterr().err.strip()
    assert "pre-fix is not clean" in err and "\n" not in err
    assert not list(tmp_path.iterdir())


def test_a_received_tensor_read_only_by_the_runner_still_needs_its_record_stream():
    # The runner reads what a rank received on main whatever the oracles, so
    # under the lifetime oracle alone the tokens' record_stream(main) is needed.
    target = "tests.sync_targets:records_tokens_apart"
    report = _run(target, _line_of(target, "tokens.record_stream(self.main)"))
    (row,) = report.rows
    assert row.verdict == "caught" and row.kind == "lifetime", row


def _vllm(name: str) -> None:
    from streamfuzz.fuzz import targets

    try:
        targets.upstream_of(name)
    except targets.TargetError as exc:
        pytest.skip(f"vLLM's wheel is not cached ({exc})")


def test_an_upstream_target_is_mutated_in_the_file_the_loader_reads():
    _vllm("vllm-pp@0.34.0")
    sites = mutated.sites("vllm-pp@0.34.0")
    assert {s.path for s in sites} == {"vllm-0.34.0/vllm/v1/worker/gpu/pp_utils.py"}
    assert "self.main_stream.synchronize()" in [s.call for s in sites]  # XPU branch
    # The pre-PR code is mutated as the loader edits it: its removed call is no site.
    pre = [s.call for s in mutated.sites("vllm-pp-pre-pr@0.32.0")]
    full = [s.call for s in mutated.sites("vllm-pp@0.32.0")]
    assert set(full) - set(pre) == {"input_batch.idx_mapping.record_stream(self.broadcast_stream)"}
    factory = mutated.load(mutated.name("vllm-pp@0.34.0", sites[0]))
    assert factory.upstream.version == "0.34.0"


def test_vllm_sampled_tokens_record_stream_is_caught_and_kept_with_its_provenance(tmp_path):
    _vllm("vllm-pp@0.34.0")
    target = "vllm-pp@0.34.0"
    report = _run(target, _line_of(target, "sampled_tokens.record_stream(self.main_stream)"),
                  corpus=tmp_path)
    (row,) = report.rows
    assert row.verdict == "caught" and row.kind == "lifetime", row
    entry = json.loads(open(row.corpus_path).read())
    up = entry["found_on"]["upstream"]
    assert up["version"] == "0.34.0" and up["edit"] is None
    assert up["mutant"].startswith(f"the sync call at line {row.site.line},")
