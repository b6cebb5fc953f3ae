"""The regression corpus: one JSON file per shrunk failure, libFuzzer style.

A file holds the scenario as plain values, so it replays after the strategies
change or Hypothesis is upgraded. Files are written atomically (temporary file,
fsync, rename): an interrupted run never leaves half an entry behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz.scenario import Scenario, ScenarioError
from fuzz.verdict import KINDS

SCHEMA = 1


class CorpusError(ValueError):
    """A corpus file that cannot be used; the message names the file."""


@dataclass(frozen=True)
class Entry:
    target: str
    kind: str
    message: str
    scenario: Scenario
    found_on: dict[str, Any] = field(default_factory=dict)
    flaky: bool = False
    path: Path | None = None

    @property
    def device(self) -> str:
        return str(self.found_on.get("device", "cpu"))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "target": self.target, "kind": self.kind,
                "message": self.message, "flaky": self.flaky, "found_on": self.found_on,
                "scenario": self.scenario.to_dict()}


def target_dir(target: str) -> str:
    """``pre-fix`` stays; ``pkg.mod:attr`` becomes ``pkg.mod-attr``."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", target)


def save(corpus: Path, entry: Entry) -> Path:
    """Write ``entry`` under ``corpus/<target>/``; the name is its content hash."""
    data = entry.to_dict()
    digest = hashlib.sha256(json.dumps(data["scenario"], sort_keys=True).encode()).hexdigest()
    directory = Path(corpus) / target_dir(entry.target)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{entry.kind}-{digest[:12]}.json"
    write_json_atomic(path, data)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(Path(path), json.dumps(data, indent=1) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Temporary file, fsync, rename, fsync the directory: all or nothing on disk."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
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
    try:
        scenario = Scenario.from_dict(data["scenario"])
    except (ScenarioError, TypeError) as exc:
        raise CorpusError(f"{path}: bad scenario: {exc}") from None
    return Entry(target=data["target"], kind=data["kind"], message=data["message"],
                 scenario=scenario, found_on=dict(data.get("found_on") or {}),
                 flaky=bool(data.get("flaky", False)), path=path)


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
