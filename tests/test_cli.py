import argparse
import json
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT, env_with_path
from tests.helpers import fuzz_cli as _cli


@pytest.mark.parametrize("args, message", [
    (["run", "--target", "no-such-target"], "unknown target 'no-such-target'"),
    (["run", "--target", "tests.nowhere:f"], "cannot import 'tests.nowhere'"),
    (["run", "--target", "tests/targets.py"],
     "target 'tests/targets.py' names a file, not the factory in it: write "
     "tests/targets.py:FACTORY"),
    (["run", "--target", "tests.targets:not_callable"], "is not callable"),
    (["run", "--target", "tests.targets:WeightSyncShaped"],
     "has no broadcast_drafts, receive_drafts, apply_received, which the draft-broadcast "
     "protocol calls; it has the weight-sync protocol's methods: declare protocol = "),
    (["run", "--world-size", "0"], "must be >= 1"),
    (["run", "--max-examples", "many"], "is not an integer"),
    (["run", "--budget", "nan"], "'nan' must be > 0"),
    (["run", "--timeout", "soon"], "is not a number of seconds"),
    (["run", "--device", "tpu"], "invalid choice"),
    (["run", "--device", "cuda", "--target", "pre-fix"], "no CUDA GPU"),
    (["run", "--device", "cpu", "--world-size", "100000"], "this machine holds at most"),
    (["run", "--corpus", "pyproject.toml"], "--corpus pyproject.toml: exists and is not a dir"),
    (["run", "--report", "pyproject.toml/r.json"], "--report pyproject.toml: exists and is not"),
    (["run", "--report", "tests"], "--report tests: is a directory"),
    (["soak", "--budget", "1m", "--out", "pyproject.toml"], "--out pyproject.toml: exists and"),
    (["run", "--timeout", "1e9"], "'1e9' must be > 0 and at most 86400 (a day)"),
    (["run", "--timeout", "1e12"], "'1e12' must be > 0 and at most 86400"),
    (["run", "--timeout", "1e30"], "'1e30' must be > 0 and at most 86400"),
    (["run", "--timeout", "inf"], "'inf' must be > 0 and at most 86400"),
    (["soak", "--budget", "1m", "--timeout", "1e12"], "'1e12' must be > 0 and at most 86400"),
    (["soak", "--budget", "1m", "--startup-timeout", "99999999999d"], "must be at most a day"),
    (["mutate", "--target", "pre-fix", "--timeout", "1e9"], "'1e9' must be > 0 and at most"),
    (["matrix", "--timeout", "1e30"], "'1e30' must be > 0 and at most 86400"),
    (["run", "--target", "weight-sync-ordered", "--weight-scale", "1" + "0" * 30],
     "must be in 1..65536"),
    (["run", "--target", "main-gather", "--weight-scale", "4"],
     "--weight-scale 4: only weight-sync targets have weights to scale, and none of main-gather"),
])
def test_bad_usage_is_one_line_and_exit_2(args, message):
    if "cuda" in args:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible")
    out = _cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in out.stderr


def test_weight_scale_applies_to_a_users_weight_sync_target(tmp_path):
    # The protocol comes from the factory's declaration, not from the name:
    # the draft broadcast's was taken, and the scale silently did nothing.
    (tmp_path / "mine.py").write_text(textwrap.dedent("""
        from streamfuzz.fuzz.weight_sync.targets import unordered

        def make(ctx):
            return unordered(ctx)

        make.protocol = "weight-sync"
    """))
    out = _cli("run", "--target", "mine.py:make", "--device", "cpu", "--weight-scale", "50",
               "--max-examples", "50", "--shrink-budget", "30", "--corpus", tmp_path / "corpus",
               cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    (saved,) = (tmp_path / "corpus").rglob("*.json")
    params = json.loads(saved.read_text())["scenario"]["params"]
    assert params and all(p["shape"][0] % 50 == 0 for p in params), params


def test_replay_skips_entries_that_cannot_run_here_and_replays_the_rest(tmp_path):
    # A fresh clone: no vLLM wheel fetched, and a user's entry replayed from
    # another folder than the one it was found in. Both are skipped with why;
    # the CPU entry still runs.
    entries = tmp_path / "corpus"
    for rel in ("pre-fix/lifetime-49e37d792dd6.json", "vllm-pp-0.32.0/race-136fec688d42.json"):
        (entries / rel).parent.mkdir(parents=True, exist_ok=True)
        (entries / rel).write_text((ROOT / "corpus" / rel).read_text())
    user = json.loads((ROOT / "corpus/pre-fix/lifetime-49e37d792dd6.json").read_text())
    user["target"] = "evhandler.py:make_host_no_sync"
    (entries / "mine").mkdir()
    (entries / "mine" / "lifetime-0.json").write_text(json.dumps(user))
    env = env_with_path()
    env["STREAMFUZZ_VLLM_CACHE"] = str(tmp_path / "no-wheels")
    out = _cli("replay", entries, "--device", "cpu", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    vllm = next(ln for ln in lines if "race-136fec688d42.json: skipped" in ln)
    assert "vLLM 0.32.0 is not here" in vllm
    mine = next(ln for ln in lines if "lifetime-0.json: skipped" in ln)
    assert "no such file 'evhandler.py'" in mine and "replay from the folder" in mine
    assert any("lifetime-49e37d792dd6.json: pre-fix still fails" in ln for ln in lines), lines
    assert lines[-1].startswith("replayed 1 of 3 entries; the other 2 cannot run here")


@pytest.mark.parametrize("oracle, judged", [("all", "lifetime, value"),
                                            ("lifetime", "lifetime")])
def test_the_table_says_which_oracles_judged_what_it_calls_clean(tmp_path, oracle, judged):
    out = _cli("run", "--target", "main-gather", "--device", "cpu", "--max-examples", "5",
               "--oracle", oracle, "--corpus", tmp_path / "corpus")
    assert out.returncode == 0, out.stderr
    assert f"streamfuzz on cpu, world size 2, judged by {judged}:" in out.stdout, out.stdout


def test_a_past_failure_replayed_counts_against_max_examples(tmp_path):
    # The first run saves a failure to the example database; the code is then
    # fixed, and the next run replays it first: "--max-examples 5" must run 5
    # examples in all, not 5 after the replay ("clean over 6 examples").
    (tmp_path / "mine.py").write_text(textwrap.dedent("""
        import os
        from streamfuzz.fuzz.draft.targets.pp_draft import MainGather, PreFix

        def make(ctx):
            return (PreFix if os.environ.get("MINE_BUGGY") else MainGather)(ctx)
    """))
    args = ("run", "--target", "mine.py:make", "--device", "cpu", "--max-examples", "5",
            "--corpus", tmp_path / "corpus")
    buggy = _cli(*args, cwd=tmp_path, env=env_with_path(ROOT) | {"MINE_BUGGY": "1"})
    assert buggy.returncode == 1, buggy.stdout + buggy.stderr
    fixed = _cli(*args, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "mine.py:make: clean over 5 examples" in fixed.stdout, fixed.stdout


@pytest.mark.parametrize("oracles, says", [([], "found_on names no oracle"),
                                           (["bogus"], "found_on: unknown oracle 'bogus'")])
def test_an_entry_whose_oracles_judge_nothing_is_refused_not_passed(tmp_path, oracles, says):
    # A hand-edited "oracles": [] replayed with no judge and said the bug was gone.
    src = json.loads((ROOT / "corpus/pre-fix/lifetime-49e37d792dd6.json").read_text())
    entry = tmp_path / "edited.json"
    entry.write_text(json.dumps(dict(src, found_on=dict(src["found_on"], oracles=oracles))))
    out = _cli("replay", entry, "--device", "cpu")
    assert out.returncode == 2 and out.stdout == "", out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert str(entry) in line and says in line, line


def test_bad_corpus_file_is_named_and_nothing_is_touched(tmp_path):
    good = tmp_path / "keep.json"
    good.write_text("{}")
    bad = tmp_path / "future.json"
    bad.write_text(json.dumps({"schema": 7}))
    out = _cli("replay", bad)
    assert out.returncode == 2 and str(bad) in out.stderr and "newer" in out.stderr
    assert good.read_text() == "{}"


def test_run_finds_saves_and_reports_then_replay_confirms(tmp_path):
    report = tmp_path / "r.json"
    out = _cli("run", "--target", "tests.targets:shifted_rows", "--device", "cpu",
               "--max-examples", "200", "--seed", "3", "--profile", "ci",
               "--corpus", tmp_path / "corpus", "--report", report)
    assert out.returncode == 1, out.stderr + out.stdout
    data = json.loads(report.read_text())
    for key in ("target", "device", "world_size", "examples", "elapsed_s", "examples_per_s"):
        assert key in data
    assert data["device"] == "cpu" and data["world_size"] == 2
    assert data["rank_start_s"]["process_group"] >= 0  # where a cold start went
    (failure,) = data["failures"]
    assert failure["kind"] == "value" and Path(failure["corpus_path"]).exists()
    assert "FOUND value" in out.stdout
    rep = _cli("replay", failure["corpus_path"], "--device", "cpu")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert "still fails" in rep.stdout


def test_a_target_the_ranks_find_set_up_wrong_is_one_line_and_the_others_still_run(tmp_path):
    report = tmp_path / "r.json"
    out = _cli("run", "--target", "tests.targets:weight_sync_shaped", "--target", "main-gather",
               "--device", "cpu", "--max-examples", "20", "--profile", "ci",
               "--corpus", tmp_path / "corpus", "--report", report)
    assert out.returncode == 2, out.stderr + out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("streamfuzz: error: target 'tests.targets:weight_sync_shaped': "
                           "the handler WeightSyncShaped has no "), line
    assert "declare protocol = 'weight-sync'" in line
    data = json.loads(report.read_text())
    assert [t["target"] for t in data["targets"]] == ["main-gather"]
    assert data["errors"] == [line.removeprefix("streamfuzz: error: ")]
    assert not any((tmp_path / "corpus").rglob("*.json"))  # no regression saved for it


def test_replay_of_a_missing_path_is_one_line():
    out = _cli("replay", "no/such/dir")
    assert out.returncode == 2 and "no/such/dir: no such file or directory" in out.stderr


def test_matrix_prints_cells_and_fails_on_a_miss():
    ok = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--target", "pre-fix",
              "--target", "main-gather", "--max-examples", "30", "--seeds", "1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pre-fix" in ok.stdout and "found lifetime 1/1" in ok.stdout
    assert "clean 1/1" in ok.stdout
    # A buggy target the lifetime oracle cannot see (wrong values, no stream bug) is a miss.
    miss = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--target",
                "tests.targets:shifted_rows", "--expect", "found", "--max-examples", "20",
                "--seeds", "1")
    assert miss.returncode == 1 and "FAIL: tests.targets:shifted_rows x lifetime" in miss.stdout


def test_matrix_judges_user_targets_by_what_they_declare(tmp_path):
    (tmp_path / "twins.py").write_text(textwrap.dedent("""
        from streamfuzz.fuzz.draft.targets.pp_draft import MainGather, PreFix

        def make_fixed(ctx):
            return MainGather(ctx)
        make_fixed.expected = "clean"

        def make_buggy(ctx):
            return PreFix(ctx)

        def make_undeclared(ctx):
            return MainGather(ctx)
    """))
    f = tmp_path / "twins.py"
    out = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--max-examples", "30",
               "--target", f"{f}:make_fixed", "--target", f"{f}:make_buggy",
               "--target", f"{f}:make_undeclared", "--expect", f"{f}:make_buggy=found")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.startswith(f"  {f}")}
    assert "clean 1/1" in rows[f"{f}:make_fixed"] and "FAIL" not in out.stdout
    assert "found lifetime 1/1" in rows[f"{f}:make_buggy"]
    assert "(no expectation)" in rows[f"{f}:make_undeclared"]
    assert f"note: {f}:make_undeclared declares no expectation" in out.stdout
    # Expected clean but found: a FAIL, exit 1.
    wrong = _cli("matrix", "--device", "cpu", "--oracle", "lifetime", "--max-examples", "30",
                 "--target", f"{f}:make_buggy", "--expect", "clean")
    assert wrong.returncode == 1 and "flagged a target expected clean" in wrong.stdout
    bad = _cli("matrix", "--device", "cpu", "--target", f"{f}:make_buggy", "--expect", "maybe")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_an_unwritable_report_place_is_refused_before_fuzzing(tmp_path):
    # /proc takes no new directories, even from root.
    out = _cli("run", "--device", "cpu", "--report", "/proc/streamfuzz-nowhere/r.json",
               "--corpus", tmp_path / "corpus")
    assert out.returncode == 2 and out.stdout == "", out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert "--report /proc/streamfuzz-nowhere: not a writable directory" in line


@pytest.mark.parametrize("args, flag", [
    (["mutate", "--target", "pre-fix", "--out", "/proc/streamfuzz-nowhere"], "--out"),
    (["mutate", "--target", "pre-fix", "--corpus", "/proc/streamfuzz-nowhere"], "--corpus"),
    (["scan", "examples/my_handler.py", "--md", "/proc/streamfuzz-nowhere/x.md"], "--md"),
    (["scan", "examples/my_handler.py", "--json", "/proc/streamfuzz-nowhere/x.json"], "--json"),
    (["scan", "examples/my_handler.py", "--harness", "my_handler.py:45", "--out",
      "/proc/streamfuzz-nowhere/t.py"], "--out"),
    (["bench", "--device", "cpu", "--out", "/proc/streamfuzz-nowhere"], "--out"),
])
def test_every_output_place_is_checked_before_any_work(args, flag):
    # mutate did all its work (46 s on a user's target), then lost its table
    # to a folder it could not write; scan crashed with a traceback.
    out = _cli(*args, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out.stdout
    (line,) = out.stderr.strip().splitlines()
    assert f"{flag} /proc/streamfuzz-nowhere: not a writable directory" in line, line


@pytest.mark.parametrize("source, where, what", [
    ("x = 1\ndef f(:\n", "broken.py:2", "SyntaxError: invalid syntax"),
    ("import os\n\nraise ValueError('no config')\n", "broken.py:3", "ValueError: no config"),
    ("import no_such_dependency_xyz\n", "broken.py:1", "No module named 'no_such_dependency_xyz'"),
])
def test_a_target_module_that_fails_to_import_is_one_line_with_file_and_line(
        tmp_path, source, where, what):
    (tmp_path / "broken.py").write_text(source)
    out = _cli("run", "--device", "cpu", "--target", "broken:make", cwd=tmp_path,
               env=env_with_path(ROOT, tmp_path), timeout=120)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "importing 'broken' failed at " in line and where in line and what in line, line
    assert str(tmp_path / "broken.py") in line


def test_replay_names_the_file_whose_target_is_unknown_or_too_big(tmp_path):
    src = json.loads(next(ROOT.glob("corpus/pre-fix/*.json")).read_text())
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps(dict(src, target="no-such-target")))
    out = _cli("replay", unknown, "--device", "cpu")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"streamfuzz: error: {unknown}: unknown target 'no-such-target'")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(dict(src, scenario=dict(src["scenario"], world_size=100000))))
    out = _cli("replay", big, "--device", "cpu")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert f"{big}: world size 100000: this machine holds at most" in line


def test_run_help_documents_every_option_and_names_the_targets():
    out = _cli("run", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for flag in ("--max-examples", "--seed", "--corpus", "--report", "--profile", "--device",
                 "--budget", "--world-size", "--timeout", "--hold", "--oracle", "--target",
                 "--shrink-budget"):
        described = text.split(flag, 2)[-1].split(" --")[0]
        assert "default" in described, (flag, described)
    for name in ("pre-fix", "pr-fix", "main-gather", "missing-wait", "staging-buffer"):
        assert name in text.split("built-in targets:")[1]


def test_a_crash_of_the_tool_is_not_exit_1(tmp_path):
    """A traceback is exit 70, so it is never mistaken for 'failures found'."""
    (tmp_path / "hypothesis").mkdir()  # shadows the real package: the driver cannot start
    (tmp_path / "hypothesis" / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    out = _cli("run", "--device", "cpu", env=env_with_path(tmp_path, ROOT), timeout=120)
    assert out.returncode == 70, out.stderr
    assert "RuntimeError: broken install" in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("streamfuzz: crashed")


def test_a_clean_run_leaves_no_empty_corpus_folder(tmp_path):
    out = _cli("run", "--target", "main-gather", "--device", "cpu", "--max-examples", "5",
               "--seed", "0", "--report", "out/r.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "clean over 5 examples" in out.stdout
    assert not (tmp_path / "corpus").exists() and (tmp_path / "out" / "r.json").is_file()


def test_a_factory_that_raises_on_the_smallest_scenario_is_set_up_wrong(tmp_path):
    out = _cli("run", "--target", "tests.targets:factory_raises", "--device", "cpu",
               "--max-examples", "20", "--seed", "0", "--corpus", tmp_path / "c",
               "--report", tmp_path / "r.json")
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "factory raises on the smallest scenario" in line and "KeyError" in line, line
    assert "tests/targets.py:" in line
    assert not (tmp_path / "c").exists()


def test_a_factory_that_raises_on_some_scenarios_only_is_a_finding(tmp_path):
    out = _cli("run", "--target", "tests.targets:factory_raises_on_big_batches", "--device",
               "cpu", "--max-examples", "100", "--seed", "0", "--profile", "ci",
               "--corpus", tmp_path / "c")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FOUND crash" in out.stdout and "no room for 3 requests" in out.stdout
    assert len(list((tmp_path / "c").rglob("*.json"))) == 1


def test_every_option_of_every_command_says_what_it_does_and_its_default():
    from streamfuzz.fuzz.commands.grammar import parser as grammar

    parser = grammar()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, command in sub.choices.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            text = action.help or ""
            needs_default = action.option_strings and not action.required
            if not text or (needs_default and "default" not in text):
                missing.append(f"{name} {action.option_strings or action.dest}")
    assert missing == [], missing


def test_run_help_lists_every_built_in_target_and_family():
    from streamfuzz.fuzz import protocol as protocols

    text = " ".join(_cli("run", "--help").stdout.split()).replace("- ", "-")
    listed = text.split("built-in targets:")[1]
    for p in protocols.all_protocols().values():
        for name in p.targets:
            assert name in listed, name
        for family in p.families:
            assert f"{family}@VERSION" in listed, family


def test_the_target_option_has_one_name_and_the_old_one_warns(tmp_path):
    out = _cli("soak", "--budget", "1s", "--device", "cpu", "--targets", "no-such-target",
               "--out", tmp_path / "s")
    assert out.returncode == 2
    assert "--targets is now --target" in out.stderr and "unknown target 'no-such-target'" \
        in out.stderr
    for command in ("run", "soak", "matrix", "bench", "mutate"):
        assert "--target T" in _cli(command, "--help").stdout, command


def test_replay_of_a_fixed_user_entry_says_what_to_do(tmp_path):
    src = json.loads(next(ROOT.glob("corpus/pre-fix/*.json")).read_text())
    entry = tmp_path / "fixed.json"
    fixed = "streamfuzz.fuzz.draft.targets.pp_draft:main_gather"
    entry.write_text(json.dumps(dict(src, target=fixed)))
    out = _cli("replay", entry, "--device", "cpu")
    assert out.returncode == 1, out.stderr
    assert "PASSES: the bug no longer reproduces there. If you fixed it, delete" in out.stdout
