"""A checked run's record: which functions did stream work, and which a finding named.

``pytest --streamfuzz --streamfuzz-record FILE`` and ``streamfuzz check
--record FILE`` write one; ``streamfuzz scan PATH --record FILE`` reads it
and marks each of its findings flagged, clean or not reached
(``streamfuzz.fuzz.scan.marks``). The counting rides on the walk the
lifetime checker already makes of the user's frames at every op it records
(``streamfuzz.fuzz.frames.count_functions``), on CPU and on CUDA alike.

The first time a walk meets a function, its call is sketched
(``streamfuzz._callsketch``): what ``scan --harness FILE:LINE --record FILE``
writes a harness from.

Each process keeps its own part. A child of a checked program hands its part
back with its findings (``streamfuzz._subprocesses``); a pytest-xdist worker
hands its part to the controller, which merges and writes the file.
Nothing here imports torch: ``scan`` reads records too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from streamfuzz import _callsketch
from streamfuzz._callsketch import CallSketch
from streamfuzz.fuzz import env
from streamfuzz.fuzz.errors import BadInput

VERSION = 1
"""The record's format; a record of another version is refused, not guessed at."""
CALLS = 1000
"""Calls a process sketches at most (each is bounded too: ``streamfuzz._callsketch``)."""
RECORD_ENV = env.CHECK_RECORD
"""Set by a recording run: the processes it starts record too."""

Frames = tuple[tuple[str, int, str], ...]


class RecordError(BadInput, ValueError):
    """A record file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Function:
    """A user function that did stream work: ``ops`` walks of the checker met it."""

    path: str  # absolute
    function: str  # qualified name (``Class.method``, ``outer.inner``)
    first_line: int  # its code's first line (its first decorator's, where it has one)
    ops: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.function, self.first_line


@dataclass(frozen=True)
class Site:
    """One frame of a finding, with the function it is in (first_line 0: not known)."""

    path: str
    line: int
    function: str
    first_line: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.path, self.function, self.first_line


@dataclass(frozen=True)
class Finding:
    """One finding of the run: its kind, its first line, its frames."""

    kind: str
    summary: str
    sites: tuple[Site, ...]

    @property
    def key(self) -> tuple[str, tuple[Site, ...]]:
        """One finding however often it was met (a Hypothesis test's examples
        differ in sizes, so in the first line, not in where)."""
        return self.kind, self.sites


@dataclass(frozen=True)
class Record:
    """What a checked run saw, merged over its processes."""

    made_by: str  # ``pytest --streamfuzz`` or ``streamfuzz check PROGRAM``
    device: str
    processes: int
    functions: tuple[Function, ...]
    findings: tuple[Finding, ...]
    version: int = VERSION
    calls: tuple[CallSketch, ...] = ()
    """The first call of each function that did stream work, sketched."""

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "made_by": self.made_by, "device": self.device,
                "processes": self.processes,
                "calls": {"version": _callsketch.VERSION,
                          "sketches": [_callsketch.to_json(c) for c in self.calls]},
                "functions": [[f.path, f.function, f.first_line, f.ops] for f in self.functions],
                "findings": [{"kind": f.kind, "summary": f.summary,
                              "sites": [[s.path, s.line, s.function, s.first_line]
                                        for s in f.sites]} for f in self.findings]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        """Raises ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed record."""
        if not isinstance(d, dict):
            raise TypeError("not a JSON object")
        calls = d.get("calls", {"version": _callsketch.VERSION, "sketches": []})
        if calls["version"] != _callsketch.VERSION:
            raise ValueError(f"call sketches of version {calls['version']!r}")
        return cls(str(d["made_by"]), str(d["device"]), int(d["processes"]),
                   tuple(Function(str(p), str(n), int(first), int(ops))
                         for p, n, first, ops in d["functions"]),
                   tuple(Finding(str(f["kind"]), str(f["summary"]),
                                 tuple(Site(str(p), int(line), str(n), int(first))
                                       for p, line, n, first in f["sites"]))
                         for f in d["findings"]),
                   int(d["version"]),
                   tuple(_callsketch.from_json(c) for c in calls["sketches"]))

    def merged(self, other: Record) -> Record:
        """Both runs' parts as one: a function's ops summed, a finding once."""
        ops: dict[tuple[str, str, int], int] = {}
        for f in (*self.functions, *other.functions):
            ops[f.key] = ops.get(f.key, 0) + f.ops
        findings: dict[tuple[str, tuple[Site, ...]], Finding] = {}
        for found in (*self.findings, *other.findings):
            findings.setdefault(found.key, found)
        calls: dict[tuple[str, str, int], CallSketch] = {}
        for call in (*self.calls, *other.calls):
            calls.setdefault(call.key, call)  # the first call met
        return replace(self, processes=self.processes + other.processes,
                       functions=tuple(Function(*k, n) for k, n in sorted(ops.items())),
                       findings=tuple(findings.values()), calls=tuple(calls.values()))


# -- this process's part ----------------------------------------------------------

_counts: dict[int, list] | None = None
"""While recording: ``frames_here``'s count of each user function, by code id."""
_found: dict[tuple[str, tuple[Site, ...]], Finding] = {}
_calls: dict[tuple[str, str, int], CallSketch] = {}
"""The first call of each function met, sketched, by ``Function.key``."""
_parts: list[Record] = []
"""Parts other processes handed to this one (children, pytest-xdist workers)."""


def start() -> None:
    """Record from now on, in this process and in those it starts."""
    global _counts
    from streamfuzz.fuzz import frames

    _counts = {}
    frames.count_functions(_counts, _sketch)
    os.environ[RECORD_ENV] = "1"


def recording() -> bool:
    return _counts is not None


def forked() -> None:
    """In a forked child: its part starts empty (the parent's is the parent's)."""
    _found.clear()
    _calls.clear()
    _parts.clear()
    if _counts is not None:
        start()


def _sketch(frame: FrameType) -> None:
    """A function's first call, met at its first stream op: sketched once."""
    code = frame.f_code
    if code.co_filename.startswith("<") or code.co_name.startswith("<") or \
            len(_calls) >= CALLS:  # a comprehension's or a lambda's: no call to make again
        return
    key = (_absolute(code.co_filename), _qualname(code), code.co_firstlineno)
    if key not in _calls:
        sketch = _callsketch.capture(frame, key[0], key[1])
        if sketch is not None:
            _calls[key] = sketch


def note(sites: list[tuple[str, str, Frames]]) -> None:
    """Findings a checked block reported: kind, first line, frames (innermost
    first, each site's in turn), each frame placed in its function."""
    if _counts is None or not sites:
        return
    index: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for code, _ in _counts.values():
        index.setdefault((code.co_filename, code.co_name), []).append(
            (code.co_firstlineno, _qualname(code)))
    for kind, summary, frames in sites:
        placed = []
        for path, line, name in frames:
            # The function named so whose code starts last at or before the line.
            first, qual = max(((fl, q) for fl, q in index.get((path, name), ()) if fl <= line),
                              default=(0, name))
            placed.append(Site(_absolute(path), line, qual, first))
        found = Finding(kind, summary, tuple(dict.fromkeys(placed)))
        _found.setdefault(found.key, found)


def absorb(part: dict[str, Any] | None) -> None:
    """Another process's part (a child's, a worker's); a malformed one is left out."""
    if part is None:
        return
    try:
        _parts.append(Record.from_dict(part))
    except (KeyError, TypeError, ValueError):
        return


def this_process(made_by: str, device: str) -> Record:
    """This process's part (where it recorded) and every part handed to it."""
    functions: dict[tuple[str, str, int], int] = {}
    for code, n in (_counts or {}).values():
        if code.co_filename.startswith("<"):
            continue  # code with no file (``exec`` of a string): nothing to match
        key = (_absolute(code.co_filename), _qualname(code), code.co_firstlineno)
        functions[key] = functions.get(key, 0) + n
    own = Record(made_by, device, int(_counts is not None),
                 tuple(Function(*k, n) for k, n in sorted(functions.items())),
                 tuple(_found.values()), calls=tuple(_calls.values()))
    if _counts is None and _parts:  # a pytest-xdist controller: its workers ran the tests
        own = replace(own, device=_parts[0].device)
    for part in _parts:
        own = own.merged(part)
    return own


def _qualname(code: Any) -> str:
    """The qualified name as a scan names it (Python 3.10 has no ``co_qualname``)."""
    return str(getattr(code, "co_qualname", code.co_name)).replace(".<locals>", "")


def _absolute(path: str) -> str:
    return path if path.startswith("<") else os.path.abspath(path)


# -- the file ------------------------------------------------------------------

def write(path: str, record: Record) -> None:
    """The record to ``path`` whole, as reports are written (its folder made
    where missing: ``check_file`` vouched for it before the run)."""
    from streamfuzz.fuzz.corpus import write_json_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(Path(path), record.to_dict())


def read(path: str, option: str = "--record") -> Record:
    """The record at ``path``; bad input is one line (``RecordError``)."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise RecordError(f"{option} {path}: no such file") from None
    except IsADirectoryError:
        raise RecordError(f"{option} {path}: is a directory") from None
    except OSError as exc:
        raise RecordError(f"{option} {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise RecordError(f"{option} {path}: not a streamfuzz record (not JSON: "
                          f"{str(exc).splitlines()[0]})") from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != VERSION:
        raise RecordError(f"{option} {path}: a record of version {version!r}; this streamfuzz "
                          f"reads version {VERSION} (run the check again to write one)")
    calls = data.get("calls", {}) if isinstance(data, dict) else {}
    sketches = calls.get("version", _callsketch.VERSION) if isinstance(calls, dict) else None
    if sketches != _callsketch.VERSION:
        raise RecordError(f"{option} {path}: its calls are sketched in version {sketches!r}; "
                          f"this streamfuzz reads version {_callsketch.VERSION} (run the check "
                          "again to write one)")
    try:
        return Record.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"{option} {path}: not a streamfuzz record (bad or missing "
                          f"{exc})") from None
