"""What ``fuzz scan`` reads: the Python files of a tree, a wheel, an sdist or an
installed package, as text, never imported.

``open_source`` checks its argument at once (the path exists, the archive
opens, the package is installed) so that bad input fails in one line before
any file is parsed. Files come in sorted path order, so two scans of the same
input see the same files in the same order.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from streamfuzz.fuzz.errors import BadInput

_SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".tox", ".venv", "venv", "__pycache__",
                        "node_modules", "build", "dist", ".eggs", "site-packages"})
_SDIST = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")


class ScanInputError(BadInput, ValueError):
    """A scan input that cannot be read; the message is one line."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative, '/'-separated: how findings name the file
    text: str


@dataclass(frozen=True)
class Source:
    """One input: where it is, what it is, and how to list its Python files."""

    spec: str
    kind: str  # tree | wheel | sdist | installed | file
    root: Path
    name: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}".strip() if self.version else self.name

    def files(self) -> Iterator[SourceFile]:
        if self.kind in ("tree", "installed"):
            yield from _tree_files(self.root)
        elif self.kind == "file":
            yield SourceFile(self.root.name, _decode(self.root.read_bytes()))
        elif self.kind == "wheel":
            yield from _zip_files(self.root, strip_top=False)
        elif self.root.name.endswith(".zip"):
            yield from _zip_files(self.root, strip_top=True)
        else:
            yield from _tar_files(self.root)


def open_source(spec: str) -> Source:
    """The input ``spec`` names, checked; raises ``ScanInputError``."""
    path = Path(spec)
    if path.exists():
        return _from_path(path, spec)
    if _looks_like_path(spec):
        raise ScanInputError(f"{spec}: no such file or directory")
    return _installed(spec)


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or "\\" in spec or spec.endswith((".py", ".whl", ".zip") + _SDIST)


def _from_path(path: Path, spec: str) -> Source:
    name = path.name
    if path.is_dir():
        return Source(spec, "tree", path, name, "")
    if name.endswith(".py"):
        return Source(spec, "file", path, name, "")
    if name.endswith(".whl"):
        _check_zip(path, "wheel")
        dist, version = _dist_version(name[:-4])
        return Source(spec, "wheel", path, dist, version)
    if name.endswith(".zip"):
        _check_zip(path, "sdist")
        dist, version = _dist_version(name[:-4])
        return Source(spec, "sdist", path, dist, version)
    if name.endswith(_SDIST):
        try:
            with tarfile.open(path) as tf:
                tf.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            why = str(exc).splitlines()[0].rstrip(":")
            raise ScanInputError(f"{spec}: not a readable sdist ({why})") from None
        stem = next(name[:-len(s)] for s in _SDIST if name.endswith(s))
        dist, version = _dist_version(stem)
        return Source(spec, "sdist", path, dist, version)
    raise ScanInputError(f"{spec}: not a directory, .py file, wheel (.whl) or sdist "
                         "(.tar.gz, .zip)")


def _check_zip(path: Path, what: str) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ScanInputError(f"{path}: not a readable {what} ({why})") from None


def _dist_version(stem: str) -> tuple[str, str]:
    """``vllm-0.34.0-cp38-abi3-...`` or ``deepspeed-0.19.8`` -> (name, version)."""
    m = re.match(r"(.+?)-(\d[^-]*)", stem)
    return (m.group(1), m.group(2)) if m else (stem, "")


def _installed(name: str) -> Source:
    module = name.replace("-", "_")
    try:
        spec = importlib.util.find_spec(module)  # a top-level name: nothing is executed
    except (ImportError, ValueError):
        spec = None
    if spec is None or not (spec.submodule_search_locations or spec.origin):
        raise ScanInputError(f"{name}: no such path, and no installed package of that name")
    if spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        kind = "installed"
    else:
        assert spec.origin is not None  # one of the two, checked above
        root, kind = Path(spec.origin), "file"
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = ""
    return Source(name, kind, root, name, version)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _tree_files(root: Path) -> Iterator[SourceFile]:
    base = root.parent if (root / "__init__.py").exists() else root
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        found.append(path)
    for path in sorted(found):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        yield SourceFile(path.relative_to(base).as_posix(), _decode(data))


def _zip_files(path: Path, strip_top: bool) -> Iterator[SourceFile]:
    with zipfile.ZipFile(path) as zf:
        names = sorted(n for n in zf.namelist() if n.endswith(".py"))
        for n in names:
            rel = n.split("/", 1)[1] if strip_top and "/" in n else n
            yield SourceFile(_strip_src(rel), _decode(zf.read(n)))


def _tar_files(path: Path) -> Iterator[SourceFile]:
    with tarfile.open(path) as tf:
        members = sorted((m for m in tf.getmembers() if m.isfile() and m.name.endswith(".py")),
                         key=lambda m: m.name)
        for m in members:
            f = tf.extractfile(m)
            if f is None:
                continue
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            yield SourceFile(_strip_src(rel), _decode(f.read()))


def _strip_src(rel: str) -> str:
    """An sdist's ``src/pkg/mod.py`` is ``pkg/mod.py``, as installed."""
    return rel[4:] if rel.startswith("src/") else rel
