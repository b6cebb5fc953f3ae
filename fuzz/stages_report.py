"""The benchmark's stage breakdown as a markdown table and a stacked bar chart.

Input: ``streamfuzz.fuzz.bench.breakdown`` results (milliseconds per example, per stage,
for the driver and each rank). Every process's bar is as tall as the wall
time per example: what a process does not spend in its other stages it
spends waiting (the driver for the ranks, a rank for the driver).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamfuzz.fuzz import corpus, stages

STAGES = (stages.HYPOTHESIS, stages.DRIVER, stages.MESSAGES, stages.VALUE, stages.RUNNER,
          stages.SIMULATION, stages.COLLECTIVES, stages.LIFETIME, stages.REUSE,
          stages.HOST_WAIT, stages.WAITING, stages.IDLE)
"""Host stages in the order they stack (waiting last)."""

_COLOURS = {stages.HYPOTHESIS: "#4e79a7", stages.DRIVER: "#a0cbe8", stages.MESSAGES: "#f28e2b",
            stages.VALUE: "#ffbe7d", stages.RUNNER: "#59a14f", stages.SIMULATION: "#8cd17d",
            stages.COLLECTIVES: "#b6992d", stages.LIFETIME: "#e15759", stages.REUSE: "#ff9d9a",
            stages.HOST_WAIT: "#79706e", stages.WAITING: "#d7d7d7", stages.IDLE: "#eeeeee"}


def rows(breakdowns: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, float]]]:
    """(target, process, ms per example by stage) for each process of each breakdown."""
    out = []
    for b in breakdowns:
        out.append((b["target"], "driver", b["driver"]))
        out += [(b["target"], f"rank {r}", ms) for r, ms in enumerate(b["ranks"])]
    return out


def table(breakdowns: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: one row per process, ms per example by stage."""
    used = [s for s in STAGES + (stages.GPU,)
            if any(ms.get(s, 0) >= 0.005 for _, _, ms in rows(breakdowns))]
    lines = ["| target | process | wall ms/ex | " + " | ".join(used) + " |",
             "|---|---|---|" + "---|" * len(used)]
    wall = {b["target"]: b["wall_ms"] for b in breakdowns}
    for target, process, ms in rows(breakdowns):
        cells = [f"{ms[s]:.2f}" if ms.get(s, 0) >= 0.005 else "-" for s in used]
        lines.append(f"| {target} | {process} | {wall[target]:.2f} | " + " | ".join(cells) + " |")
    return lines


def cpu_table(breakdowns: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: CPU ms per example of each process, total and by thread
    name (the busiest first); empty when no breakdown measured it."""
    lines = []
    for b in breakdowns:
        for i, threads in enumerate(b.get("cpu_threads") or []):
            process = "driver" if i == 0 else f"rank {i - 1}"
            busy = sorted(((v, k) for k, v in threads.items() if v >= 0.005), reverse=True)
            detail = ", ".join(f"{k} {v:.2f}" for v, k in busy) or "-"
            lines.append(f"| {b['target']} | {process} | {sum(threads.values()):.2f} | {detail} |")
    if not lines:
        return []
    return ["| target | process | CPU ms/ex | by thread |", "|---|---|---|---|"] + lines


def plot(path: Path, breakdowns: list[dict[str, Any]], title: str) -> bool:
    """The stacked bars as a PNG at ``path``; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bars = rows(breakdowns)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(bars) + 2.5), 4.4))
    labels = [f"{t.replace(' (', chr(10) + '(')}\n{p}" for t, p, _ in bars]
    bottom = [0.0] * len(bars)
    for stage in STAGES:
        heights = [ms.get(stage, 0.0) for _, _, ms in bars]
        if any(heights):
            ax.bar(labels, heights, bottom=bottom, label=stage, color=_COLOURS[stage],
                   edgecolor="white", linewidth=0.4)
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("ms per example")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelsize=6)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    try:
        corpus.write_atomic(path, lambda fh: fig.savefig(fh, dpi=80, format="png"))
    finally:
        plt.close(fig)
    return True
