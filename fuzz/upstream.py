"""vLLM's own ``PPHandler`` as a target: find the file, name it, derive the pre-PR code.

The file (``vllm/v1/worker/gpu/pp_utils.py``) is read from a wheel, an sdist, a
source tree or an installed ``vllm``, and compiled unchanged, so what is fuzzed
is what vLLM ships. The pre-PR code of the draft broadcast was never released:
it is derived at load time from a 0.30-0.32 file by removing the one
``idx_mapping.record_stream(...)`` call in ``PPHandler.broadcast_drafts`` (an
AST edit; every report names it). Nothing of vLLM's other code is loaded: its
imports get the stand-ins of the protocol that drives it (``Upstream.imports``,
set by its family loader: ``streamfuzz.fuzz.draft.vllm``).

A version is looked up, in order, in the paths of ``STREAMFUZZ_UPSTREAM``
(what ``--upstream`` sets for the ranks), the cache (``cache_dir()``) and an
installed ``vllm``. ``python -m streamfuzz.vllm fetch 0.32.0`` fills the cache.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import linecache
import os
import re
import subprocess
import sys
import tarfile
import types
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import env
from streamfuzz.fuzz.errors import BadInput

FILE = "vllm/v1/worker/gpu/pp_utils.py"
"""Where ``PPHandler`` lives in every supported release."""

ENV_PATHS = env.UPSTREAM
"""Wheels, sdists or trees the ranks look in first (``os.pathsep``-separated)."""

KNOWN: dict[str, tuple[str, ...]] = {
    "dadeef0bebf61d0ad44a28d06372208ec4e6389224d6017f412683b026bdbb5c": ("0.30.0",),
    "c3e1054575c3427e232c9d3253763fb1d0a28edef88f8b32d2f168a83d4b5705": ("0.31.0", "0.32.0"),
    "cad8abbdfa94d52d541adb39c0f06b5d24f8d4f31c5953efb2376c4ca17bd4c7": ("0.33.0", "0.34.0"),
}
"""sha256 of the released file -> the releases that ship it (checked by hand)."""

APIS: dict[str, dict[str, tuple[str, ...]]] = {
    # The handler gathers the drafts itself, from the table, on its side stream.
    "table": {"__init__": ("max_num_reqs", "num_speculative_steps", "device"),
              "broadcast": ("sampled_token_ids", "num_sampled", "num_rejected", "input_batch"),
              "broadcast_drafts": ("draft_tokens", "input_batch"),
              "receive": ("input_batch",),
              "get_prev_sampled_outputs": ("draft_tokens_to_update",)},
    # The runner gathers on the main stream and passes the rows.
    "gathered": {"__init__": ("max_num_reqs", "num_speculative_steps", "device"),
                 "broadcast": ("sampled_token_ids", "num_sampled", "num_rejected",
                               "input_batch"),
                 "broadcast_drafts": ("draft_tokens",),
                 "receive": ("input_batch", "recv_drafts"),
                 "get_prev_sampled_outputs": ()},
}
"""The ``PPHandler`` method signatures the runner model knows how to drive."""

SUPPORTED_VERSIONS = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
"""The releases whose PPHandler the runner model drives: the only ones ``fetch``
downloads (another release's source can still be given by path, and is read)."""

SUPPORTED = ("0.30.0, 0.31.0, 0.32.0 (broadcast_drafts(draft_tokens, input_batch)); "
             "0.33.0, 0.34.0 (broadcast_drafts(draft_tokens))")
"""Said in every error about an unusable vLLM."""

PRE_PR_EDIT = "remove idx_mapping.record_stream(...) from PPHandler.broadcast_drafts"


class UpstreamError(BadInput, ValueError):
    """An upstream source that cannot be fuzzed; the message is one line."""


@dataclass(frozen=True)
class Upstream:
    """One ``pp_utils.py`` as read (and, for the pre-PR code, as edited)."""

    version: str
    kind: str  # wheel, sdist, tree or installed
    path: str  # where it was read; never written into a report or the corpus
    text: str
    sha256: str
    api: str
    edit: str | None = None  # what the AST edit removed, or None: byte-identical
    imports: Callable[[], dict[str, Any]] | None = field(default=None, compare=False, repr=False)
    """The builtins the code runs with, whose ``__import__`` answers its vLLM
    imports: the driving protocol's stand-ins (None: Python's own)."""

    def provenance(self) -> dict[str, Any]:
        """What reports and corpus entries say about the code that ran."""
        info: dict[str, Any] = {"project": "vllm", "version": self.version, "file": FILE,
                                "sha256": self.sha256, "api": self.api, "from": self.kind,
                                "edit": self.edit}
        return info

    def describe(self) -> str:
        how = f"AST edit: {self.edit}" if self.edit else "byte-identical"
        return f"vLLM {self.version} {FILE} (sha256 {self.sha256[:16]}, {self.kind}), {how}"


def cache_dir() -> Path:
    """Where fetched wheels live: ``$STREAMFUZZ_VLLM_CACHE``, else
    ``${XDG_CACHE_HOME:-~/.cache}/streamfuzz/vllm``."""
    explicit = env.text(env.VLLM_CACHE)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "streamfuzz" / "vllm"


def fetch_hint(version: str) -> str:
    return (f"fetch it with `python -m streamfuzz.vllm fetch {version}` (pip download "
            f"vllm=={version} --no-deps into {cache_dir()}) or pass --upstream PATH")


# -- reading a source ----------------------------------------------------------

@functools.lru_cache(maxsize=16)
def read(source: str) -> Upstream:
    """The file from a wheel, sdist or tree at ``source``; raises UpstreamError."""
    path = Path(source).expanduser()
    if not path.exists():
        raise UpstreamError(f"{source}: no such file or directory (a vLLM wheel, sdist or "
                            f"source tree; supported versions: {SUPPORTED})")
    if path.is_dir():
        text, version, kind = _from_tree(path)
    elif zipfile.is_zipfile(path):
        text, version, kind = _from_wheel(path)
    elif tarfile.is_tarfile(path):
        text, version, kind = _from_sdist(path)
    else:
        raise UpstreamError(f"{source}: not a wheel, an sdist or a directory")
    return _checked(text, version, kind, str(path.resolve()))


def installed() -> Upstream | None:
    """The installed ``vllm``'s file, found without importing vllm; None if absent."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))).parent
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = _tree_version(root)
    text = _tree_text(root, "installed vllm")
    return _checked(text, version, "installed", str(root))


def find(version: str) -> Upstream:
    """vLLM ``version``: the ``--upstream`` paths, the cache, then an installed vllm."""
    for entry in env.items(ENV_PATHS, os.pathsep):
        up = read(entry)
        if up.version == version:
            return up
    cache = cache_dir()
    if cache.is_dir():
        for candidate in sorted(cache.glob(f"vllm-{version}-*.whl")) + sorted(
                cache.glob(f"vllm-{version}.tar.gz")):
            return read(str(candidate))
    here = installed()
    if here is not None and here.version == version:
        return here
    if version not in SUPPORTED_VERSIONS:
        raise _unsupported(version)
    raise UpstreamError(f"vLLM {version} is not here: {fetch_hint(version)}; "
                        f"supported versions: {SUPPORTED}")


def _unsupported(version: str) -> UpstreamError:
    return UpstreamError(f"vLLM {version} is not a supported version, so it is not fetched: "
                         f"supported versions: {SUPPORTED} (another release's wheel or "
                         "source can still be given by path to --upstream)")


def resolve(source: str | None) -> Upstream:
    """``--upstream``'s value (a path, or a version to look up), or the installed vllm."""
    if source is None:
        up = installed()
        if up is None:
            raise UpstreamError("no vllm is installed: pass --upstream PATH (a wheel, sdist or "
                                f"source tree) or a cached version; supported: {SUPPORTED}")
        return up
    if _looks_like_version(source) and not Path(source).exists():
        return find(source)
    return read(source)


def read_file(up: Upstream, file: str) -> str:
    """Another file of the vLLM source ``up`` was read from, unchanged (another
    protocol's code: ``vllm/distributed/weight_transfer/packed_tensor.py``)."""
    path = Path(up.path)
    text: str | None = None
    if up.kind == "wheel":
        with zipfile.ZipFile(path) as zf:
            if file in zf.namelist():
                text = zf.read(file).decode()
    elif up.kind == "sdist":
        with tarfile.open(path) as tf:
            member = next((m for m in tf.getmembers()
                           if m.isfile() and m.name.split("/", 1)[-1] == file), None)
            if member is not None:
                text = _member_text(tf, member)
    else:
        found = next((c for c in (path / file, path.parent / file) if c.is_file()), None)
        text = found.read_text() if found is not None else None
    if text is None:
        raise UpstreamError(f"{up.path}: vLLM {up.version} has no {file}")
    return text


def _looks_like_version(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)+([.+-]?[A-Za-z0-9.+-]*)?", text) is not None


def _missing(where: str, version: str) -> UpstreamError:
    return UpstreamError(f"{where}: vLLM {version} has no {FILE} (no PPHandler to fuzz); "
                         f"supported versions: {SUPPORTED}")


def _from_wheel(path: Path) -> tuple[str, str, str]:
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = [n for n in names if re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", n)]
        version = _metadata_version(zf.read(meta[0]).decode()) if meta else None
        version = version or _name_version(path.name)
        if FILE not in names:
            raise _missing(str(path), version)
        return zf.read(FILE).decode(), version, "wheel"


def _from_sdist(path: Path) -> tuple[str, str, str]:
    with tarfile.open(path) as tf:
        members = {m.name: m for m in tf.getmembers() if m.isfile()}
        tops = {n.split("/", 1)[0] for n in members}
        top = next(iter(tops)) if len(tops) == 1 else ""
        info = members.get(f"{top}/PKG-INFO")
        version = _metadata_version(_member_text(tf, info)) if info else None
        version = version or _name_version(path.name)
        member = members.get(f"{top}/{FILE}")
        if member is None:
            raise _missing(str(path), version)
        return _member_text(tf, member), version, "sdist"


def _member_text(tf: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """A regular file's text (``extractfile`` is None only for other members)."""
    f = tf.extractfile(member)
    assert f is not None, member.name
    return f.read().decode()


def _from_tree(path: Path) -> tuple[str, str, str]:
    root = path.parent if (path / "v1" / "worker").is_dir() and path.name == "vllm" else path
    version = _tree_version(root)
    return _tree_text(root, str(path), version), version, "tree"


def _tree_text(root: Path, where: str, version: str = "?") -> str:
    file = root / FILE
    if not file.is_file():
        raise _missing(where, version)
    return file.read_text()


def _tree_version(root: Path) -> str:
    """PKG-INFO, else the generated ``vllm/_version.py``, else ``unknown``."""
    pkg = root / "PKG-INFO"
    if pkg.is_file():
        version = _metadata_version(pkg.read_text())
        if version:
            return version
    generated = root / "vllm" / "_version.py"
    if generated.is_file():
        m = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                      generated.read_text(), re.M)
        if m:
            return m.group(1)
    return "unknown"


def _metadata_version(text: str) -> str | None:
    m = re.search(r"^Version:\s*(\S+)", text, re.M)
    return m.group(1) if m else None


def _name_version(name: str) -> str:
    m = re.match(r"vllm-(\d[^-]*?)(?:-|\.tar\.gz$)", name)
    return m.group(1) if m else "unknown"


def _checked(text: str, version: str, kind: str, where: str) -> Upstream:
    digest = hashlib.sha256(text.encode()).hexdigest()
    if version == "unknown":
        version = f"unknown+{digest[:12]}"
    api = _api(text, version, where)
    return Upstream(version=version, kind=kind, path=where, text=text, sha256=digest, api=api)


def _api(text: str, version: str, where: str) -> str:
    """Which known ``PPHandler`` API the file has, read from its AST (nothing runs)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise UpstreamError(f"{where}: vLLM {version}'s {FILE} does not parse ({exc.msg}, "
                            f"line {exc.lineno})") from None
    cls = _class(tree)
    if cls is None:
        raise UpstreamError(f"{where}: vLLM {version}'s {FILE} has no class PPHandler; "
                            f"supported versions: {SUPPORTED}")
    have = {f.name: tuple(a.arg for a in f.args.args[1:] + f.args.kwonlyargs)
            for f in cls.body if isinstance(f, ast.FunctionDef)}
    for name, methods in APIS.items():
        if all(have.get(m) == args for m, args in methods.items()):
            return name
    shown = ", ".join(f"{m}({', '.join(have[m])})" for m in APIS["table"] if m in have)
    raise UpstreamError(f"{where}: vLLM {version}'s PPHandler has an API the runner model does "
                        f"not know ({shown or 'none of its methods'}); supported versions: "
                        f"{SUPPORTED}")


def _class(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PPHandler"),
                None)


# -- the pre-PR code -------------------------------------------------------------

def pre_pr(up: Upstream) -> Upstream:
    """``up`` with its one ``idx_mapping.record_stream`` call marked for removal."""
    tree, removed = _pre_pr_tree(up)
    del tree
    return replace(up, edit=removed)


def _pre_pr_tree(up: Upstream) -> tuple[ast.Module, str]:
    tree = ast.parse(up.text)
    cls = _class(tree)
    method = next((f for f in (cls.body if cls else ()) if isinstance(f, ast.FunctionDef)
                   and f.name == "broadcast_drafts"), None)
    hits: list[tuple[list[ast.stmt], ast.stmt]] = []
    for node in ast.walk(method) if method is not None else ():
        for body in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(body, list):
                continue
            for stmt in body:
                if _records_idx_mapping(stmt):
                    hits.append((body, stmt))
    if len(hits) != 1:
        raise UpstreamError(
            f"{up.path}: vLLM {up.version}'s PPHandler.broadcast_drafts has {len(hits)} "
            f"idx_mapping.record_stream calls, not one: the pre-PR code derives only from "
            f"0.30.0, 0.31.0 or 0.32.0 (0.33+ gathers on the main stream)")
    body, stmt = hits[0]
    body.remove(stmt)
    if not body:
        body.append(ast.copy_location(ast.Pass(), stmt))
    segment = ast.get_source_segment(up.text, stmt) or "idx_mapping.record_stream(...)"
    return tree, f"removed `{segment.strip()}` (line {stmt.lineno}) from PPHandler.broadcast_drafts"


def _records_idx_mapping(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    return (isinstance(func, ast.Attribute) and func.attr == "record_stream"
            and isinstance(func.value, ast.Attribute) and func.value.attr == "idx_mapping")


# -- running it ------------------------------------------------------------------

def filename(up: Upstream) -> str:
    """The file name frames of ``up``'s code show: ``vllm-<version>/vllm/v1/...``."""
    return f"vllm-{up.version}" + ("+pre-pr" if up.edit else "") + f"/{FILE}"


def tree(up: Upstream) -> ast.Module:
    """The code ``module(up)`` runs, as an AST (with the pre-PR edit, if any)."""
    return _pre_pr_tree(up)[0] if up.edit else ast.parse(up.text)


@functools.lru_cache(maxsize=8)
def module(up: Upstream) -> types.ModuleType:
    """The file executed as a module whose vLLM imports are the stand-ins.

    Frames of the code show as ``vllm-<version>/vllm/v1/...`` in reports, with the
    file's own line numbers (the AST edit keeps them).
    """
    return edited_module(up, tree(up) if up.edit else None)


def edited_module(up: Upstream, edited: ast.Module | None, suffix: str = "",
                  extra: dict[str, Any] | None = None) -> types.ModuleType:
    """``up``'s code, or the ``edited`` tree of it (same lines, same file name: a
    ``mutate`` mutant), executed with ``extra`` names in its namespace."""
    name_of_file = filename(up)
    if edited is not None:
        code = compile(edited, name_of_file, "exec", dont_inherit=True)
    else:
        code = compile(up.text, name_of_file, "exec", dont_inherit=True)
    lines = up.text.splitlines(keepends=True)
    linecache.cache[name_of_file] = (len(up.text), None, lines, name_of_file)
    name = "_streamfuzz_upstream." + re.sub(r"\W", "_", name_of_file.split("/")[0] + suffix)
    mod = types.ModuleType(name)
    mod.__file__ = name_of_file
    if up.imports is not None:
        mod.__dict__["__builtins__"] = up.imports()
    mod.__dict__.update(extra or {})
    sys.modules[name] = mod  # dataclasses look their module up while the class is made
    exec(code, mod.__dict__)
    return mod


def fetch(version: str) -> Path:
    """The cached wheel of ``version``, downloaded without dependencies if absent."""
    cache = cache_dir()
    found = sorted(cache.glob(f"vllm-{version}-*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    if version not in SUPPORTED_VERSIONS:
        raise _unsupported(version)  # before a download of hundreds of MB
    cache.mkdir(parents=True, exist_ok=True)
    print(f"fetching the vLLM {version} wheel (no dependencies) into {cache}...",
          file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
           "--only-binary", ":all:", "-d", str(cache), "-q"]
    if subprocess.run(cmd).returncode != 0:
        raise UpstreamError(f"pip download vllm=={version} failed (see above); "
                            f"supported versions: {SUPPORTED}")
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise UpstreamError(f"pip download vllm=={version} left no wheel in {cache}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    """``python -m streamfuzz.vllm fetch VERSION...``: fill the cache, print the paths."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "fetch":
        print("usage: python -m streamfuzz.vllm fetch VERSION...", file=sys.stderr)
        return 2
    try:
        for version in args[1:]:
            path = fetch(version)
            print(f"{path}: {read(str(path)).describe()}")
    except UpstreamError as exc:
        print(f"streamfuzz: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
