"""What does a soak's driver keep from round to round?

Runs ``python -m streamfuzz soak ARGS`` in this process and, at the end of
every round (after a full collection, so only what is kept is counted),
writes one line to ``rounds.jsonl``: Python's live blocks and objects,
malloc's bytes in use and free inside its arenas (``mallinfo2``), and RSS.
At the first round end past each ``--at`` second it also saves the live
objects' counts by type and, with ``--trace``, a ``tracemalloc`` snapshot. At
the end it prints what grew between the first and the last of those: the
allocations by traceback and the types. The ranks are other processes.

    nice -n 10 python bench/soak_heap.py --out heap --at 120 570 -- \\
        soak --device cpu --budget 10m --worlds 1 --out heap/soak --corpus heap/corpus

A growing Python count is something kept per round or per example; growth
in malloc's free bytes with Python flat is fragmentation. ``--trace`` slows
the driver several times over: compare what grows, not the rates.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo() -> dict[str, int]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
    except (OSError, AttributeError):
        return {}
    m = libc.mallinfo2()
    return {"in_use": m.uordblks, "free": m.fordblks, "mmapped": m.hblkhd}


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


class _Watch:
    def __init__(self, out: Path, at: list[float], trace: bool) -> None:
        self.out, self.at, self.trace = out, sorted(at), trace
        self.t0 = time.monotonic()
        self.taken = 0
        self.log = open(out / "rounds.jsonl", "a", buffering=1)

    def round_ended(self, soak: Any) -> None:
        gc.collect()
        objects = gc.get_objects()
        t = time.monotonic() - self.t0
        row = {"t": round(t, 1), "rounds": soak.state["rounds"],
               "examples": soak.state["examples"], "blocks": sys.getallocatedblocks(),
               "objects": len(objects), "rss": _rss(), **_mallinfo()}
        if self.trace:
            row["traced"] = tracemalloc.get_traced_memory()[0]
        self.log.write(json.dumps(row) + "\n")
        if self.taken < len(self.at) and t >= self.at[self.taken]:
            counts = Counter(type(o).__qualname__ for o in objects)
            (self.out / f"types-{self.taken}.json").write_text(
                json.dumps(dict(counts.most_common(1000))))
            if self.trace:
                tracemalloc.take_snapshot().dump(str(self.out / f"snap-{self.taken}.tracemalloc"))
            print(f"soak_heap: counted at {t:.0f}s, round {row['rounds']}: "
                  f"{row['objects']} objects, {row['blocks']} blocks",
                  file=sys.stderr, flush=True)
            self.taken += 1
        del objects


def compare(out: Path, top: int = 25) -> str:
    """What grew between the first and the last count (and snapshot) in ``out``."""
    types = sorted(out.glob("types-*.json"))
    if len(types) < 2:
        return "soak_heap: fewer than two counts taken"
    lines = []
    snaps = sorted(out.glob("snap-*.tracemalloc"))
    if len(snaps) >= 2:
        first = tracemalloc.Snapshot.load(str(snaps[0]))
        last = tracemalloc.Snapshot.load(str(snaps[-1]))
        lines.append(f"## allocations grown, {snaps[0].name} -> {snaps[-1].name}")
        for stat in last.compare_to(first, "traceback")[:top]:
            lines.append(f"{stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks "
                         f"(now {stat.size / 1024:.1f} KiB)")
            lines.extend("    " + line for line in stat.traceback.format(
                limit=10, most_recent_first=True))
    t0, t1 = (json.loads(p.read_text()) for p in (types[0], types[-1]))
    grown = sorted(((t1.get(k, 0) - t0.get(k, 0), k) for k in set(t0) | set(t1)), reverse=True)
    lines.append(f"## live objects by type, {types[0].name} -> {types[-1].name}")
    lines.extend(f"{d:+d} {k} (now {t1.get(k, 0)})" for d, k in grown[:top] if d > 0)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--at", type=float, nargs="+", default=[120.0, 570.0],
                    help="count at the first round end past each of these seconds")
    ap.add_argument("--trace", action="store_true", help="tracemalloc snapshots too")
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--compare", action="store_true", help="only compare what --out holds")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args()
    if ns.compare:
        print(compare(ns.out))
        return 0
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if not args or args[0] != "soak" or any(t < 0 for t in ns.at) or ns.frames < 1:
        print("soak_heap: give the soak command after -- (soak ...), --at times of 0 or more",
              file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    from streamfuzz.fuzz import zygote
    from streamfuzz.fuzz.soak import campaign

    watch = _Watch(ns.out, ns.at, ns.trace)
    real_round = campaign.Soak._round

    def round_then_count(self: Any, *a: Any, **k: Any) -> None:
        try:
            real_round(self, *a, **k)
        finally:
            watch.round_ended(self)

    campaign.Soak._round = round_then_count  # type: ignore[method-assign]
    sys.argv = ["streamfuzz", *args]
    zygote.prestart(args)  # its own process: untraced either way
    if ns.trace:
        tracemalloc.start(ns.frames)
    from streamfuzz.fuzz.cli import main as cli_main

    code = cli_main()
    print(compare(ns.out))
    return code


if __name__ == "__main__":
    sys.exit(main())
