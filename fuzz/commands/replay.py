"""``replay``: corpus entries run again as regressions."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import corpus, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import check_cpu_world, pick_device
from streamfuzz.fuzz.ranks import RankPool


def replay_command(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import driver

    entries = [corpus.load(p) for p in corpus.discover(args.paths)]
    if not entries:
        raise UsageError("no corpus entries (*.json) under the given paths")
    device, gpus = pick_device(args.device)
    bad = replayed = 0
    by_world: dict[tuple[str, int], list[corpus.Entry]] = {}
    for e in entries:
        try:
            targets.check_importable(e.target)
            targets.check_upstream(e.target, e.found_on.get("upstream"))
        except targets.TargetError as exc:
            if not _not_here(e.target):  # a name that means nothing: the entry is wrong
                raise UsageError(f"{e.path}: {exc}") from None
            # Absent here (a vLLM wheel not fetched, a user's file found from another
            # folder): skipped, as an entry found on a GPU is, and the rest replayed.
            print(f"{e.path}: skipped ({_why_not_here(e.target, exc)})")
            continue
        need = e.device
        if need != "cuda":
            check_cpu_world(e.scenario.world_size,
                             f"{e.path}: world size {e.scenario.world_size}")
        if need == "cuda" and device != "cuda":
            print(f"{e.path}: skipped (found on cuda; no GPU here)")
            continue
        by_world.setdefault((need, e.scenario.world_size), []).append(e)
    for (dev, world), group in sorted(by_world.items()):
        if dev == "cuda" and world > gpus:
            for e in group:
                print(f"{e.path}: skipped (needs {world} GPUs, {gpus} visible)")
            continue
        with RankPool(world, dev, timeout=args.timeout) as pool:
            for e in group:
                bad += _replay_one(driver, pool, e, args.attempts if dev == "cuda" else 1)
                replayed += 1
    if replayed < len(entries):
        print(f"replayed {replayed} of {len(entries)} entries; the other "
              f"{len(entries) - replayed} cannot run here (each skipped above, with why)")
    return 1 if bad else 0


def _not_here(name: str) -> bool:
    """Whether the code target ``name`` runs is absent here rather than the name
    wrong: vLLM's (a wheel not fetched, or another build of it), or a user's
    module or file (an entry is found from the folder it was found in)."""
    parsed = targets.TargetName.parse(name)
    if targets.family_of(parsed.base) is not None:
        return True
    module = parsed.module
    if module is None:
        return False
    if module.endswith(".py"):
        return not Path(module).is_file()
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True
    except Exception:  # there, but broken: an error to show, not a skip
        return False


def _why_not_here(name: str, exc: targets.TargetError) -> str:
    text = str(exc).removeprefix(f"target {name!r}: ").split("; supported versions")[0]
    if ".py:" in name and "no such file" in text:
        text += ("; a file target is found from the current folder: replay from the "
                 "folder it was found in")
    return f"{name}: {text}"


def _available(name: str) -> bool:
    try:
        targets.check_importable(name)
    except targets.TargetError:
        return False
    return True


def _replay_one(driver: Any, pool: RankPool, e: corpus.Entry, attempts: int) -> int:
    v = driver.replay(pool, e, attempts=attempts)
    status = f"still fails ({v.first.kind}: {v.first.message})" if not v.ok else "PASSES"
    wrong = v.ok
    line = f"{e.path}: {e.target} {status}"
    fix = protocols.get(e.protocol).correct
    if targets.is_builtin(e.target) and e.target not in targets.CORRECT:
        fixed = driver.replay(pool, e, target=fix)
        line += f"; {fix} " + ("passes" if fixed.ok else f"FAILS ({fixed.first.message})")
        wrong = wrong or not fixed.ok
    elif targets.upstream_family(e.target) and _available(targets.UPSTREAM_FIXED):
        fixed = driver.replay(pool, e, target=targets.UPSTREAM_FIXED)
        line += f"; {targets.UPSTREAM_FIXED} " + ("passes" if fixed.ok else
                                                  f"FAILS ({fixed.first.message})")
        wrong = wrong or not fixed.ok
    elif v.ok:  # a user's target: its entry records a bug of that code
        line += (": the bug no longer reproduces there. If you fixed it, delete this entry "
                 "(a replay expects every entry of a user's target to fail on it) or keep "
                 "its scenario as a regression test of the fix; if you did not, the failure "
                 "depends on timing or on the machine it was found on")
    print(line)
    return int(wrong)
