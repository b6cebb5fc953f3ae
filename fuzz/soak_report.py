"""A soak campaign's report: JSON for machines, markdown for people, a PNG plot.

Memory and throughput are judged by comparing the first and last quarter of
the samples (medians, so one slow round or one world restart does not decide
it), and memory also by its slope within one world of ranks, projected over a
night. A rank's RSS slope is projected no higher than the campaign's recycling
limit, and growth within that limit is no leak: recycled ranks cannot outgrow
it, and the quarters still catch a world that starts bigger than the last.
Every file is written to a temporary name and renamed, so a reader never sees
half a report.
"""

from __future__ import annotations

import re
import statistics
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.corpus import write_atomic, write_json_atomic, write_text_atomic

_MIB = 2**20
GROWTH_LIMIT = 0.10
"""Relative growth of the last quarter's median over the first's, above which
memory is reported as growing."""

PROJECTION_H = 8.0
"""A steady slope is projected this far: growth that would pass GROWTH_LIMIT
within a night is reported as growing, even when a short run shows little
(docs/soak.md has the CUDA rank that made this necessary)."""

RISING_H = 168.0
"""A campaign is left running for a week: a series whose fitted slope would
pass GROWTH_LIMIT within a week, and that rose by RISING_MIN over the run,
is reported as rising, not flat, even where it rose too unsteadily to be
projected over PROJECTION_H (docs/soak.md: an hour's driver once read
"flat" on that ground)."""

RISING_MIN = 0.02
"""Growth from the second quarter to the last below which a series is flat
whatever its slope: a heap sawing within its band fits slopes of either sign."""

PROJECTION_MIN_S = 300.0
"""Memory sampled over less campaign time than this is not judged at all: a
short run's slope is its warm-up, and eight hours of it is noise, not a
finding; its quarters are warm-up too (a 75-second soak's driver rose 14%
before its first heap release, a minute in)."""


def _quarters(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if len(vals) < 4:
        return (vals[0], vals[-1]) if vals else (None, None)
    q = max(1, len(vals) // 4)
    return statistics.median(vals[:q]), statistics.median(vals[-q:])


def _stretch(ts: list[float], values: list[float | None],
             worlds: list[Any]) -> list[tuple[float, float]]:
    """The longest stretch of one world (a restarted or recycled rank starts
    small), its first quarter (warm-up) left out."""
    best: list[tuple[float, float]] = []
    run: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(zip(ts, values)):
        if i and worlds[i] != worlds[i - 1]:
            best, run = max(best, run, key=len), []
        if v is not None:
            run.append((t, v))
    pts = max(best, run, key=len)
    return pts[len(pts) // 4:]


def _slope_per_h(pts: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``pts``, in units per hour."""
    if len(pts) < 6 or pts[-1][0] - pts[0][0] <= 0:
        return None
    mt = statistics.fmean(t for t, _ in pts)
    mv = statistics.fmean(v for _, v in pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (v - mv) for t, v in pts) / var * 3600 if var else None


def _keeps_rising(pts: list[tuple[float, float]]) -> bool:
    """Each quarter of ``pts`` has a higher median than the one before, and the
    last quarter's is above the band the first quarter moves in: a leak does;
    a level that wanders or saws within its band (a heap trimmed each round)
    does not, however its fitted slope comes out."""
    q = len(pts) // 4
    if q < 2:
        return True
    quarters = [[v for _, v in pts[i * q:(i + 1) * q]] for i in range(4)]
    meds = [statistics.median(x) for x in quarters]
    band = max(quarters[0]) - min(quarters[0])
    return all(b > a for a, b in zip(meds, meds[1:])) and meds[3] - meds[0] > band


def _after_warm_up(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Medians of the second and the last quarter: the first is warm-up. A
    driver's heap steps up in its first minutes (at its first weight-sync
    round), later the more worlds share the node; from the first quarter,
    that step read as growth."""
    vals = [v for v in values if v is not None]
    if len(vals) < 8:
        return _quarters(vals)
    q = len(vals) // 4
    return statistics.median(vals[q:2 * q]), statistics.median(vals[-q:])


def _trend(values: list[float | None], ts: list[float], worlds: list[Any],
           cap: float | None = None) -> dict[str, Any]:
    """``cap``: bytes a world may grow before it is recycled (None: unbounded)."""
    start, end = _after_warm_up(values)
    vals = [v for v in values if v is not None]
    growth = (end - start) / start if start and end is not None else None
    pts = _stretch(ts, values, worlds)
    slope = _slope_per_h(pts)
    rise = slope * PROJECTION_H if slope is not None and (
        slope <= 0 or _keeps_rising(pts)) else None
    if len(ts) < 2 or ts[-1] - ts[0] < PROJECTION_MIN_S:
        rise = None  # too short to project: judged on the quarters alone, cap or not
    # Recycling lets a rank grow by the cap, however small the rank: growth
    # within it is the bound doing its job, not a leak (32 MiB is 3% of a CUDA
    # rank but 17% of a CPU one). Only worlds that each start bigger than the
    # last pass it, and the quarters catch those.
    limit = max(GROWTH_LIMIT, cap / start) if cap is not None and start else GROWTH_LIMIT
    bounded = rise is not None and cap is not None and start is not None and start > 0 and (
        rise > cap or rise / start > GROWTH_LIMIT)
    if rise is not None and cap is not None:
        rise = min(rise, cap)
    projected = rise / start if rise is not None and start else None
    # A recycled series is bounded by its cap, however long the campaign.
    week = slope * RISING_H / start if slope is not None and start and cap is None else None
    return {"start": start, "end": end, "max": max(vals) if vals else None,
            "growth": round(growth, 4) if growth is not None else None,
            "slope_per_h": round(slope, 1) if slope is not None else None,
            "projected_growth": round(projected, 4) if projected is not None else None,
            "week_growth": round(week, 4) if week is not None else None,
            "bounded_by_recycling": bounded, "limit": round(limit, 4)}


def _series(samples: list[dict[str, Any]]) -> dict[str, list]:
    ranks = max((len(s.get("ranks") or []) for s in samples), default=0)
    out: dict[str, list] = {"t": [s["t"] for s in samples],
                            "rate": [s.get("rate") for s in samples],
                            "driver_rss": [s.get("driver_rss") for s in samples]}
    for key in ("rss", "gpu_alloc", "gpu_reserved"):
        for r in range(ranks):
            col = []
            for s in samples:
                m = (s.get("ranks") or [None] * ranks)[r] if r < len(s.get("ranks") or []) else None
                col.append(m.get(key) if m else None)
            if any(v is not None for v in col):
                out[f"rank{r}_{key}"] = col
    return out


def summarize(state: dict[str, Any], samples: list[dict[str, Any]], *,
              config: dict[str, Any], stop_reason: str | None) -> dict[str, Any]:
    """The JSON report (also the input of the markdown and the plot)."""
    fails = [f for f in state["failures"]]
    repeats = state.get("repeats", {})
    kinds: dict[str, int] = {}
    for kind in [f["kind"] for f in fails]:
        kinds[kind] = kinds.get(kind, 0) + 1
    for r in repeats.values():
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + r["occurrences"]
    distinct: dict[str, dict[str, Any]] = {}
    for f in fails:
        d = distinct.setdefault(f["path"], {"path": f["path"], "target": f["target"],
                                            "kind": f["kind"], "message": f["message"],
                                            "occurrences": 0, "flaky_occurrences": 0})
        d["occurrences"] += 1
        d["flaky_occurrences"] += int(bool(f["flaky"]))
    for path, r in repeats.items():  # kept records come first: the message is there
        d = distinct.setdefault(path, {"path": path, "target": r["target"], "kind": r["kind"],
                                       "message": "", "occurrences": 0,
                                       "flaky_occurrences": 0})
        d["occurrences"] += r["occurrences"]
        d["flaky_occurrences"] += r["flaky_occurrences"]
    elapsed = float(state["elapsed_s"])
    # Throughput: skip the sample that covers rank start-up.
    rates = [s["rate"] for s in samples[2:] if s.get("rate") is not None] or \
        [s["rate"] for s in samples if s.get("rate") is not None]
    by_target: dict[str, list[float]] = {}
    for s in samples[2:]:
        if s.get("target") and s.get("rate") is not None:
            by_target.setdefault(s["target"], []).append(s["rate"])
    per_target = {k: dict(zip(("start", "end"), _quarters(v))) for k, v in by_target.items()}
    series = _series(samples)
    # Samples written before worlds had ids still change at every restart.
    worlds = [(x.get("restarts") or 0, x.get("world")) for x in samples]
    # The driver is one process from its start to its end, whatever its ranks
    # do: a world id is "start.generation of the ranks".
    drivers = [str(x.get("world") or "").partition(".")[0] for x in samples]
    cap = (config.get("recycle_mib") or 0) * _MIB or None
    memory = {k: _trend(v, series["t"], drivers if k == "driver_rss" else worlds,
                        cap if re.fullmatch(r"rank\d+_rss", k) else None)
              for k, v in series.items() if k not in ("t", "rate")}
    judged = bool(samples) and samples[-1]["t"] - samples[0]["t"] >= PROJECTION_MIN_S
    growing = sorted(k for k, v in memory.items()
                     if judged and k.endswith(("rss", "gpu_reserved"))
                     and max(v["growth"] or 0.0, v["projected_growth"] or 0.0) > v["limit"])
    rising = sorted(k for k, v in memory.items()
                    if judged and k.endswith(("rss", "gpu_reserved")) and k not in growing
                    and (v["growth"] or 0.0) > RISING_MIN
                    and (v["week_growth"] or 0.0) > v["limit"])
    behaviours = state.get("behaviours", {})
    return {
        "config": config, "stop_reason": stop_reason, "starts": state["starts"],
        "elapsed_s": round(elapsed, 3), "examples": state["examples"],
        "rounds": state["rounds"],
        "examples_per_s": round(state["examples"] / elapsed, 3) if elapsed else 0.0,
        "throughput": {k: (round(v, 3) if v is not None else None)
                       for k, v in zip(("start", "end"), _quarters(rates))}
        | {"by_target": per_target},
        "rank_restarts": state["restarts"],
        "rank_recycles": state.get("recycles", 0),
        "held_by": dict(sorted(state.get("held", {}).items())),
        "failures_by_kind": kinds,
        "flaky": sum(d["flaky_occurrences"] for d in distinct.values()),
        "distinct_failures": list(distinct.values()),
        "failures": fails,
        "failures_not_listed": sum(r["occurrences"] for r in repeats.values()),
        "behaviours": {"distinct": len(behaviours),
                       "counts": dict(sorted(behaviours.items(), key=lambda kv: -kv[1]))},
        **coverage(config.get("targets") or [], state.get("targets", {})),
        "memory": memory, "memory_growing": growing, "memory_rising": rising,
        "projected": judged, "memory_judged": judged,
        "samples": len(samples),
    }


def coverage(asked: list[str], ran: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every target asked for, with its examples: one with none is listed as
    never ran, so that a campaign's ``failures: 0`` never covers it unsaid."""
    zero = {"examples": 0, "rounds": 0, "elapsed_s": 0.0, "failures": 0}
    targets = {name: dict(zero, **ran.get(name, {})) for name in asked}
    targets.update((k, v) for k, v in ran.items() if k not in targets)
    never = [name for name, t in targets.items() if not t["examples"]]
    return {"targets": targets, "targets_ran": len(targets) - len(never), "never_ran": never}


def ran_text(rep: dict[str, Any]) -> str:
    """``2 of 3 targets ran (never ran: c)``, from a report (a merged one too)."""
    cov = coverage(rep["config"].get("targets") or [], rep.get("targets", {}))
    never = cov["never_ran"]
    return (f"{cov['targets_ran']} of {len(cov['targets'])} targets ran"
            + (f" (never ran: {', '.join(never)})" if never else ""))


def per_target_text(rep: dict[str, Any]) -> str:
    """``examples per target: a 120, b 0 (never ran)``, from a report."""
    return "examples per target: " + ", ".join(
        f"{name} {t['examples'] or '0 (never ran)'}" for name, t in rep["targets"].items())


def memory_text(rep: dict[str, Any]) -> str:
    """The memory verdict in words, from a report (a merged one too)."""
    if not rep.get("projected", True):
        return (f"not judged: under {PROJECTION_MIN_S / 60:.0f} min of samples, too short "
                "to tell a leak from warm-up (the table shows what was measured)")
    rising = rep.get("memory_rising") or []
    if not rep["memory_growing"] and not rising:
        return "flat"
    parts = ["GROWING: " + ", ".join(rep["memory_growing"])] if rep["memory_growing"] else []
    if rising:
        parts.append("rising: " + ", ".join(_rising_text(k, rep["memory"][k]) for k in rising)
                     + " (not steadily enough to project, too much to call flat)")
    return "; ".join(parts)


def _rising_text(key: str, v: dict[str, Any]) -> str:
    week = v["slope_per_h"] * RISING_H / _MIB
    return (f"{key} {v['growth'] * 100:+.1f}% from the second quarter to the last, fitted "
            f"{v['slope_per_h'] / _MIB:+.1f} MiB/h, {week / 1024:+.1f} GiB in a week at that rate")


def _bounded(rep: dict[str, Any]) -> str:
    capped = [k for k, v in rep["memory"].items() if v.get("bounded_by_recycling")]
    if not capped:
        return ""
    return (f" ({', '.join(capped)} would grow, and are bounded by recycling the ranks at "
            f"+{rep['config']['recycle_mib']:g} MiB: {rep['rank_recycles']} recycles)")


def markdown(rep: dict[str, Any]) -> str:
    c = rep["config"]
    tp = rep["throughput"]
    cov = coverage(c.get("targets") or [], rep["targets"])
    lines = [
        "# streamfuzz soak report", "",
        f"- targets: {', '.join(c['targets'])}",
        f"- device: {c['device']} x{c['world_size']} ({c.get('device_name') or '?'}, "
        f"torch {c.get('torch') or '?'}){' external ranks' if c.get('external_ranks') else ''}",
        f"- budget {c['budget_s']:.0f}s, ran {rep['elapsed_s']:.0f}s over {rep['starts']} "
        f"start(s); stopped: {rep['stop_reason']}",
        f"- examples: {rep['examples']} in {rep['rounds']} rounds, "
        f"{rep['examples_per_s']:.1f}/s overall; first quarter {tp['start']}/s, "
        f"last quarter {tp['end']}/s",
        f"- rank restarts: {rep['rank_restarts']}; recycles: {rep['rank_recycles']}"
        + (f" (at +{c['recycle_mib']:g} MiB)" if c.get("recycle_mib") else " (off)"),
        "- streams held by (examples): "
        + (", ".join(f"{k} {v}" for k, v in rep["held_by"].items()) or "nothing")
        + (f" (gates: {c['gates']})" if c.get("gates") else ""),
        f"- distinct behaviours seen: {rep['behaviours']['distinct']}",
        f"- {ran_text(rep)}"
        + (": a target that never ran is unchecked, not clean" if cov["never_ran"] else ""),
        f"- failures: {sum(rep['failures_by_kind'].values())} "
        f"({', '.join(f'{k} {v}' for k, v in rep['failures_by_kind'].items()) or 'none'}), "
        f"{len(rep['distinct_failures'])} distinct, {rep['flaky']} flaky",
        "- memory: " + memory_text(rep) + _bounded(rep),
        "", "## Failures", "",
    ]
    if rep["distinct_failures"]:
        lines += ["| target | kind | seen | flaky | corpus file | message |",
                  "|---|---|---|---|---|---|"]
        for d in rep["distinct_failures"]:
            msg = d["message"].replace("|", "\\|").replace("\n", " ")[:120]
            lines.append(f"| {d['target']} | {d['kind']} | {d['occurrences']} | "
                         f"{d['flaky_occurrences']} | {d['path']} | {msg} |")
    else:
        lines.append("none")
    lines += ["", "## Memory (MiB; start and end are medians of the second and last "
              "quarter, the first being warm-up; the slope is fitted after warm-up, within "
              "one world of ranks; "
              "* marks a series that would grow and is bounded by recycling: its "
              "projection at most the recycling limit)", "",
              f"| series | start | end | max | growth | slope MiB/h | in {PROJECTION_H:.0f} h |",
              "|---|---|---|---|---|---|---|"]
    for k, v in rep["memory"].items():
        if v["start"] is None:
            continue
        growth = f"{v['growth'] * 100:+.1f}%" if v["growth"] is not None else "-"
        slope = v.get("slope_per_h")
        proj = v.get("projected_growth")
        lines.append(f"| {k} | {v['start'] / _MIB:.1f} | {v['end'] / _MIB:.1f} | "
                     f"{v['max'] / _MIB:.1f} | {growth} | "
                     f"{f'{slope / _MIB:+.1f}' if slope is not None else '-'} | "
                     f"{f'{proj * 100:+.0f}%' if proj is not None else '-'}"
                     f"{'*' if v.get('bounded_by_recycling') else ''} |")
    lines += ["", "## Targets", "", "| target | rounds | examples | seconds | failures |",
              "|---|---|---|---|---|"]
    for name, t in cov["targets"].items():
        lines.append(f"| {name} | {t['rounds']} | {t['examples'] or 'never ran'} | "
                     f"{t['elapsed_s']:.0f} | {t['failures']} |")
    lines += ["", "## Behaviours (hypothesis `event()` labels)", ""]
    lines += [f"- {k}: {v}" for k, v in rep["behaviours"]["counts"].items()]
    return "\n".join(lines) + "\n"


def plot(path: Path, samples: list[dict[str, Any]], title: str) -> bool:
    """Throughput, failures and memory over time; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = figure(samples, title)
    try:
        write_atomic(path, lambda fh: fig.savefig(fh, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return True


def figure(samples: list[dict[str, Any]], title: str) -> Any:
    """The plot's matplotlib figure (the caller closes it)."""
    import matplotlib.pyplot as plt

    series = _series(samples)
    hours = max(series["t"], default=0) > 3 * 3600
    scale, unit = (3600.0, "h") if hours else (60.0, "min")
    t = [x / scale for x in series["t"]]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ax1.plot(t, series["rate"], lw=1)
    ax1.set_ylabel("examples/s")
    ax1.set_ylim(bottom=0)
    ax1.set_title(textwrap.fill(title, 90), fontsize=10)
    # Where a resumed campaign started again (its samples' world ids say which start).
    starts = [str(s.get("world") or "1.0").split(".")[0] for s in samples]
    for i in range(1, len(samples)):
        if starts[i] != starts[i - 1]:
            for ax in (ax1, ax2, ax3):
                ax.axvline(t[i], color="tab:red", ls="--", lw=0.8,
                           label="resumed" if ax is ax2 and "resumed" not in
                           ax2.get_legend_handles_labels()[1] else None)
    kinds = sorted({k for s in samples for k in (s.get("failures") or {})})
    for k in kinds:
        ax2.step(t, [(s.get("failures") or {}).get(k, 0) for s in samples], where="post", label=k)
    ax2.plot(t, [s.get("restarts", 0) for s in samples], ls=":", color="grey",
             label="rank restarts")
    if any(s.get("recycles") for s in samples):
        ax2.plot(t, [s.get("recycles", 0) for s in samples], ls="--", color="grey",
                 label="rank recycles")
    ax2.set_ylabel("cumulative")
    ax2.legend(loc="upper left", fontsize=8)
    for k, v in series.items():
        if k.endswith("rss") or k.endswith("gpu_reserved") or k.endswith("gpu_alloc"):
            ax3.plot(t, [x / _MIB if x is not None else float("nan") for x in v], lw=1,
                     label=k.replace("_", " "))
    ax3.set_ylabel("MiB")
    ax3.set_ylim(bottom=0)
    ax3.set_xlabel(f"campaign time ({unit})")
    ax3.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def write(out: Path, state: dict[str, Any], samples: list[dict[str, Any]], *,
          config: dict[str, Any], stop_reason: str | None) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` and ``report.png`` under ``out``."""
    rep = summarize(state, samples, config=config, stop_reason=stop_reason)
    title = (f"streamfuzz soak: {', '.join(config['targets'])} on {config['device']} "
             f"x{config['world_size']}")
    rep["plot"] = "report.png" if plot(out / "report.png", samples, title) else None
    write_json_atomic(out / "report.json", rep)
    write_text_atomic(out / "report.md", markdown(rep))
    return rep
