"""The benchmark's report as markdown: the tables ``bench.md`` holds."""

from __future__ import annotations

from typing import Any

from streamfuzz.fuzz import stages_report


def fmt(value: Any, digits: int = 1) -> str:
    """A table cell: ``-`` for none, floats to ``digits`` places."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _api_cell(tp: dict[str, Any] | None) -> str:
    """``ratio (plain / streams)``: the median ratio of the rounds, and each side's median."""
    form = tp.get("api_forms") if tp else None
    if not form:
        return "-"
    return (f"{form['ratio']:.2f} ({form['plain_ex_s']:.1f} / "
            f"{form['streams_ex_s']:.1f})")


def markdown(report: dict[str, Any]) -> str:
    """The tables the README quotes (stages not run yet show as '-')."""
    lines = []
    for r in report["runs"]:
        lines += [f"### {r['device']}: {r.get('device_name')}, world size {r['world_size']}, "
                  f"{r.get('backend')}, torch {r.get('torch')}, gates: {r.get('gates')}", "",
                  "| target | fuzzer ex/s | waiting ex/s | loop ex/s | fuzzer/loop | held by | "
                  "value oracle "
                  "ms/ex | reuse oracle ms/ex | lifetime oracle ms/ex | found (seeds) | "
                  "examples to 1st failure | s to 1st failure (cold) | of which start s | "
                  "s to 1st failure from process start | shrink s | "
                  "torch.cuda / ctx.streams ex/s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for t in r["targets"]:
            tp, ff = t.get("throughput"), t.get("first_failure") or {}
            proc = t.get("from_process_start") or {}
            cost = tp["oracle_cost_ms"] if tp else {}
            seeds = len(ff.get("seeds", []))
            lines.append(
                f"| {t['target']} | {fmt(tp and tp['fuzzer_ex_s'])} | "
                f"{fmt(tp and tp.get('waiting_ex_s'))} | {fmt(tp and tp['loop_ex_s'])} | "
                f"{fmt(tp and tp['ratio'], 2)} | "
                f"{', '.join(tp['held_by']) if tp and tp['held_by'] else '-'} | "
                f"{fmt(cost.get('value'), 2)} | {fmt(cost.get('reuse'), 2)} | "
                f"{fmt(cost.get('lifetime'), 2)} | "
                f"{(str(ff['found']) + '/' + str(seeds)) if ff else '-'} | "
                f"{fmt(ff.get('median_examples'), 0)} | {fmt(ff.get('median_cold_s'), 2)} | "
                f"{fmt(ff.get('median_start_s'), 2)} | {fmt(proc.get('median_s'), 2)} | "
                f"{'>' if ff.get('shrink_truncated') else ''}"
                f"{fmt(ff.get('median_shrink_s'), 2)} | {_api_cell(tp)} |")
        breakdowns = [t["stages"] for t in r["targets"] if t.get("stages")]
        if breakdowns:
            lines += ["", f"Where the time goes (ms per example, stage counters, "
                      f"{breakdowns[0]['examples']} examples of seed 0):", ""]
            lines += stages_report.table(breakdowns)
            cpu = stages_report.cpu_table(breakdowns)
            if cpu:
                lines += ["", "CPU ms per example by thread (the same run; `/proc`):", ""] + cpu
        if r["device"] == "cpu":
            lines += ["", "Detection with gates and spins: not on CPU, whose streams are "
                      "simulated (a race never shows in the values there; the lifetime "
                      "oracle finds it from the order of events).", ""]
            continue
        lines += ["", "| target | crafted: gates | crafted: spins (1e6 cycles) | random: gates | "
                  "random: spins |", "|---|---|---|---|---|"]
        for t in r["targets"]:
            det = t.get("detection")
            if not det:
                lines.append(f"| {t['target']} | - | - | - | - |")
                continue
            c, q = det["crafted"], det["random"]
            lines.append(f"| {t['target']} | {c['gate']}/{c['examples']} | "
                         f"{c['spin']}/{c['examples']} | {q['gate']}/{q['examples']} | "
                         f"{q['spin']}/{q['examples']} |")
        lines.append("")
    lines.append(f"Medians over seeds (shrink: first seed only, '>' when its bound cut it "
                 f"short); oracle costs over the first examples of the throughput run; "
                 f"torch.cuda / ctx.streams: the built-in version against its ctx.streams "
                 f"form on the same scenarios, median of alternating rounds; "
                 f"host {report['machine']['host']}, Hypothesis {report['hypothesis']}.")
    return "\n".join(lines) + "\n"
