"""How a ``mutate`` report is shown: a terminal table, markdown, and JSON on disk."""

from __future__ import annotations

from pathlib import Path

from streamfuzz.fuzz import corpus
from streamfuzz.fuzz.mutate import Report, Row

_HEADER = ("site", "call", "verdict", "kind", "examples to 1st failure", "shrunk message")


def _cells(row: Row) -> tuple[str, ...]:
    if row.verdict == "caught":
        return (row.site.where, row.site.call, "caught", row.kind or "-",
                str(row.first_failure), (row.message or "") + (" [flaky]" if row.flaky else ""))
    return (row.site.where, row.site.call, "survived", "-", f"- ({row.examples} run)", "-")


def _title(report: Report) -> str:
    done = "" if report.complete else (f" (interrupted: {len(report.rows)} of "
                                       f"{report.sites} sites done)")
    return (f"streamfuzz mutate {report.target} on {report.device}, world size "
            f"{report.world_size}, {report.max_examples} examples per mutant, seed "
            f"{report.seed}, oracle {'+'.join(report.oracles)}{done}")


def _summary(report: Report) -> str:
    caught = sum(r.verdict == "caught" for r in report.rows)
    rate = 60 * len(report.rows) / report.elapsed_s if report.elapsed_s else 0.0
    return (f"{caught} of {len(report.rows)} mutants caught; the original ran clean over "
            f"{report.clean_examples} examples; {report.elapsed_s:.0f}s "
            f"({rate:.1f} mutants/min, {report.jobs} worker(s))")


def _cut(cell: str, width: int) -> str:
    first = cell.splitlines()[0] if cell else cell
    return first if len(first) <= width else first[: width - 3] + "..."


def text(report: Report, width: int = 70) -> str:
    """The terminal table; long messages cut to ``width``, survivors' notes below."""
    rows = [_HEADER] + [tuple(_cut(c, width) for c in _cells(r)) for r in report.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = [_title(report) + ":"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    notes = [f"  {r.site.where}: {r.why}" for r in report.rows if r.why]
    if notes:
        lines += ["survivors:"] + notes
    lines.append(_summary(report))
    return "\n".join(lines)


def _md(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown(report: Report) -> str:
    lines = [f"{_title(report)}.", "", "| " + " | ".join(_HEADER) + " |",
             "|" + "---|" * len(_HEADER)]
    for r in report.rows:
        c = [x.splitlines()[0] if x else x for x in _cells(r)]  # frames stay in the JSON
        c[1] = f"`{c[1]}`"
        lines.append("| " + " | ".join(_md(x) for x in c) + " |")
    notes = [f"- `{r.site.where}` (`{r.site.call}`): {r.why}" for r in report.rows if r.why]
    if notes:
        lines += ["", "Survivors:", ""] + notes
    lines += ["", _summary(report) + "."]
    return "\n".join(lines) + "\n"


def write(out: Path, report: Report) -> tuple[Path, Path]:
    """``out/<target>.json`` and ``.md``, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    stem = corpus.target_dir(report.target)
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    corpus.write_json_atomic(json_path, report.to_dict())
    corpus.write_text_atomic(md_path, markdown(report))
    return json_path, md_path
