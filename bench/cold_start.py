"""Where a cold start goes, phase by phase, each in a fresh interpreter.

``streamfuzz.fuzz.bench`` measures a cold start end to end (process start to the first
failure). This splits it: the interpreter alone, ``import torch``, the
driver's and the rank's module imports, the device's first use, the gate
pool (the PTX kernel ranks load; Triton's, with an empty and a warm cache)
and a one-rank process group.
Each phase is a subprocess timed from before it is spawned, median of
``--repeat`` runs; ``-X importtime``'s heaviest modules for the driver and the
rank come next. Last, end to end: ``python -m streamfuzz run`` from process start to
its first failure (``streamfuzz.fuzz.bench.from_process_start``) for pre-fix and pr-fix,
with ranks forked from the zygote and spawned (``STREAMFUZZ_ZYGOTE=0``),
alternating. ``--only TEXT`` runs the phases named with TEXT alone.

    PYTHONPATH=. python bench/cold_start.py --device cuda --out reports/cold-start
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _script  # bench/_script.py, beside this script

from streamfuzz.fuzz.bench import from_process_start
from streamfuzz.fuzz.options import DEFAULT

_PG = ("import os, torch, torch.distributed as dist\n"
       "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(29000 + os.getpid() % 1000),"
       " RANK='0', WORLD_SIZE='1')\n"
       "dev = torch.device({dev!r}, 0) if {dev!r} == 'cuda' else torch.device('cpu')\n"
       "cuda = dev.type == 'cuda'\n"
       "if cuda: torch.cuda.set_device(dev)\n"
       "bound = {{'device_id': dev}} if cuda and {bound} else {{}}\n"
       "dist.init_process_group('nccl' if cuda else 'gloo', **bound)\n"
       "g = dist.new_group(backend='nccl' if cuda else 'gloo') if {own} else dist.group.WORLD\n"
       "t = torch.zeros(1, device=dev); dist.broadcast(t, 0, group=g)\n"
       "if cuda: torch.cuda.synchronize(dev)\n"
       "dist.destroy_process_group()\n")
"""A rank's process group as ``streamfuzz.fuzz.rank_main`` makes it (``bound``: the default
group bound to the device, so NCCL starts at once; ``own``: a group of its own for
the target), and one broadcast on it."""

_GATES = ("import torch\nfrom streamfuzz.fuzz.gates import Gates\n"
          "Gates.create(torch.device('cuda', 0), kinds=({kind!r},))\n")


def _phases(device: str) -> dict[str, str]:
    out = {
        "interpreter": "pass",
        "import torch": "import torch",
        "import driver (streamfuzz.fuzz.cli)":
            "import streamfuzz.fuzz.cli, sys; assert 'torch' not in sys.modules",
        "import rank (streamfuzz.fuzz.rank_main)": "import streamfuzz.fuzz.rank_main",
        "first device tensor": f"import torch; torch.zeros(1, device={device!r})",
        "process group + broadcast": _PG.format(dev=device, bound=True, own=True),
    }
    if device == "cuda":  # what NCCL's start costs, communicator by communicator
        out["process group, default group only"] = _PG.format(dev=device, bound=True, own=False)
        out["process group, not bound, own group"] = _PG.format(dev=device, bound=False,
                                                                 own=True)
        out["gates, PTX (what ranks load)"] = _GATES.format(kind="ptx")
        out["gates, Triton, empty Triton cache"] = _GATES.format(kind="triton")
        out["gates, Triton, warm Triton cache"] = _GATES.format(kind="triton")
    return out


def _time(code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _heaviest(module: str, env: dict[str, str], top: int = 15) -> list[tuple[int, str]]:
    """``-X importtime``'s top ``top`` modules by cumulative microseconds."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                       env=env, capture_output=True, text=True, check=True)
    rows = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cum, name = line[len("import time:"):].split("|")
        rows.append((int(cum), name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def main() -> int:
    p = _script.parser(__doc__)
    p.add_argument("--repeat", type=int, default=3, help="runs of each phase (default 3)")
    p.add_argument("--seeds", type=int, default=3, help="end-to-end runs of each kind (default 3)")
    p.add_argument("--only", default="", help="only the phases whose names contain this "
                   "(then no import times and no end-to-end runs)")
    args = p.parse_args()
    bad = _script.error(args.device, repeat=args.repeat, seeds=args.seeds)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    args.device = _script.device_kind(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    result: dict[str, object] = {"device": args.device, "python": sys.executable, "phases": {}}
    phases = {name: code for name, code in _phases(args.device).items() if args.only in name}
    runs: dict[str, list[float]] = {name: [] for name in phases}
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        for i in range(args.repeat):  # the phases interleaved: a slow minute hits them all
            for name, code in phases.items():
                e = dict(env)
                if "Triton" in name:
                    cache = Path(tmp) / ("warm" if "warm" in name else f"empty{i}{name}")
                    e["TRITON_CACHE_DIR"] = str(cache)
                    if "warm" in name and i == 0:
                        _time(code, e)  # fill it
                runs[name].append(_time(code, e))
    for name, got in runs.items():
        result["phases"][name] = {"median_s": statistics.median(got), "runs": got}
        print(f"{name:48s} {statistics.median(got):6.2f} s  "
              f"({', '.join(f'{r:.2f}' for r in got)})", flush=True)
    if args.only:
        (args.out / "cold_start.json").write_text(json.dumps(result, indent=1))
        return 0
    for module in ("streamfuzz.fuzz.cli", "streamfuzz.fuzz.rank_main"):
        rows = _heaviest(module, env)
        result[f"importtime {module}"] = rows
        print(f"\n-X importtime, import {module}: heaviest (cumulative ms)")
        for us, name in rows:
            print(f"  {us / 1000:8.1f}  {name}")
    (args.out / "cold_start.json").write_text(json.dumps(result, indent=1))
    print("\nfrom process start to the first failure (s), zygote / spawned:")
    for target in ("pre-fix", "pr-fix"):
        runs: dict[str, list[float | None]] = {"zygote": [], "spawned": []}
        for seed in range(args.seeds):
            for how in runs:
                os.environ["STREAMFUZZ_ZYGOTE"] = "1" if how == "zygote" else "0"
                r = from_process_start(args.device, 1 if args.device == "cuda" else 2,
                                       target, seed, 200, 60.0, DEFAULT, 60.0)
                runs[how].append(r["s"])
        os.environ.pop("STREAMFUZZ_ZYGOTE")
        result[f"from process start {target}"] = runs
        print(f"  {target:8s} " + " / ".join(
            f"{statistics.median([x for x in v if x is not None] or [float('nan')]):.2f} "
            f"({', '.join('-' if x is None else f'{x:.2f}' for x in v)})" for v in runs.values()),
            flush=True)
        (args.out / "cold_start.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
