"""A CUDA rank's start after ``import torch``, piece by piece, each run in a fresh
interpreter: the CUDA context, the default NCCL group bound to the device, the
target's own group, the first broadcast. Then the same under NCCL settings that
skip work a one-host rank does not need, and a CUDA context started beside
``import torch`` (a thread calling the driver while the import runs), then NCCL's
start beside it too, as an early rank makes them (``streamfuzz.fuzz.zygote.early``), against
both started after it. Writes NCCL's debug log of a start without and with them
beside the import. Needs a GPU; for the cold-start goal of ``bench/README.md``.

    PYTHONPATH=. python bench/start_pieces.py --repeat 3 --out reports/start-pieces
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import _script  # bench/_script.py, beside this script

_PIECES = r"""
import json, os, sys, time
t = {"process": time.time()}
took = {}
if EARLY:  # as an early rank makes it (streamfuzz.fuzz.zygote.early)
    import threading
    from streamfuzz.fuzz.zygote.early import _make_context, _start_nccl
    imported = threading.Event()
    def _beside():
        took["context"] = _make_context(0)
        if EARLY == "nccl":
            took["nccl"] = _start_nccl(0, imported)
    early = threading.Thread(target=_beside)
    early.start()
import torch, torch.distributed as dist
t["import torch"] = time.time()
if EARLY:
    imported.set()
    early.join()
    t["early context joined"] = time.time()
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
torch.zeros(1, device=dev)
t["cuda context"] = time.time()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000),
                  RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl", device_id=dev)
t["default group (bound)"] = time.time()
g = dist.new_group(backend="nccl")
t["own group"] = time.time()
x = torch.zeros(1, device=dev)
dist.broadcast(x, 0, group=g)
torch.cuda.synchronize(dev)
t["first broadcast"] = time.time()
dist.destroy_process_group()
print("BESIDE " + json.dumps(took))
print("PIECES " + json.dumps(t))
"""

_KNOBS: dict[str, dict[str, str]] = {
    "as set": {},
    "NCCL_IB_DISABLE=1": {"NCCL_IB_DISABLE": "1"},
    "NCCL_NET_PLUGIN=none": {"NCCL_NET_PLUGIN": "none"},
    "NCCL_MNNVL_ENABLE=0": {"NCCL_MNNVL_ENABLE": "0"},
    "NCCL_CUMEM_ENABLE=0": {"NCCL_CUMEM_ENABLE": "0"},
    "all four": {"NCCL_IB_DISABLE": "1", "NCCL_NET_PLUGIN": "none",
                 "NCCL_MNNVL_ENABLE": "0", "NCCL_CUMEM_ENABLE": "0"},
}


def _run(env: dict[str, str], early: bool | str) -> dict[str, float]:
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", _PIECES.replace("EARLY", repr(early))], env=env,
                       capture_output=True, text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("PIECES ")), None)
    if line is None:
        raise RuntimeError(f"probe failed ({r.returncode}): {r.stderr[-800:]}")
    stamps = json.loads(line[len("PIECES "):])
    out = {"interpreter": stamps.pop("process") - t0}
    prev = t0 + out["interpreter"]
    for name, at in stamps.items():
        out[name] = at - prev
        prev = at
    out["total"] = prev - t0
    beside = next((x for x in r.stdout.splitlines() if x.startswith("BESIDE ")), None)
    for name, took in json.loads(beside[len("BESIDE "):]).items() if beside else ():
        if took is not None:
            out[f"beside: {name}"] = took
    return out


def main() -> int:
    p = _script.parser(__doc__)
    p.add_argument("--repeat", type=int, default=3, help="runs of each row (default 3)")
    args = p.parse_args()
    bad = _script.error("cuda", repeat=args.repeat)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.repeat):  # rows interleaved: a slow minute hits them all
        for name, knobs in _KNOBS.items():
            rows.setdefault(name, []).append(_run(dict(os.environ, **knobs), early=False))
        rows.setdefault("context beside import torch", []).append(
            _run(dict(os.environ), early=True))
        rows.setdefault("context and NCCL's start beside import torch", []).append(
            _run(dict(os.environ), early="nccl"))
    result = {}
    for name, runs in rows.items():
        keys = dict.fromkeys(k for r in runs for k in r)
        med = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
        result[name] = {"median_s": med, "runs": runs}
        print(f"{name:30s} " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()), flush=True)
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="ALL",
               NCCL_DEBUG_TIMESTAMP_FORMAT="[%F %T.%6f] ")
    for name, early in (("nccl-debug.log", False), ("nccl-debug-beside.log", "nccl")):
        r = subprocess.run([sys.executable, "-c", _PIECES.replace("EARLY", repr(early))],
                           env=env, capture_output=True, text=True, timeout=120)
        (args.out / name).write_text(r.stdout + r.stderr)
        for line in (r.stdout + r.stderr).splitlines():  # NCCL's own split of each init
            if "Init timings" in line or "Init COMPLETE" in line:
                print(f"{name}: {line}", flush=True)
    (args.out / "start_pieces.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
