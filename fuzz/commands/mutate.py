"""``mutate``: remove each sync of a target in turn and fuzz it."""

from __future__ import annotations

import argparse
import sys

from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import check_dir, judging, pick_device, pick_world_size
from streamfuzz.fuzz.options import (
    RunOptions,
)


def mutate_command(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import mutate, mutate_report

    check_dir(args.out, "--out")  # a mutate run takes minutes: its table must not be lost
    if args.corpus is not None:
        check_dir(args.corpus, "--corpus")
    try:
        sites = mutate.select(args.target, args.site)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    device, gpus = pick_device(args.device)
    world = args.world_size or (2 if device == "cpu" else 1)
    pick_world_size(device, gpus, world)
    options = RunOptions(oracles=args.oracle)
    judging(options, device)
    try:
        report = mutate.run(args.target, sites, device=device, world_size=world,
                            jobs=args.jobs or mutate.default_jobs(device, gpus, world),
                            max_examples=args.max_examples, seed=args.seed,
                            options=options, timeout=args.timeout,
                            shrink_budget_s=args.shrink_budget, corpus_dir=args.corpus,
                            log=lambda line: print(line, flush=True))
    except mutate.NotClean as exc:
        print(f"streamfuzz: {exc}", file=sys.stderr)
        return 1
    json_path, md_path = mutate_report.write(args.out, report)
    print(f"\n{mutate_report.text(report)}\nwrote {json_path} and {md_path}")
    return 0 if report.complete else 130
