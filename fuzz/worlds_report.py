"""The report of a campaign run by parallel worlds: each world's, merged.

Every world writes the report it writes alone; this merges them, so that a
reader (or a script) sees one campaign: examples and failures summed, each
target's finding once (with the world that claimed it), each world's rate
and the total, and each world's memory judged on its own (a world is one set
of processes; their sum would hide one that grows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import soak_report
from streamfuzz.fuzz.corpus import write_atomic, write_json_atomic, write_text_atomic
from streamfuzz.fuzz.coverage import Coverage


def _rate(examples: float, seconds: float) -> float:
    return round(examples / seconds, 3) if seconds else 0.0


def read(path: Path) -> dict[str, Any] | None:
    """A world's report, or None where it wrote none (it crashed, or was killed)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- fuzz run ---------------------------------------------------------------------
def merge_run(reports: list[dict[str, Any] | None], exits: list[int],
              wall_s: float, gpu_sharing: str | None = None) -> dict[str, Any]:
    """One ``fuzz run`` report out of every world's; ``gpu_sharing`` says how
    worlds on one GPU shared it (``Controller.gpu_sharing``), None off a GPU."""
    got = [(i, r) for i, r in enumerate(reports) if r is not None]
    base = dict(got[0][1]) if got else {}
    per_world: list[dict[str, Any]] = []
    for i, rc in enumerate(exits):
        r = reports[i]
        per_world.append({"world": i, "exit": rc,
                          "examples": r["examples"] if r else 0,
                          "elapsed_s": r["elapsed_s"] if r else 0.0,
                          "examples_per_s": r["examples_per_s"] if r else 0.0,
                          "rank_restarts": r["rank_restarts"] if r else 0,
                          "report": r is not None})
    errors = sorted({e for _, r in got for e in r.get("errors", ())})
    errors += [f"world {w['world']} exited {w['exit']} without a report"
               for w in per_world if not w["report"]]
    targets = _merge_targets(got, base.get("device", "cpu"))
    failures = [dict(f, world=i) for i, r in got for f in r.get("failures", ())]
    names = [t["target"] for t in targets]
    return {
        **base,
        "target": names[0] if len(names) == 1 else names,
        "worlds": len(exits),
        "gpu_sharing": gpu_sharing,
        "examples": sum(w["examples"] for w in per_world),
        "elapsed_s": round(wall_s, 3),
        "examples_per_s": round(sum(w["examples_per_s"] for w in per_world), 3),
        "per_world": per_world,
        "rank_restarts": sum(w["rank_restarts"] for w in per_world),
        "interrupted": any(r.get("interrupted") for _, r in got),
        "failures": failures, "targets": targets,
        "coverage": {t["target"]: t["coverage"] for t in targets if t["coverage"]},
        "errors": errors,
    }


def _merge_targets(got: list[tuple[int, dict[str, Any]]], device: str) -> list[dict[str, Any]]:
    by_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in got:
        for t in r.get("targets", ()):
            by_name.setdefault(t["target"], []).append((i, t))
    out = []
    for name, seen in by_name.items():
        owner = next(((i, t) for i, t in seen if t.get("failure") and not t.get("duplicate")),
                     None)
        first = owner[1] if owner else {}
        out.append({
            "target": name,
            "examples": sum(t["examples"] for _, t in seen),
            "elapsed_s": max(t["elapsed_s"] for _, t in seen),
            "examples_per_s": round(sum(t["examples_per_s"] for _, t in seen), 3),
            "failure": first.get("failure"), "corpus_path": first.get("corpus_path"),
            "found_in_world": owner[0] if owner else None,
            "found_by_worlds": sum(1 for _, t in seen if t.get("failure")),
            "first_failure_examples": first.get("first_failure_examples"),
            "first_failure_s": first.get("first_failure_s"),
            "first_failure_at": first.get("first_failure_at"),
            "held_by": sorted({h for _, t in seen for h in t.get("held_by", ())}),
            "gate_timeouts": sum(t.get("gate_timeouts", 0) for _, t in seen),
            "interrupted": any(t.get("interrupted") for _, t in seen),
            "upstream": seen[0][1].get("upstream"),
            "coverage": _merge_coverage(name, [t.get("coverage") for _, t in seen], device),
            "per_world": [{"world": i, "examples": t["examples"],
                           "examples_per_s": t["examples_per_s"]} for i, t in seen],
        })
    return out


def _merge_coverage(target: str, parts: list[dict[str, Any] | None],
                    device: str) -> dict[str, Any] | None:
    parts_ = [p for p in parts if p]
    if not parts_:
        return None
    from streamfuzz.fuzz import targets

    try:
        protocol = targets.protocol_of(target)
    except Exception:  # a target no longer importable here: keep the first world's
        return parts_[0]
    calls: dict[str, dict[int, int]] = {}
    for p in parts_:
        for name, by_rank in p["calls"].items():
            for rank, n in by_rank.items():
                if n:
                    mine = calls.setdefault(name, {})
                    mine[int(rank)] = mine.get(int(rank), 0) + n
    cov = Coverage(protocol, int(parts_[0]["world_size"]), device,
                   examples=sum(int(p["examples"]) for p in parts_), calls=calls)
    return cov.to_dict()


def run_table(merged: dict[str, Any]) -> list[str]:
    """The table a ``fuzz run`` prints, for every world together."""
    rows = [("target", "result", "examples", "ex/s", "first failure", "world", "corpus")]
    for t in merged["targets"]:
        first = (f"{t['first_failure_examples']} ex / {t['first_failure_s']:.1f}s"
                 if t["failure"] else "-")
        result = t["failure"] or ("interrupted" if t["interrupted"] else "clean")
        rows.append((t["target"], result, str(t["examples"]), f"{t['examples_per_s']:.1f}",
                     first, "-" if t["found_in_world"] is None else f"w{t['found_in_world']}",
                     str(t["corpus_path"] or "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"streamfuzz on {merged.get('device', '?')}, world size "
             f"{merged.get('world_size', '?')}, {merged['worlds']} worlds, judged by "
             f"{', '.join(merged.get('oracles') or ['?'])}:"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
              for row in rows]
    rates = ", ".join(f"w{w['world']} {w['examples_per_s']:.1f}/s" for w in merged["per_world"])
    lines.append(f"  worlds: {rates}; total {merged['examples_per_s']:.1f}/s "
                 f"({merged['examples']} examples in {merged['elapsed_s']:.1f}s)")
    return lines


# -- fuzz soak --------------------------------------------------------------------
def merge_soak(out: Path, world_dirs: list[Path], exits: list[int],
               stop_reason: str | None, gpu_sharing: str | None = None) -> dict[str, Any]:
    """Merge every world's soak report into ``out``'s report.json, .md and .png."""
    reps = [read(d / "report.json") for d in world_dirs]
    got = [(i, r) for i, r in enumerate(reps) if r is not None]
    if not got:
        raise RuntimeError("no world wrote a report")
    base = got[0][1]
    worlds: list[dict[str, Any]] = []
    for i, rc in enumerate(exits):
        r = reps[i]
        worlds.append({"world": i, "exit": rc, "out": str(world_dirs[i]),
                       "examples": r["examples"] if r else 0,
                       "elapsed_s": r["elapsed_s"] if r else 0.0,
                       "examples_per_s": r["examples_per_s"] if r else 0.0,
                       "memory_growing": r["memory_growing"] if r else None,
                       "memory_rising": r.get("memory_rising", []) if r else None,
                       "memory_judged": r.get("projected", True) if r else None,
                       "report": r is not None})
    behaviours: dict[str, int] = {}
    held: dict[str, int] = {}
    kinds: dict[str, int] = {}
    distinct: dict[str, dict[str, Any]] = {}
    tgts: dict[str, dict[str, Any]] = {}
    for _, r in got:
        for k, v in r["behaviours"]["counts"].items():
            behaviours[k] = behaviours.get(k, 0) + v
        for k, v in r["held_by"].items():
            held[k] = held.get(k, 0) + v
        for k, v in r["failures_by_kind"].items():
            kinds[k] = kinds.get(k, 0) + v
        for d in r["distinct_failures"]:
            m = distinct.setdefault(d["path"], dict(d, occurrences=0, flaky_occurrences=0))
            m["occurrences"] += d["occurrences"]
            m["flaky_occurrences"] += d["flaky_occurrences"]
        for name, t in r["targets"].items():
            m = tgts.setdefault(name, {"examples": 0, "rounds": 0, "elapsed_s": 0.0,
                                       "failures": 0})
            for k in m:
                m[k] += t.get(k, 0)
    memory = {f"w{i}.{k}": v for i, r in got for k, v in r["memory"].items()}
    starts = [r["throughput"]["start"] for _, r in got]
    ends = [r["throughput"]["end"] for _, r in got]
    rep = {
        "config": dict(base["config"], worlds=len(exits), gpu_sharing=gpu_sharing),
        "stop_reason": stop_reason or base["stop_reason"],
        "starts": max(r["starts"] for _, r in got),
        "elapsed_s": max(r["elapsed_s"] for _, r in got),
        "examples": sum(r["examples"] for _, r in got),
        "rounds": sum(r["rounds"] for _, r in got),
        "examples_per_s": round(sum(w["examples_per_s"] for w in worlds), 3),
        "throughput": {"start": _total(starts), "end": _total(ends), "by_target": {}},
        "rank_restarts": sum(r["rank_restarts"] for _, r in got),
        "rank_recycles": sum(r["rank_recycles"] for _, r in got),
        "held_by": dict(sorted(held.items())),
        "failures_by_kind": kinds,
        "flaky": sum(r["flaky"] for _, r in got),
        "distinct_failures": list(distinct.values()),
        "failures": [dict(f, world=i) for i, r in got for f in r["failures"]],
        "behaviours": {"distinct": len(behaviours),
                       "counts": dict(sorted(behaviours.items(), key=lambda kv: -kv[1]))},
        **soak_report.coverage(base["config"].get("targets") or [], tgts),
        "memory": memory,
        "memory_growing": sorted(k for k in memory
                                 if any(k == f"w{i}.{g}" for i, r in got
                                        for g in r["memory_growing"])),
        "memory_rising": sorted(k for k in memory
                                if any(k == f"w{i}.{g}" for i, r in got
                                       for g in r.get("memory_rising", []))),
        "projected": all(r.get("projected", False) for _, r in got),
        "memory_judged": all(r.get("projected", False) for _, r in got),
        "samples": sum(r["samples"] for _, r in got),
        "worlds": worlds,
    }
    rep["plot"] = "report.png" if _plot(out / "report.png", world_dirs, rep) else None
    write_json_atomic(out / "report.json", rep)
    write_text_atomic(out / "report.md", soak_report.markdown(rep) + _worlds_md(rep))
    return rep


def _total(values: list[float | None]) -> float | None:
    return round(sum(v for v in values if v is not None), 3) \
        if any(v is not None for v in values) else None


def _worlds_md(rep: dict[str, Any]) -> str:
    lines = ["", "## Worlds", "", "| world | examples | ex/s | memory | exit | folder |",
             "|---|---|---|---|---|---|"]
    for w in rep["worlds"]:
        mem = ("no report" if not w["report"] else "not judged" if not w.get("memory_judged", True)
               else "GROWING: " + ", ".join(w["memory_growing"]) if w["memory_growing"]
               else "rising: " + ", ".join(w["memory_rising"]) if w.get("memory_rising")
               else "flat")
        lines.append(f"| w{w['world']} | {w['examples']} | {w['examples_per_s']:.1f} | {mem} | "
                     f"{w['exit']} | {w['out']} |")
    lines.append(f"| total | {rep['examples']} | {rep['examples_per_s']:.1f} | "
                 f"{soak_report.memory_text(rep).partition(':')[0]} | | |")
    if rep["config"].get("gpu_sharing"):
        lines += ["", f"The worlds shared the GPU by {rep['config']['gpu_sharing']}."]
    return "\n".join(lines) + "\n"


def _plot(path: Path, world_dirs: list[Path], rep: dict[str, Any]) -> bool:
    """Each world's rate and the total over time; each world's memory."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from streamfuzz.fuzz.soak import read_samples

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for i, d in enumerate(world_dirs):
        samples = read_samples(d / "stats.jsonl")
        t = [s["t"] / 60 for s in samples]
        ax1.plot(t, [s.get("rate") or 0.0 for s in samples], lw=1, label=f"w{i}")
        for key, style in (("driver_rss", ":"),):
            ax2.plot(t, [(s.get(key) or 0) / 2**20 for s in samples], lw=1, ls=style,
                     label=f"w{i} driver rss")
        ranks = max((len(s.get("ranks") or ()) for s in samples), default=0)
        for r in range(ranks):
            for key, style in (("rss", "-"), ("gpu_reserved", "--")):
                col = [((s.get("ranks") or [None] * ranks)[r] or {}).get(key) for s in samples]
                if any(col):
                    ax2.plot(t, [(v or 0) / 2**20 for v in col], lw=1, ls=style,
                             label=f"w{i} rank{r} {key.replace('_', ' ')}")
    ax1.set_ylabel("examples/s per world")
    ax1.set_ylim(bottom=0)
    ax1.set_title(f"streamfuzz soak, {rep['config']['worlds']} worlds: "
                  f"{rep['examples_per_s']:.0f} examples/s in total", fontsize=10)
    ax1.legend(loc="lower right", fontsize=7, ncol=4)
    ax2.set_ylabel("MiB")
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("campaign time (min)")
    ax2.legend(loc="lower right", fontsize=6, ncol=4)
    fig.tight_layout()
    try:
        write_atomic(path, lambda fh: fig.savefig(fh, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return True
