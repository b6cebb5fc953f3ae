"""Correct stream patterns that real engines use, as draft-broadcast targets,
and how fast streamfuzz runs them: a gate must never stall correct code.

Each pattern is a correct handler in plain torch.cuda (``bench/patterns.py:NAME``
as a target), written differently from the built-in ``main-gather``: events
between three streams, a pinned staging buffer rewritten after its previous
copy's ``Event.synchronize()``, a host polling ``query()`` until done, a
``wait_stream`` chain, a blocking device-to-host read, and an async
collective whose handle is waited on another stream. The receivers are the
README's ``examples/my_handler.py``.

    PYTHONPATH=. python bench/patterns.py --device auto --examples 300 --out reports/patterns

Per pattern: fuzzer examples/s (generation only, failures counted), its
ratio to ``main-gather`` on the same machine and seeds, the examples whose
gate ran out its bound (each is a bug in streamfuzz: the program ordered
the streams itself, and the gate should have opened there), how the
streams were held, and the verdict (every pattern must be clean).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from examples.my_handler import MyHandler
from streamfuzz.fuzz.targets import Batch, TargetContext

_SENT = ("sampled_tokens", "num_sampled", "num_rejected")


class _Pattern(MyHandler):
    """The receivers of ``MyHandler``; each pattern writes its own sender."""

    def _send_all(self, send: torch.Tensor, batch: Batch, stream: Any) -> None:
        """The four broadcasts on ``stream``, each tensor recorded there."""
        with torch.cuda.stream(stream):
            for t in (*(getattr(batch, n) for n in _SENT), send):
                t.record_stream(stream)
                self._bcast(t)


class _GatherThenSend(_Pattern):
    """Two side streams of its own: one gathers, the other broadcasts."""

    def __init__(self, ctx: TargetContext) -> None:
        super().__init__(ctx)
        self.gather, self.comm = torch.cuda.Stream(), torch.cuda.Stream()


class ThreeStreams(_GatherThenSend):
    """Gather on one side stream, record an event; a second side stream and
    main both wait on it; the second broadcasts."""

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        self.gather.wait_stream(self.main)
        with torch.cuda.stream(self.gather):
            send = draft_table[batch.idx_mapping]
            gathered = torch.cuda.Event()
            gathered.record()
        self.comm.wait_event(gathered)
        self.main.wait_event(gathered)
        self.comm.wait_stream(self.main)  # the sampling tensors are main's
        send.record_stream(self.main)
        self._send_all(send, batch, self.comm)
        return send


class StagingSync(_Pattern):
    """A persistent pinned staging buffer: the host waits for the previous
    copy out of it (``Event.synchronize``) before rewriting it, then copies it
    to the device on a side stream."""

    def __init__(self, ctx: TargetContext) -> None:
        super().__init__(ctx)
        self.staging = torch.zeros(ctx.max_num_reqs, dtype=torch.int64, pin_memory=True)
        self.copied: torch.cuda.Event | None = None

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        n = batch.num_reqs
        if self.copied is not None:
            self.copied.synchronize()  # the last copy out of the buffer is done
        self.staging[:n] = torch.tensor(batch.host_idx_mapping[:n], dtype=torch.int64)
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            idx = self.staging[:n].to("cuda", non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()
            send = draft_table[idx]
        self.main.wait_stream(self.side)
        send.record_stream(self.main)
        self._send_all(send, batch, self.side)
        return send


class PollUntilDone(_Pattern):
    """After the broadcasts, the host polls the side stream's event until done."""

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        send = draft_table[batch.idx_mapping]
        self.side.wait_stream(self.main)
        self._send_all(send, batch, self.side)
        done = torch.cuda.Event()
        done.record(self.side)
        while not done.query():
            pass
        return send


class WaitChain(_GatherThenSend):
    """main -> gather -> comm -> back to main, by ``wait_stream`` alone."""

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        self.gather.wait_stream(self.main)
        with torch.cuda.stream(self.gather):
            send = draft_table[batch.idx_mapping]
        self.comm.wait_stream(self.gather)
        self._send_all(send, batch, self.comm)
        self.main.wait_stream(self.comm)
        send.record_stream(self.main)
        return send


class BlockingRead(_Pattern):
    """The gathered rows are read back to the host (a blocking copy) on the
    side stream before they are sent: the host waits for the gather."""

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            send = draft_table[batch.idx_mapping]
            self.checksum = int(send.cpu().sum())
        self.main.wait_stream(self.side)
        send.record_stream(self.main)
        self._send_all(send, batch, self.side)
        return send


class AsyncHandleElsewhere(_Pattern):
    """Async broadcasts issued on the side stream; their handles are waited on
    a third stream, which main then waits for."""

    def __init__(self, ctx: TargetContext) -> None:
        super().__init__(ctx)
        self.waiter = torch.cuda.Stream()

    def broadcast_drafts(self, draft_table: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        if not batch.samples:
            return None
        send = draft_table[batch.idx_mapping]
        self.side.wait_stream(self.main)
        works = []
        with torch.cuda.stream(self.side):
            for t in (*(getattr(batch, n) for n in _SENT), send):
                works.append(dist.broadcast(t, src=self.ctx.last_rank, group=self.ctx.group,
                                            async_op=True))
        with torch.cuda.stream(self.waiter):
            for w in works:
                w.wait()
        self.main.wait_stream(self.waiter)
        return send


PATTERNS = {"three-streams": ThreeStreams, "staging-sync": StagingSync,
            "poll-until-done": PollUntilDone, "wait-chain": WaitChain,
            "blocking-read": BlockingRead, "async-handle-elsewhere": AsyncHandleElsewhere}
"""Pattern name -> handler class (a class is a target factory)."""


def _target(name: str) -> str:
    return f"{__file__}:{PATTERNS[name].__name__}"


def main(argv: list[str] | None = None) -> int:
    from streamfuzz.fuzz import bench, driver
    from streamfuzz.fuzz.host import probe_gpus
    from streamfuzz.fuzz.options import DEFAULT
    from streamfuzz.fuzz.ranks import RankPool

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=("cpu", "cuda", "auto"),
                   help="default auto: cuda where a GPU is visible")
    p.add_argument("--examples", type=int, default=300, help="examples per seed (default 300)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per pattern (default 3)")
    p.add_argument("--out", type=Path, default=Path("reports/patterns"))
    p.add_argument("--only", nargs="+", choices=sorted(PATTERNS), metavar="PATTERN",
                   help="these patterns (besides main-gather) instead of all")
    args = p.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if probe_gpus() else "cpu"
    world = 1 if device == "cuda" else 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    names = ["main-gather", *(args.only or PATTERNS)]
    with RankPool(world, device) as pool:
        for name in names:
            target = name if name == "main-gather" else _target(name)
            rates, timeouts, failures, held = [], 0, 0, set()
            seen: list[str] = []

            def first(scenario: Any, verdict: Any, labels: Any, seen: list[str] = seen) -> None:
                if not verdict.ok and not seen:
                    f = verdict.first
                    seen.append(f"{f.kind}: {f.message}\n  scenario: {scenario.describe()}")
            for seed in range(args.seeds):
                res = driver.fuzz(pool, target, bench._settings(True),
                                  max_examples=args.examples, seed=seed, options=DEFAULT,
                                  stop_on_failure=False, on_verdict=first)
                rates.append(res.examples_per_s)
                # A tree from before the count: whether any example timed out.
                timeouts += getattr(res, "gate_timeouts", int(bool(
                    {"gate-timeout", "rerun"} & set(res.held))))
                failures += res.failures
                held.update(res.held)
            rows.append({"pattern": name, "ex_s": statistics.median(rates), "per_seed": rates,
                         "gate_timeouts": timeouts, "failures": failures,
                         "held_by": sorted(held), "first_failure": seen[0] if seen else None})
            print(f"{name}: {rows[-1]['ex_s']:.1f} ex/s, gate timeouts {timeouts}, "
                  f"failures {failures}, held by {', '.join(sorted(held)) or '-'}", flush=True)
            if seen:
                print(f"  first failure: {seen[0]}", flush=True)
            (args.out / "patterns.json").write_text(json.dumps(rows, indent=1))
    base = rows[0]["ex_s"] or 1.0
    lines = [f"# Correct patterns on {device} (world size {world}, {args.seeds} seeds of "
             f"{args.examples}), torch {torch.__version__}", "",
             "| pattern | examples/s | / main-gather | gate timeouts | failures | held by |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pattern']} | {r['ex_s']:.1f} | {r['ex_s'] / base:.2f} | "
                     f"{r['gate_timeouts']} | {r['failures']} | {', '.join(r['held_by']) or '-'} |")
    (args.out / "patterns.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    bad = [r["pattern"] for r in rows if r["failures"] or r["gate_timeouts"]]
    if bad:  # every pattern is correct: a finding or a stalled gate is streamfuzz's bug
        print(f"FAIL: {', '.join(bad)}: a finding or a gate timeout on correct code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
