"""``bench``: throughput against a hand loop, time to the first failure."""

from __future__ import annotations

import argparse

from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz import targets
from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.commands.checks import check_dir, run_options
from streamfuzz.fuzz.host import probe_gpus


def bench_command(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz import bench

    check_dir(args.out, "--out")
    draft = protocols.get(protocols.DEFAULT)
    names = args.target or [*draft.versions, *draft.mutants]
    for name in names:
        target = targets.check_importable(name)
        if target.protocol != draft.name:
            raise UsageError(f"bench measures the {draft.name} protocol only: {name!r} is a "
                             f"{target.protocol} target")
    gpus = probe_gpus() if args.device in ("cuda", "auto") else 0
    if args.device == "cuda" and gpus == 0:
        raise UsageError("--device cuda: no CUDA GPU is visible here")
    if args.cuda_world_size > max(gpus, 1) and args.device != "cpu":
        raise UsageError(f"--cuda-world-size {args.cuda_world_size}: {gpus} GPU(s) visible")
    devices = {"cpu": ["cpu"], "cuda": ["cuda"], "auto": ["cpu"] + (["cuda"] if gpus else [])}
    report = bench.run(devices[args.device], names, seeds=args.seeds, examples=args.examples,
                       detect_examples=args.detect_examples,
                       random_examples=args.random_examples,
                       oracle_examples=args.oracle_examples,
                       shrink_budget_s=args.shrink_budget, ff_examples=args.ff_examples,
                       ff_budget_s=args.ff_budget, timeout=args.timeout,
                       world_sizes={"cpu": args.cpu_world_size, "cuda": args.cuda_world_size},
                       options=run_options(args), waiting=args.waiting,
                       log=lambda line: print(line, flush=True),
                       save=lambda partial: bench.write(args.out, partial))
    json_path, md_path = bench.write(args.out, report)
    print(f"\n{md_path.read_text()}\nwrote {json_path} and {md_path}")
    return 0
