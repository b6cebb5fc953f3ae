"""The command line made into a ``streamfuzz.fuzz.plan.Plan``: each target resolved,
each option checked, the device, world size and worlds decided, once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from streamfuzz.fuzz import env, targets, upstream
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import (
    check_dir,
    check_file,
    judging,
    pick_device,
    pick_world_size,
    pick_worlds,
)
from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.plan import MatrixSettings, Plan, RunSettings, SoakSettings
from streamfuzz.fuzz.worlds import plan_of


class CountingGPUs(KeyboardInterrupt):
    """Ctrl-C while the GPU count waited for torch's import: ``run`` reports
    that no target ran, with the options it was given. ``shown``: the report
    to name (a world's is the controller's to name)."""

    def __init__(self, options: RunOptions, shown: Path | None) -> None:
        super().__init__()
        self.options, self.shown = options, shown


def for_run(args: argparse.Namespace, argv: Sequence[str]) -> Plan:
    """``run``'s plan; raises UsageError or TargetError (bad input) before any work."""
    if args.world_of is not None:  # a world: its controller planned it, once
        return plan_of(args.world_of)
    resolved = tuple(targets.check_importable(n) for n in _with_upstream(args.target,
                                                                          args.upstream))
    if args.weight_scale != 1 and all(t.protocol != "weight-sync" for t in resolved):
        raise UsageError(f"--weight-scale {args.weight_scale}: only weight-sync targets have "
                         f"weights to scale, and none of {', '.join(t.name for t in resolved)} "
                         "is one")
    check_dir(args.corpus, "--corpus")
    if args.report:
        check_file(args.report, "--report")
    options = RunOptions(oracles=args.oracle, hold=args.hold)
    if not options.oracles:  # bad input before any work, the GPU count included
        options.judging(args.device)
    try:
        device, gpus = pick_device(args.device)
    except KeyboardInterrupt:
        raise CountingGPUs(options, args.report) from None
    world = pick_world_size(device, gpus, args.world_size)
    judging(options, device)
    worlds = pick_worlds(args.worlds, args.mps, device, world)
    return Plan(command="run", argv=tuple(argv), targets=resolved, device=device,
                world_size=world, options=options, timeout_s=args.timeout, corpus=args.corpus,
                seed=args.seed, worlds=worlds, mps=args.mps,
                run=RunSettings(max_examples=args.max_examples, budget_s=args.budget,
                                shrink_budget_s=args.shrink_budget,
                                weight_scale=args.weight_scale, report=args.report,
                                profile=args.profile, requested_device=args.device))


def for_soak(args: argparse.Namespace, argv: Sequence[str]) -> Plan:
    """``soak``'s plan. Its oracles' notes are said by the world that judges
    (``judging``), not here."""
    if args.world_of is not None:  # a world: its controller planned it, once
        return plan_of(args.world_of)
    names = [n for arg in args.target or list(targets.BUILTIN) for n in arg.split(",") if n]
    resolved = tuple(targets.check_importable(name) for name in names)
    check_dir(args.out, "--out")
    check_dir(args.corpus, "--corpus")
    if args.database:
        check_dir(args.database, "--database")
    if (args.listen is None) != (args.ranks_external is None):
        raise UsageError("--listen and --ranks-external go together")
    if args.ranks_external:
        if args.device == "auto":
            raise UsageError("--ranks-external needs --device cpu or cuda (what the ranks use)")
        device, world = args.device, args.ranks_external
    else:
        device, gpus = pick_device(args.device)
        world = pick_world_size(device, gpus, args.world_size)
    try:
        authkey = env.authkey()
    except ValueError:
        raise UsageError(f"{env.AUTHKEY} must be hex") from None
    worlds = 1 if args.ranks_external else pick_worlds(args.worlds, args.mps, device, world)
    return Plan(command="soak", argv=tuple(argv), targets=resolved, device=device,
                world_size=world, options=RunOptions(oracles=args.oracle, hold=args.hold),
                timeout_s=args.timeout, corpus=args.corpus, seed=args.seed, worlds=worlds,
                mps=args.mps,
                soak=SoakSettings(budget_s=args.budget, out=args.out, database=args.database,
                                  round_s=args.round, shrink_s=args.shrink,
                                  round_examples=args.round_examples,
                                  stats_every_s=args.stats_every,
                                  recycle_mib=args.recycle_mib, listen=args.listen,
                                  ranks_external=args.ranks_external,
                                  startup_timeout_s=args.startup_timeout, authkey=authkey))


def for_matrix(args: argparse.Namespace, argv: Sequence[str]) -> Plan:
    """``matrix``'s plan: every built-in target unless rows are named."""
    device, gpus = pick_device(args.device)
    world = pick_world_size(device, gpus, None)
    names = args.target or list(targets.BUILTIN)
    resolved = tuple(targets.check_importable(name) for name in names)
    return Plan(command="matrix", argv=tuple(argv), targets=resolved, device=device,
                world_size=world, options=RunOptions(), timeout_s=args.timeout,
                corpus=Path("corpus"),
                matrix=MatrixSettings(max_examples=args.max_examples, seeds=args.seeds,
                                      columns=tuple(args.oracle) if args.oracle else None,
                                      expect=tuple(args.expect or ())))


def _with_upstream(names: list[str] | None, source: str | None) -> list[str]:
    """Target names with the vLLM family pinned to a version (``vllm-pp@0.32.0``).

    ``--upstream`` names the vLLM; the ranks find it again through
    ``env.UPSTREAM``. Without it the family runs an installed vllm.
    """
    bare = [n for n in names or () if _bare_family(n)]
    if source is None and not bare:
        return list(names or targets.VERSIONS)
    up = upstream.resolve(source)
    if up.kind != "installed":
        rest = env.text(env.UPSTREAM)
        os.environ[env.UPSTREAM] = os.pathsep.join(filter(None, [up.path, rest]))
    if not names:
        names = ["vllm-pp"] + (["vllm-pp-pre-pr"] if up.api == "table" else [])
    return [f"{targets.TargetName.parse(n).family}@{up.version}" if _bare_family(n) else n
            for n in names]


def _bare_family(name: str) -> bool:
    """A family that runs vLLM's code (the draft broadcast's, or the weight
    sync's) named without a version."""
    parsed = targets.TargetName.parse(name)
    return parsed.family is not None and parsed.version is None and parsed.site is None
