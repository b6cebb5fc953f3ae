"""A run is planned once: each target name parsed by one grammar and resolved,
its protocol decided in the driver, and the command line made into one frozen
plan that every process of the run can be given."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from streamfuzz.fuzz import targets
from streamfuzz.fuzz.commands import plan as plans
from streamfuzz.fuzz.commands.grammar import parser
from streamfuzz.fuzz.plan import WorldOf
from tests.helpers import ROOT

USERS_WEIGHT_SYNC = f"{ROOT / 'examples' / 'my_weight_sync.py'}:make_handler"


@pytest.mark.parametrize("name, parts", [
    ("pre-fix", {"base": "pre-fix"}),
    ("main-gather#57:12", {"base": "main-gather", "site": (57, 12)}),
    ("vllm-pp@0.32.0", {"base": "vllm-pp@0.32.0", "family": "vllm-pp", "version": "0.32.0"}),
    ("vllm-weights", {"base": "vllm-weights", "family": "vllm-weights"}),
    ("vllm-pp@0.32.0#3:4", {"base": "vllm-pp@0.32.0", "site": (3, 4), "family": "vllm-pp",
                            "version": "0.32.0"}),
    ("pkg.mod:make", {"base": "pkg.mod:make", "module": "pkg.mod", "attr": "make"}),
    ("dir/file.py:make#8:1", {"base": "dir/file.py:make", "site": (8, 1),
                              "module": "dir/file.py", "attr": "make"}),
])
def test_a_target_name_is_read_by_one_grammar(name, parts):
    parsed = targets.TargetName.parse(name)
    expected = {"site": None, "family": None, "version": None, "module": None, "attr": None,
                **parts}
    assert {k: getattr(parsed, k) for k in expected} == expected
    # The helpers that name a part read the same grammar.
    assert targets.names.split(name) == ((parsed.base, *parsed.site) if parsed.site else None)


def test_a_target_is_resolved_once_with_its_factorys_protocol():
    # The name alone says nothing of a user's protocol: the factory declares it.
    mine = targets.resolve_target(USERS_WEIGHT_SYNC)
    assert mine.protocol == "weight-sync" and mine.name == USERS_WEIGHT_SYNC
    assert targets.resolve_target("weight-sync-ordered").protocol == "weight-sync"
    assert targets.resolve_target("vllm-weights@0.34.0").protocol == "weight-sync"
    assert targets.resolve_target("pre-fix#57:12").protocol == "draft-broadcast"
    assert targets.resolve_target(mine) is mine  # resolved is resolved: nothing decided again
    assert pickle.loads(pickle.dumps(mine)) == mine  # what the ranks are sent


def test_the_run_plan_is_made_once_frozen_and_carries_the_resolved_targets(tmp_path):
    argv = ["run", "--target", USERS_WEIGHT_SYNC, "--target", "pre-fix", "--device", "cpu",
            "--weight-scale", "4", "--corpus", str(tmp_path / "corpus"), "--seed", "3"]
    plan = plans.for_run(parser().parse_args(argv), argv)
    assert [(t.name, t.protocol) for t in plan.targets] == [
        (USERS_WEIGHT_SYNC, "weight-sync"), ("pre-fix", "draft-broadcast")]
    assert (plan.device, plan.world_size, plan.worlds, plan.world_of) == ("cpu", 2, 1, None)
    assert plan.run_settings().weight_scale == 4 and plan.seed == 3
    assert plan.argv == tuple(argv) and plan.speaks_for_all
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.worlds = 2  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_a_world_is_told_which_it_is_by_one_field(tmp_path, monkeypatch):
    from streamfuzz.fuzz.worlds import child, write_plan

    ended: list[bool] = []
    monkeypatch.setattr(child, "end_with_parent", lambda: ended.append(True))
    world = WorldOf(1, 3, tmp_path)
    argv = ["soak", "--budget", "1m", "--target", "pre-fix", "--device", "cpu",
            "--out", str(tmp_path / "soak"), "--corpus", str(tmp_path / "corpus")]
    planned = plans.for_soak(parser().parse_args(argv), argv)  # the controller's, once
    write_plan(dataclasses.replace(planned, worlds=1, world_of=world))
    assert ended == []
    argv += ["--worlds", "1", "--world-of", str(world)]
    plan = plans.for_soak(parser().parse_args(argv), argv)
    assert plan.world_of == world and plan.worlds == 1 and not plan.speaks_for_all
    assert plan.targets == planned.targets  # handed over, not resolved again
    assert ended == [True]  # a world ends with its controller from its first step
