"""``stats.jsonl``: one memory and throughput sample per line, and the ranks'
growth since their world warmed up (what recycling is decided from)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.host import rss_bytes
from streamfuzz.fuzz.messages import Memory
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.soak.display import Display, hms, kinds_text
from streamfuzz.fuzz.soak.state import State

_MIB = 2**20


class Sampler:
    """Samples when due: every ``every_s`` seconds, and every ``every_examples``
    examples where given, so that what a short campaign decides from its
    samples (recycling) does not depend on its speed."""

    def __init__(self, path: Path, pool: RankPool, state: State, display: Display,
                 every_s: float, every_examples: int | None) -> None:
        self.path = path
        self._pool = pool
        self._state = state
        self._display = display
        self._every_s = every_s
        self._every_examples = every_examples
        self._last = -1e9
        self._last_examples = 0
        self._prev = (state.base_elapsed, int(state.data["examples"]))
        self._world_base: tuple[int, list[int | None] | None] = (-1, None)

    def sample(self, target: str, force: bool = False) -> list[Memory | None] | None:
        """Sample memory and throughput when due; the ranks' stats, or None."""
        state = self._state.data
        now = time.monotonic()
        every_n = self._every_examples
        due = (now - self._last >= self._every_s
               or (every_n is not None and state["examples"] - self._last_examples >= every_n))
        if not force and not due:
            return None
        self._last = now
        self._last_examples = int(state["examples"])
        t, ex = self._state.elapsed(), int(state["examples"])
        dt = t - self._prev[0]
        rate = (ex - self._prev[1]) / dt if dt > 0 else 0.0
        self._prev = (t, ex)
        ranks = self._pool.stats() if self._pool.lost is None else []
        kinds = self._state.kinds()
        sample = {"t": round(t, 3), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "target": target, "examples": ex, "rate": round(rate, 3),
                  "failures": kinds,
                  "restarts": self._state.restarts(),
                  "recycles": self._state.recycles(),
                  # Samples of one world (one set of processes) share this id.
                  "world": f"{state['starts']}.{self._pool.generation}",
                  "behaviours": len(state["behaviours"]), "driver_rss": rss_bytes(),
                  "ranks": [m.to_dict() if m else None for m in ranks]}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(sample, separators=(",", ":")) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        rss = " ".join(f"{m.rss / 2**20:.0f}" if m else "?" for m in ranks)
        self._display.log(f"{sample['time']} t={hms(t)} examples={ex} rate={rate:.1f}/s "
                          f"failures={kinds_text(kinds)} behaviours={sample['behaviours']} "
                          f"restarts={sample['restarts']} recycles={sample['recycles']} "
                          f"driver_rss={rss_bytes() / 2**20:.0f}MiB "
                          f"rank_rss_mib=[{rss}]")
        state["elapsed_s"] = round(t, 3)
        self._state.save()
        return ranks

    def rate(self) -> float:
        """Examples a second since the last sample (over the whole campaign
        within a second of it)."""
        examples = self._state.data["examples"]
        elapsed = self._state.elapsed()
        dt = elapsed - self._prev[0]
        recent = (examples - self._prev[1]) / dt if dt > 1 else None
        return recent if recent is not None else examples / max(elapsed, 1e-9)

    def grown(self, ranks: list[Memory | None], cap_mib: float) -> tuple[int, int] | None:
        """``(bytes, rank)`` of the rank grown most past ``cap_mib`` since its
        world warmed up, or None. A world's first sample may precede its
        warm-up, so its second is the base."""
        rss = [m.rss if m else None for m in ranks]
        gen, base = self._world_base
        if gen != self._pool.generation:
            self._world_base = (self._pool.generation, None)
            return None
        if base is None:
            self._world_base = (gen, rss)
            return None
        growth = [(r - b, rank) for rank, (r, b) in enumerate(zip(rss, base))
                  if r is not None and b is not None]
        if not growth or max(growth)[0] <= cap_mib * _MIB:
            return None
        return max(growth)


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Every complete line of ``stats.jsonl``; a line cut short by a kill is skipped."""
    out: list[dict[str, Any]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
