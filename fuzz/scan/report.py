"""A scan's findings as a terminal table, JSON and markdown.

All three list the same findings in the same order (rank, then suppressed
ones), and nothing in them depends on the clock or the machine except the
JSON's ``seconds``, so two scans of one input compare equal once that is set
aside. Files are written whole through a temporary name, so a report on disk is
never half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamfuzz.fuzz.scan import ScanResult
from streamfuzz.fuzz.scan.hazards import BASE, FACTORS, Finding

if TYPE_CHECKING:
    from streamfuzz.fuzz.scan.marks import Marks

SCHEMA = 1


def as_json(result: ScanResult, seconds: float | None = None,
            marks: Marks | None = None) -> dict[str, Any]:
    """With ``marks`` (``scan --record``), each finding's ``run`` and the run's counts."""
    src = result.source
    out = {
        "schema": SCHEMA,
        "source": {"spec": src.spec, "kind": src.kind, "name": src.name,
                   "version": src.version},
        "files": result.files,
        "functions": result.functions,
        "unparsed": result.unparsed,
        "seconds": None if seconds is None else round(seconds, 2),
        "score": {"base": {h.value: b for h, b in BASE.items()},
                  "factors": {k: {"points": p, "why": w} for k, (p, w) in FACTORS.items()}},
        "findings": [_as_dict(f, marks) for f in result.active],
        "suppressed": [_as_dict(f, marks) for f in result.findings if f.suppressed is not None],
    }
    if marks is not None:
        r = marks.record
        out["record"] = {"file": marks.record_file, "made_by": r.made_by, "device": r.device,
                         "processes": r.processes, "counts": dict(marks.counts),
                         "summary": marks.summary()}
    return out


def _as_dict(f: Finding, marks: Marks | None) -> dict[str, object]:
    d = f.as_dict()
    if marks is not None:
        from streamfuzz.fuzz.scan.marks import RUN

        d["run"] = f.extra.get(RUN)
    return d


def _mark(f: Finding, marks: Marks | None, width: int = 0) -> str:
    """A finding's mark from the run (``scan --record``), as a cell; nothing without one."""
    if marks is None:
        return ""
    from streamfuzz.fuzz.scan.marks import mark_of

    return f"{mark_of(f) or '':<{width}}" + ("  " if width else "")


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _site_cell(site: str, width: int) -> str:
    """A site cut from the left, so its file name and line stay readable."""
    return site if len(site) <= width else "…" + site[len(site) - width + 1:]


def table(result: ScanResult, limit: int | None = None, marks: Marks | None = None) -> str:
    """The terminal table: one finding a line, the highest score first."""
    rows = result.active if limit is None else result.active[:limit]
    run = f"{'run':<11}  " if marks is not None else ""
    head = (f"{'rank':>4}  {'score':>5}  {run}{'class':<22}  {'site':<48}  {'function':<30}  "
            "what")
    out = [f"streamfuzz scan: {result.source.label} ({result.source.kind}): {result.files} files, "
           f"{result.functions} functions with stream code, {len(result.active)} findings"
           + (f", {len(result.findings) - len(result.active)} suppressed"
              if len(result.findings) != len(result.active) else ""), head]
    for f in rows:
        site = _site_cell(f.site, 48)
        out.append(f"{f.rank:>4}  {f.score:>5}  {_mark(f, marks, 11)}{f.hazard.value:<22}  "
                   f"{site:<48}  {_cell(f.function, 30):<30}  {f.what}")
    if limit is not None and len(result.active) > limit:
        out.append(f"      ... {len(result.active) - limit} more (--top 0 shows all; "
                   "--json/--md write all)")
    if marks is not None:
        out.append(marks.summary())
    return "\n".join(out)


def markdown(result: ScanResult, marks: Marks | None = None) -> str:
    src = result.source
    run = ("run | ", "---|") if marks is not None else ("", "")
    out = [f"# streamfuzz scan: {src.label}", "",
           f"{src.kind} `{src.spec}`: {result.files} files, {result.functions} functions with "
           f"stream code, {len(result.active)} findings.", "",
           f"| rank | score | {run[0]}class | site | function | tensors | streams | what | "
           "safe if |",
           f"|---:|---:|{run[1]}---|---|---|---|---|---|---|"]
    for f in result.active:
        out.append(_md_row(f, marks))
    sup = [f for f in result.findings if f.suppressed is not None]
    if sup:
        out += ["", "## Suppressed", "", "| class | site | function | reason |",
                "|---|---|---|---|"]
        out += [f"| {f.hazard.value} | `{f.site}` | `{f.function}` | {_esc(f.suppressed or '')} |"
                for f in sup]
    if marks is not None:
        out += ["", marks.summary()]
    out += ["", "Score: the class's base plus its factors, clamped to 1..99 (docs/scan.md).", ""]
    return "\n".join(out)


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_row(f: Finding, marks: Marks | None = None) -> str:
    run = f"{_mark(f, marks)} | " if marks is not None else ""
    return (f"| {f.rank} | {f.score} | {run}{f.hazard.value} | `{f.site}` | `{f.function}` | "
            f"{_esc(', '.join(f.tensors))} | {_esc(', '.join(f.streams))} | {_esc(f.what)} "
            f"({_esc(', '.join(f.factors)) or 'no factors'}) | {_esc(f.safe_if)} |")


def write(path: Path, text: str) -> None:
    """``text`` to ``path`` whole: a temporary file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, result: ScanResult, seconds: float | None,
               marks: Marks | None = None) -> None:
    write(path, json.dumps(as_json(result, seconds, marks), indent=1) + "\n")
