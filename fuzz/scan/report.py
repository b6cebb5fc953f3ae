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
from typing import Any

from streamfuzz.fuzz.scan import ScanResult
from streamfuzz.fuzz.scan.hazards import BASE, FACTORS, Finding

SCHEMA = 1


def as_json(result: ScanResult, seconds: float | None = None) -> dict[str, Any]:
    src = result.source
    return {
        "schema": SCHEMA,
        "source": {"spec": src.spec, "kind": src.kind, "name": src.name,
                   "version": src.version},
        "files": result.files,
        "functions": result.functions,
        "unparsed": result.unparsed,
        "seconds": None if seconds is None else round(seconds, 2),
        "score": {"base": {h.value: b for h, b in BASE.items()},
                  "factors": {k: {"points": p, "why": w} for k, (p, w) in FACTORS.items()}},
        "findings": [f.as_dict() for f in result.active],
        "suppressed": [f.as_dict() for f in result.findings if f.suppressed is not None],
    }


def _cell(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _site_cell(site: str, width: int) -> str:
    """A site cut from the left, so its file name and line stay readable."""
    return site if len(site) <= width else "…" + site[len(site) - width + 1:]


def table(result: ScanResult, limit: int | None = None) -> str:
    """The terminal table: one finding a line, the highest score first."""
    rows = result.active if limit is None else result.active[:limit]
    head = f"{'rank':>4}  {'score':>5}  {'class':<22}  {'site':<48}  {'function':<30}  what"
    out = [f"streamfuzz scan: {result.source.label} ({result.source.kind}): {result.files} files, "
           f"{result.functions} functions with stream code, {len(result.active)} findings"
           + (f", {len(result.findings) - len(result.active)} suppressed"
              if len(result.findings) != len(result.active) else ""), head]
    for f in rows:
        site = _site_cell(f.site, 48)
        out.append(f"{f.rank:>4}  {f.score:>5}  {f.hazard.value:<22}  {site:<48}  "
                   f"{_cell(f.function, 30):<30}  {f.what}")
    if limit is not None and len(result.active) > limit:
        out.append(f"      ... {len(result.active) - limit} more (--top 0 shows all; "
                   "--json/--md write all)")
    return "\n".join(out)


def markdown(result: ScanResult) -> str:
    src = result.source
    out = [f"# streamfuzz scan: {src.label}", "",
           f"{src.kind} `{src.spec}`: {result.files} files, {result.functions} functions with "
           f"stream code, {len(result.active)} findings.", "",
           "| rank | score | class | site | function | tensors | streams | what | safe if |",
           "|---:|---:|---|---|---|---|---|---|---|"]
    for f in result.active:
        out.append(_md_row(f))
    sup = [f for f in result.findings if f.suppressed is not None]
    if sup:
        out += ["", "## Suppressed", "", "| class | site | function | reason |",
                "|---|---|---|---|"]
        out += [f"| {f.hazard.value} | `{f.site}` | `{f.function}` | {_esc(f.suppressed or '')} |"
                for f in sup]
    out += ["", "Score: the class's base plus its factors, clamped to 1..99 (docs/scan.md).", ""]
    return "\n".join(out)


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_row(f: Finding) -> str:
    return (f"| {f.rank} | {f.score} | {f.hazard.value} | `{f.site}` | `{f.function}` | "
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


def write_json(path: Path, result: ScanResult, seconds: float | None) -> None:
    write(path, json.dumps(as_json(result, seconds), indent=1) + "\n")
