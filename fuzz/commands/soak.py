"""``soak``: a time-budgeted campaign (``streamfuzz.fuzz.soak``), alone or as parallel worlds."""

from __future__ import annotations

import sys

from streamfuzz.fuzz.commands.checks import judging
from streamfuzz.fuzz.plan import Plan
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.stop import StopReason


def soak_command(plan: Plan) -> int:
    from streamfuzz.fuzz.soak import Soak, SoakConfig, stop_on_signals
    from streamfuzz.fuzz.worlds import Claims

    soak, device, world = plan.soak_settings(), plan.device, plan.world_size
    if plan.worlds > 1:
        from streamfuzz.fuzz.worlds import soak_worlds

        return soak_worlds(plan)
    judging(plan.options, device)
    cfg = SoakConfig(targets=plan.names, budget_s=soak.budget_s, out=soak.out,
                     corpus=plan.corpus, database=soak.database or soak.out / "hypothesis-db",
                     round_s=soak.round_s, shrink_s=soak.shrink_s,
                     round_examples=soak.round_examples, stats_every_s=soak.stats_every_s,
                     seed=plan.seed, recycle_mib=soak.recycle_mib, options=plan.options,
                     claims=None if plan.world_of is None else Claims(plan.world_of.shared))
    pool = RankPool(world, device, timeout=plan.timeout_s,
                    startup_timeout=soak.startup_timeout_s, listen=soak.listen,
                    authkey=soak.authkey)
    campaign = Soak(pool, cfg)
    with stop_on_signals(campaign):
        try:
            if soak.listen:
                print(f"soak: waiting for {world} ranks on {soak.listen[0]}:{soak.listen[1]} "
                      f"(torchrun ... -m streamfuzz.rank)", file=sys.stderr, flush=True)
            pool.start()
            report = campaign.run()
        finally:
            pool.close()
    if pool.lost is not None:
        print(f"soak: the external ranks are gone ({pool.lost}); the driver cannot replace "
              "them. Restart them (torchrun --max-restarts does) and start the same soak "
              "command again: it resumes.", file=sys.stderr)
        return 3
    if campaign.stop_reason in STOP_SIGNALS:
        return 130  # interrupted, as for every command; the summary and report are written
    return 1 if report["failures"] else 0


STOP_SIGNALS = (StopReason.SIGINT, StopReason.SIGTERM)
"""The stop reasons of a soak that a signal ended (``streamfuzz.fuzz.soak.stop_on_signals``)."""
