"""Each scan finding marked from a checked run's record (``scan PATH --record FILE``).

``flagged``: a finding of the run names the finding's function (one of its
frames is in it). ``clean``: the function did stream work in the run and no
finding of the run names it. ``not reached``: the run never did stream work
in it, so only a test that reaches it, or ``--harness``, can say more.

The record names files as the run ran them (absolute paths); a scan names
them inside what it read. A scan file is the run's file with the same path
(a source tree the run imported), else one whose path ends with the scan's
(``pkg/mod.py``: an installed package scanned from its source tree, a wheel),
else those that share the longest tail of two parts or more with it (a
``src/`` layout). In that file the finding's function is the one of the same
qualified name whose first line is the last at or before the finding's line.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

from streamfuzz._record import Function, Record
from streamfuzz.fuzz.scan import ScanResult
from streamfuzz.fuzz.scan.hazards import Finding
from streamfuzz.fuzz.scan.sources import Source

FLAGGED, CLEAN, NOT_REACHED = "flagged", "clean", "not reached"
MARKS = (FLAGGED, CLEAN, NOT_REACHED)
RUN = "run"
"""The key of a finding's mark in ``Finding.extra``: ``{"mark", "ops", "findings"}``."""


@dataclass(frozen=True)
class Marks:
    """How a scan's findings fared in one run: the counts of each mark."""

    record_file: str
    record: Record
    counts: Counter[str]
    harness: str = ""
    """The ``--harness`` command for the highest-ranked finding not reached."""

    def summary(self) -> str:
        """One line for the report's end: the counts, and what to do next."""
        r = self.record
        head = (f"run of {self.record_file} ({r.made_by}, {r.device}, {r.processes} "
                f"process(es)): " + ", ".join(f"{self.counts[m]} {m}" for m in MARKS))
        if not self.counts[NOT_REACHED]:
            return head
        return (f"{head}; the {self.counts[NOT_REACHED]} not reached need a harness: write "
                f"a test that reaches them, or have one written (`{self.harness}`, the first)")


def mark(result: ScanResult, record: Record, record_file: str) -> Marks:
    """Put each finding's mark in its ``extra[RUN]``; the counts (unsuppressed only)."""
    index = _Index(record, _base(result.source))
    counts: Counter[str] = Counter()
    harness = ""
    for f in result.findings:
        run = index.mark(f)
        f.extra[RUN] = run
        if f.suppressed is None:
            counts[str(run["mark"])] += 1
            if run["mark"] == NOT_REACHED and not harness:
                harness = f"python -m streamfuzz scan {result.source.spec} --harness {f.site}"
    return Marks(record_file, record, counts, harness)


def functions_at(record: Record, source: Source, file: str, function: str,
                 line: int) -> list[Function]:
    """The record's functions that are ``function`` of the scan's ``file``, at ``line``
    (a harness written from the run's sketch of its call)."""
    return _Index(record, _base(source)).functions(file, function, line)


def mark_of(f: Finding) -> str | None:
    run = f.extra.get(RUN)
    return str(run["mark"]) if isinstance(run, dict) else None


class _Index:
    def __init__(self, record: Record, base: Path | None) -> None:
        self.base = base
        self.by_path: dict[str, list[Function]] = {}
        for fn in record.functions:
            self.by_path.setdefault(fn.path, []).append(fn)
        self.named: dict[tuple[str, str, int], list[str]] = {}
        for found in record.findings:
            for site in dict.fromkeys(s.key for s in found.sites):
                self.named.setdefault(site, []).append(f"{found.kind}: {found.summary}")
        self._real = {_real(p): p for p in self.by_path}
        self._files: dict[str, list[str]] = {}

    def mark(self, f: Finding) -> dict[str, object]:
        ran = self.functions(f.file, f.function, f.line)
        named = [n for fn in ran for n in self.named.get(fn.key, ())]
        which = FLAGGED if named else CLEAN if ran else NOT_REACHED
        return {"mark": which, "ops": sum(fn.ops for fn in ran),
                "findings": list(dict.fromkeys(named))}

    def _paths(self, rel: str) -> list[str]:
        """The run's files that are the scan's file ``rel`` (see the module docstring)."""
        found = self._files.get(rel)
        if found is not None:
            return found
        exact = self._real.get(_real(str(self.base / rel))) if self.base is not None else None
        if exact is not None:
            found = [exact]
        else:
            found = [p for p in self.by_path if p.endswith("/" + rel) or p == rel]
            if not found:
                found = _longest_tails(PurePath(rel).parts, self.by_path)
        self._files[rel] = found
        return found

    def functions(self, file: str, function: str, line: int) -> list[Function]:
        """The run's functions that are the scan's ``function`` of ``file`` at ``line``."""
        return [fn for path in self._paths(file)
                if (fn := self._function(path, function, line)) is not None]

    def _function(self, path: str, function: str, line: int) -> Function | None:
        best = None
        for fn in self.by_path[path]:
            if _same_name(fn.function, function) and fn.first_line <= line and (
                    best is None or fn.first_line > best.first_line):
                best = fn
        return best


def _same_name(recorded: str, scanned: str) -> bool:
    """A record's name is qualified (``Class.method``) except on Python 3.10."""
    return recorded == scanned or ("." not in recorded
                                   and recorded == scanned.rsplit(".", 1)[-1])


def _longest_tails(parts: tuple[str, ...], paths: Iterable[str]) -> list[str]:
    """The paths sharing the longest tail with ``parts``, where it has two parts or more."""
    best, found = 2, []
    for p in paths:
        other = PurePath(p).parts
        n = 0
        while n < min(len(parts), len(other)) and parts[-1 - n] == other[-1 - n]:
            n += 1
        if n > best:
            best, found = n, [p]
        elif n == best:
            found.append(p)
    return found


def _base(source: Source) -> Path | None:
    """The folder a scan's file paths are relative to, where it is one on disk."""
    root = source.root.absolute()
    if source.kind == "file":
        return root.parent
    if source.kind in ("tree", "installed"):
        return root.parent if (root / "__init__.py").exists() else root
    return None  # a wheel or sdist: its files are inside an archive


def _real(path: str) -> str:
    return os.path.realpath(path)
