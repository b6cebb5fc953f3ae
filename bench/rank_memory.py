"""Does a rank's memory grow per example, and with which option?

Runs the same random scenarios (no Hypothesis, so only the ranks are measured)
through one warm rank pool once per option set, sampling every rank's RSS and
GPU memory; prints the growth per 1,000 examples after a warm-up.

    PYTHONPATH=. python bench/rank_memory.py --device cuda --examples 3000

A 10-minute H200 soak showed rank RSS rising about 2.3 KB per example on
main-gather (all oracles, gates), where a 30-minute CPU soak stayed flat:
this finds which part does it.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from streamfuzz.fuzz.bench import random_scenario
from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.ranks import RankPool

SETS = {
    "all+gates": RunOptions(oracles=["value", "lifetime", "reuse"], hold="gate"),
    "value+spins": RunOptions(oracles=["value"], hold="spin"),
    "value+gates": RunOptions(oracles=["value"], hold="gate"),
    "lifetime": RunOptions(oracles=["value", "lifetime"], hold="spin"),
    "reuse": RunOptions(oracles=["value", "reuse"], hold="spin"),
    "no-oracle": RunOptions(oracles=[], hold="spin"),
}


def _rss_mib(pool: RankPool) -> list[float]:
    return [round(m.rss / 2**20, 2) if m else float("nan") for m in pool.stats()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--target", default="main-gather")
    ap.add_argument("--examples", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    args = ap.parse_args()
    world = args.world_size or (2 if args.device == "cpu" else 1)
    rng = random.Random(5)
    batch = [random_scenario(rng, world) for _ in range(args.examples)]
    results = {}
    with RankPool(world, args.device, timeout=60) as pool:
        for name in args.sets:
            opts = SETS[name]
            for scn in batch[: args.warmup]:
                pool.run(args.target, scn, opts)
            before, t0 = _rss_mib(pool), time.perf_counter()
            for scn in batch:
                pool.run(args.target, scn, opts)
            after, dt = _rss_mib(pool), time.perf_counter() - t0
            per_k = [round((a - b) * 1000 / len(batch), 3) for a, b in zip(after, before)]
            results[name] = {"rss_before_mib": before, "rss_after_mib": after,
                             "mib_per_1000_examples": per_k, "examples_per_s":
                             round(len(batch) / dt, 1)}
            print(name, json.dumps(results[name]), flush=True)
    print(json.dumps({"device": args.device, "world_size": world, "target": args.target,
                      "examples": len(batch), "results": results}))


if __name__ == "__main__":
    main()
