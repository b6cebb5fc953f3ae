"""The regression corpus: one JSON file per shrunk failure, libFuzzer style.

A file holds the scenario as plain values, so it replays after the strategies
change or Hypothesis is upgraded. Files are written atomically (temporary file,
fsync, rename): an interrupted run never leaves half an entry behind, and the
temporary file of a run killed mid-write is swept by the next one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.options import ORACLE_CHOICES, OptionsError, parse_oracles
from streamfuzz.fuzz.protocol.scenario import ScenarioError
from streamfuzz.fuzz.targets.names import file_name
from streamfuzz.fuzz.verdict import KINDS

SCHEMA = 1

STALE_TEMP_S = 600.0
"""A temporary file older than this was left by a writer that was killed (a
write takes milliseconds); younger ones may belong to a live writer on a
shared corpus."""


class CorpusError(BadInput, ValueError):
    """A corpus file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Entry:
    target: str
    kind: str
    message: str
    scenario: Any
    """The scenario of ``protocol`` (``streamfuzz.fuzz.protocol``)."""
    found_on: dict[str, Any] = field(default_factory=dict)
    flaky: bool = False
    path: Path | None = None
    protocol: str = protocols.DEFAULT

    @property
    def device(self) -> str:
        return str(self.found_on.get("device", "cpu"))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "protocol": self.protocol, "target": self.target,
                "kind": self.kind,
                "message": self.message, "flaky": self.flaky, "found_on": self.found_on,
                "scenario": self.scenario.to_dict()}


target_dir = file_name
"""A file name for anything named after a target (``streamfuzz.fuzz.targets.names.file_name``)."""


def save(corpus: Path, entry: Entry) -> Path:
    """Write ``entry`` under ``corpus/<target>/``; the name is its content hash.

    An entry for the same scenario that is already there is kept as it is (a
    committed regression must not change with the machine that found it again),
    unless only its ``flaky`` mark differs.
    """
    data = entry.to_dict()
    path = path_of(corpus, entry.target, entry.kind, data["scenario"])
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent)
    try:
        if load(path).flaky == entry.flaky:
            return path
    except CorpusError:
        pass  # absent or unusable: write it
    write_json_atomic(path, data)
    return path


def path_of(corpus: Path, target: str, kind: str, scenario: Any) -> Path:
    """Where ``save`` puts an entry of ``target`` and ``kind`` for ``scenario``
    (a scenario or its ``to_dict()``): the name is the scenario's hash."""
    raw = scenario if isinstance(scenario, dict) else scenario.to_dict()
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()
    return Path(corpus) / target_dir(target) / f"{kind}-{digest[:12]}.json"


class FirstSight:
    """A failure saved the moment it is seen, before shrinking, so that a kill
    loses nothing; dropped once the shrunk entry is saved. Only a file it wrote
    itself is ever removed: an entry that was there before (a committed
    regression found again) stays."""

    def __init__(self, corpus: Path) -> None:
        self.corpus = Path(corpus)
        self.path: Path | None = None
        self._wrote = False

    def save(self, entry: Entry) -> Path:
        self._wrote = not path_of(self.corpus, entry.target, entry.kind, entry.scenario).exists()
        self.path = save(self.corpus, entry)
        return self.path

    def settle(self, final: Path | None) -> None:
        """The shrunk entry is ``final`` (None: none was saved, so keep this one)."""
        path, self.path = self.path, None
        if path is not None and final is not None and path != final and self._wrote:
            path.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(Path(path), json.dumps(data, indent=1) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda fh: fh.write(text.encode()))


def write_atomic(path: Path, fill: Callable[[BinaryIO], Any]) -> None:
    """Temporary file that ``fill`` writes, fsync, rename, fsync the directory:
    all or nothing on disk (reports, plots and corpus entries alike).

    The file gets the mode of any other new file (umask), not mkstemp's 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sweep(root: Path, older_than_s: float = STALE_TEMP_S) -> list[Path]:
    """Remove temporary files that killed writers left under ``root``; returns them.

    Names are ``.<file>.<random>.tmp`` (and ``.<file>.json.<random>`` from
    earlier versions).
    """
    removed: list[Path] = []
    root = Path(root)
    if not root.is_dir():
        return removed
    cutoff = time.time() - older_than_s
    for p in root.rglob(".*"):
        if not (p.name.endswith(".tmp") or ".json." in p.name):
            continue
        try:
            if p.is_file() and p.stat().st_mtime < cutoff:
                p.unlink()
                removed.append(p)
        except OSError:
            pass  # another sweeper got it, or it is not ours to remove
    return removed


def load(path: Path) -> Entry:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CorpusError(f"{path}: a corpus entry must be a JSON object")
    schema = data.get("schema")
    if schema != SCHEMA:
        if isinstance(schema, int) and schema > SCHEMA:
            raise CorpusError(f"{path}: schema {schema} is newer than this streamfuzz "
                              f"understands ({SCHEMA}); upgrade streamfuzz")
        raise CorpusError(f"{path}: missing or unknown schema {schema!r} (expected {SCHEMA})")
    for key, typ in (("target", str), ("kind", str), ("message", str), ("scenario", dict)):
        if not isinstance(data.get(key), typ):
            raise CorpusError(f"{path}: field {key!r} is missing or not a {typ.__name__}")
    if data["kind"] not in KINDS:
        raise CorpusError(f"{path}: unknown failure kind {data['kind']!r}")
    # Entries from before there were several protocols name none: the draft broadcast.
    name = data.get("protocol", protocols.DEFAULT)
    try:
        protocol = protocols.get(name) if isinstance(name, str) else None
    except protocols.ProtocolError as exc:
        raise CorpusError(f"{path}: {exc}") from None
    if protocol is None:
        raise CorpusError(f"{path}: field 'protocol' is not a str")
    try:
        scenario = protocol.part("scenario").from_dict(data["scenario"])
    except (ScenarioError, TypeError) as exc:
        raise CorpusError(f"{path}: bad scenario: {exc}") from None
    found_on = data.get("found_on") or {}
    if not isinstance(found_on, dict):
        raise CorpusError(f"{path}: field 'found_on' is not an object")
    _check_oracles(path, found_on)
    return Entry(target=data["target"], protocol=protocol.name, kind=data["kind"],
                 message=data["message"],
                 scenario=scenario, found_on=dict(found_on),
                 flaky=bool(data.get("flaky", False)), path=path)


def _check_oracles(path: Path, found_on: dict[str, Any]) -> None:
    """The oracles a replay judges with (an entry without any predates them):
    an empty list judged nothing, and a replay said the bug was gone."""
    if "oracles" not in found_on:
        return
    try:
        chosen = parse_oracles(found_on["oracles"])
    except (OptionsError, TypeError) as exc:
        raise CorpusError(f"{path}: found_on: {exc}") from None
    if not chosen:
        raise CorpusError(f"{path}: found_on names no oracle, so a replay would judge "
                          f"nothing; name those that found it ({', '.join(ORACLE_CHOICES)})")


def discover(paths: list[Path]) -> list[Path]:
    """Every ``*.json`` under the given files and directories, sorted."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.json") if not q.name.startswith("."))
        elif p.exists():
            found.append(p)
        else:
            raise CorpusError(f"{p}: no such file or directory")
    return found
