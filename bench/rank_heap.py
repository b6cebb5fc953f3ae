"""Which layer of a rank holds the memory that grows per example?

``rank_memory.py`` found a CUDA rank's RSS rising about 2 MiB per 1,000
examples with every oracle set and with none, so the growth is in the path
every example takes. This runs one rank in this process (world size 1, the
served rank's own setup and runner, no driver) and prints, every
``--every`` examples: RSS; malloc's bytes in use, free inside its arenas, and
mmapped; Python's object count (and traced bytes with ``--tracemalloc``); and
RSS after ``malloc_trim``. Growth in use is a native leak; growth free is heap
fragmentation (trim gives it back); growth in neither is memory malloc never saw.

    PYTHONPATH=. python bench/rank_heap.py --device cuda --examples 3000
    PYTHONPATH=. python bench/rank_heap.py --device cuda --pageable   # no pinned staging

Run it once per variant (environment variables such as a process-group
setting take effect at process start).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import time
import tracemalloc
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--target", default="main-gather")
    ap.add_argument("--examples", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--oracles", nargs="*", default=["value"])
    ap.add_argument("--hold", default="spin", choices=("spin", "gate"))
    ap.add_argument("--pageable", action="store_true",
                    help="stage batch tensors from pageable, not pinned, host memory")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--primitives", type=int, default=0, metavar="N",
                    help="instead: N iterations of each CUDA primitive an example uses")
    args = ap.parse_args()
    from streamfuzz.fuzz.host import free_port, rss_bytes

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)

    import torch

    from streamfuzz.fuzz import draft as draft_protocol
    from streamfuzz.fuzz import rank_main, targets
    from streamfuzz.fuzz.bench import random_scenario
    from streamfuzz.fuzz.options import RunOptions

    if args.pageable:  # the runner's own staging path, minus the pinning
        torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]

    device, group, info = rank_main._setup(args.device)
    if args.primitives:
        _primitives(device, group, args.primitives)
        return
    factory = targets.load(args.target)
    rng = random.Random(5)
    batch = [random_scenario(rng, 1) for _ in range(args.warmup + args.examples)]
    options = RunOptions(oracles=args.oracles, hold=args.hold)
    libc = _libc()
    if args.tracemalloc:
        tracemalloc.start(10)
    rows: list[dict[str, Any]] = []
    first_snapshot = None
    errors = 0
    t0 = time.perf_counter()
    for i, scn in enumerate(batch, 1):
        try:
            draft_protocol.run_on_rank(scn, factory, rank_main._env(device, group), options)
        except Exception:  # a finding is not what this measures; count it
            errors += 1
        done = i - args.warmup
        if done < 0 or done % args.every:
            continue
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        gc.collect()
        row: dict[str, Any] = {"examples": done, "rss_mib": rss_bytes() / 2**20,
                               "py_objects": len(gc.get_objects())}
        if libc is not None:
            m = libc.mallinfo2()
            row.update(in_use_mib=m.uordblks / 2**20, free_mib=m.fordblks / 2**20,
                       mmapped_mib=m.hblkhd / 2**20)
        if args.tracemalloc:
            row["traced_mib"] = tracemalloc.get_traced_memory()[0] / 2**20
            snap = tracemalloc.take_snapshot()
            if first_snapshot is None:
                first_snapshot = snap
        if libc is not None:
            libc.malloc_trim(0)
            row["rss_trimmed_mib"] = rss_bytes() / 2**20
        rows.append({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
        print(json.dumps(rows[-1]), flush=True)
    elapsed = time.perf_counter() - t0
    span = rows[-1]["examples"] - rows[0]["examples"] if len(rows) > 1 else 0
    per_k = {}
    if span:
        for key in rows[0]:
            if key != "examples":
                per_k[key] = round((rows[-1][key] - rows[0][key]) * 1000 / span, 3)
    top = []
    if args.tracemalloc and first_snapshot is not None and len(rows) > 1:
        diff = tracemalloc.take_snapshot().compare_to(first_snapshot, "lineno")
        top = [str(d) for d in diff[:8]]
    print(json.dumps({"label": args.label, "device": args.device, "target": args.target,
                      "torch": torch.__version__, "options": options.to_dict(),
                      "pageable": args.pageable,
                      "examples": args.examples, "errors": errors,
                      "examples_per_s": round(len(batch) / elapsed, 1),
                      "growth_per_1000_examples": per_k, "tracemalloc_top": top,
                      "env": {k: v for k, v in os.environ.items()
                              if k.startswith(("TORCH_", "NCCL_", "MALLOC_"))}}), flush=True)
    torch.distributed.destroy_process_group()


def _primitives(device: Any, group: Any, n: int) -> None:
    """Malloc's bytes in use per 1,000 calls of each primitive, in isolation."""
    import torch
    import torch.distributed as dist

    libc = _libc()
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    t = torch.zeros(64, dtype=torch.int64, device=device)

    def bcast() -> None:
        dist.broadcast(t, src=0, group=group)

    def bcast_world() -> None:
        dist.broadcast(t, src=0)

    def bcast_async() -> None:
        dist.broadcast(t, src=0, group=group, async_op=True).wait()

    def bcast_side() -> None:
        with torch.cuda.stream(side):
            side.wait_stream(main)
            dist.broadcast(t, src=0, group=group)

    def new_stream() -> None:
        torch.cuda.Stream(device).wait_stream(main)

    def event() -> None:
        e = torch.cuda.Event()
        e.record(side)
        e.wait(main)

    def record_stream() -> None:
        x = torch.empty(64, dtype=torch.int64, device=device)
        with torch.cuda.stream(side):
            x.add_(1)
        x.record_stream(side)

    def pinned_copy() -> None:
        torch.tensor([1, 2, 3, 4]).pin_memory().to(device, non_blocking=True)

    def sleep() -> None:
        torch.cuda._sleep(100)

    def index_put() -> None:
        idx = torch.arange(4, device=device)
        t[idx] = idx

    for fn in (bcast, bcast_world, bcast_async, bcast_side, new_stream, event, record_stream,
               pinned_copy, sleep, index_put):
        for _ in range(200):
            fn()
        torch.cuda.synchronize(device)
        gc.collect()
        before = libc.mallinfo2().uordblks
        for i in range(n):
            fn()
            if i % 100 == 99:
                torch.cuda.synchronize(device)
        torch.cuda.synchronize(device)
        gc.collect()
        grew = (libc.mallinfo2().uordblks - before) / 2**10 * 1000 / n
        print(json.dumps({"primitive": fn.__name__, "calls": n,
                          "in_use_kib_per_1000": round(grew, 2)}), flush=True)


if __name__ == "__main__":
    main()
