"""``soak``: a time-budgeted campaign (``streamfuzz.fuzz.soak``), alone or as parallel worlds."""

from __future__ import annotations

import argparse
import os
import sys

from streamfuzz.fuzz import targets
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import (
    check_dir,
    pick_device,
    pick_world_size,
    pick_worlds,
    run_options,
)
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.stop import StopReason


def soak_command(args: argparse.Namespace) -> int:

    from streamfuzz.fuzz.soak import Soak, SoakConfig, stop_on_signals
    from streamfuzz.fuzz.worlds import Claims

    names = args.target or list(targets.BUILTIN)
    names = [n for arg in names for n in arg.split(",") if n]
    for name in names:
        targets.check_importable(name)
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
    key = os.environ.get("STREAMFUZZ_AUTHKEY", "")
    try:
        authkey = bytes.fromhex(key) if key else None
    except ValueError:
        raise UsageError("STREAMFUZZ_AUTHKEY must be hex") from None
    worlds = 1 if args.ranks_external else pick_worlds(args, device, world)
    if worlds > 1:
        from streamfuzz.fuzz.worlds import soak_worlds

        return soak_worlds(args, worlds, device, world)
    cfg = SoakConfig(targets=names, budget_s=args.budget, out=args.out, corpus=args.corpus,
                     database=args.database or args.out / "hypothesis-db", round_s=args.round,
                     shrink_s=args.shrink, round_examples=args.round_examples,
                     stats_every_s=args.stats_every, seed=args.seed,
                     recycle_mib=args.recycle_mib, options=run_options(args, device),
                     claims=None if args.world_of is None else Claims(args.world_of.shared))
    pool = RankPool(world, device, timeout=args.timeout, startup_timeout=args.startup_timeout,
                    listen=args.listen, authkey=authkey)
    soak = Soak(pool, cfg)
    with stop_on_signals(soak):
        try:
            if args.listen:
                print(f"soak: waiting for {world} ranks on {args.listen[0]}:{args.listen[1]} "
                      f"(torchrun ... -m streamfuzz.rank)", file=sys.stderr, flush=True)
            pool.start()
            report = soak.run()
        finally:
            pool.close()
    if pool.lost is not None:
        print(f"soak: the external ranks are gone ({pool.lost}); the driver cannot replace "
              "them. Restart them (torchrun --max-restarts does) and start the same soak "
              "command again: it resumes.", file=sys.stderr)
        return 3
    if soak.stop_reason in STOP_SIGNALS:
        return 130  # interrupted, as for every command; the summary and report are written
    return 1 if report["failures"] else 0


STOP_SIGNALS = (StopReason.SIGINT, StopReason.SIGTERM)
"""The stop reasons of a soak that a signal ended (``streamfuzz.fuzz.soak.stop_on_signals``)."""
