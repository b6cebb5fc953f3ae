"""What a target's name means: a built-in, ``module:attr``, a file, an upstream family, a mutant.

The grammar is shared by loading a target (``streamfuzz.fuzz.targets``), mutating one
(``streamfuzz.fuzz.targets.mutated``) and naming files after one (``streamfuzz.fuzz.corpus``). An
upstream family (``vllm-pp@0.32.0``) belongs to the protocol that lists it in
``Protocol.families``; that protocol's ``upstream`` part (a ``Family``) loads
it, so this module knows no protocol's code.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from streamfuzz.fuzz import ROOT
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.errors import BadInput

MAPPED = ("fuzz", "strategies")
"""The checkout's folders that are ``streamfuzz.fuzz`` and ``streamfuzz.strategies``."""

class TargetError(BadInput, ValueError):
    """A target spec that does not name a loadable factory."""


Factory = Callable[[Any], Any]
"""A target: ``factory(ctx) -> handler``; ``ctx`` is its protocol's context."""

UPSTREAM: dict[str, bool] = {"vllm-pp": False, "vllm-pp-pre-pr": True}
"""vLLM's ``PPHandler`` as shipped, and with the AST edit that gives the pre-PR code."""

WEIGHTS_FAMILY = "vllm-weights"
"""vLLM's packed NCCL weight broadcast (``streamfuzz.fuzz.weight_sync.vllm``), a
weight-sync target."""

UPSTREAM_FIXED = "vllm-pp@0.34.0"
"""vLLM's handler after the fix (gather on the main stream): where it is cached,
every entry found on vLLM's code must pass on it."""

SEP = "#"
"""Between a mutant's base target and its removed site (``main-gather#57:12``)."""


class Family(Protocol):
    """A protocol's loader of upstream code (``Protocol.upstream``), for each of
    its ``families`` at a version (None: the installed package)."""

    def code(self, family: str, version: str | None) -> Any | None:
        """The code record the target runs (a ``streamfuzz.fuzz.upstream.Upstream``): what a
        corpus entry's replay must match and what ``mutate`` edits; None where
        neither applies."""

    def factory(self, family: str, version: str | None) -> Factory: ...

    def provenance(self, family: str, version: str | None) -> dict[str, Any]:
        """What reports and corpus entries say about the code that runs."""

    def source(self, code: Any) -> tuple[str, ast.Module, str,
                                         Callable[[ast.Module, dict[str, Any], str], Factory]]:
        """What ``mutate`` edits in ``code``: (path shown, tree, the top-level name
        the target starts from, build an edited tree into a factory)."""


@dataclass(frozen=True)
class TargetName:
    """A target's name, parsed once: the one reading of the grammar above.

    ``base`` is the name without a mutant's ``#line:col`` (``site``); ``family``
    and ``version`` are set for a protocol's upstream family (``vllm-pp@0.32.0``;
    version None: the installed package); ``module`` and ``attr`` for a user's
    ``package.module:attr`` or ``path/to/file.py:attr``. A name that is none of
    these (a built-in, or a typo) has neither.
    """

    text: str
    base: str
    site: tuple[int, int] | None = None
    family: str | None = None
    version: str | None = None
    module: str | None = None
    attr: str | None = None

    @classmethod
    def parse(cls, text: str) -> TargetName:
        base, sep, key = text.rpartition(SEP)
        m = re.fullmatch(r"(\d+):(\d+)", key)
        if not sep or not base or m is None:
            base, site = text, None
        else:
            site = (int(m.group(1)), int(m.group(2)))
        family, _, version = base.partition("@")
        if any(family in p.families for p in protocols.all_protocols().values()):
            return cls(text, base, site, family=family, version=version or None)
        module, colon, attr = base.partition(":")
        if colon and base not in protocols.builtin_targets():
            return cls(text, base, site, module=module, attr=attr)
        return cls(text, base, site)

    @property
    def builtin(self) -> bool:
        return self.site is None and self.text in protocols.builtin_targets()


def split(name: str) -> tuple[str, int, int] | None:
    """``base#line:col`` -> ``(base, line, col)``; ``None`` for a plain target."""
    parsed = TargetName.parse(name)
    return None if parsed.site is None else (parsed.base, *parsed.site)


def file_name(target: str) -> str:
    """A file name for anything named after a target: ``pre-fix`` stays,
    ``pkg.mod:attr`` becomes ``pkg.mod-attr``, ``./file.py:attr`` ``file.py-attr``
    (never a hidden file)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", target).lstrip(".-") or "target"


def upstream_family(name: str) -> tuple[str, str | None] | None:
    """``vllm-pp@0.32.0`` -> (``vllm-pp``, ``0.32.0``); None outside the family."""
    parsed = TargetName.parse(name)
    return (parsed.family, parsed.version) if parsed.family in UPSTREAM else None


def family_of(name: str) -> tuple[Family, str, str | None] | None:
    """For ``family@VERSION`` of a protocol's families: its loader, the family and
    the version (None: the installed package); None for any other name."""
    parsed = TargetName.parse(name)
    if parsed.family is None:
        return None
    for p in protocols.all_protocols().values():
        if parsed.family in p.families and p.upstream:
            loader: Family = p.part("upstream")
            return loader, parsed.family, parsed.version
    return None


def upstream_of(name: str) -> Any:
    """The ``streamfuzz.fuzz.upstream.Upstream`` a family name runs (None for other targets);
    for a mutant of one (``streamfuzz.fuzz.targets.mutated``), the file it edits."""
    parts = split(name)
    found = family_of(parts[0] if parts else name)
    if found is None:
        return None
    loader, family, version = found
    with upstream_errors(name):
        return loader.code(family, version)


@contextlib.contextmanager
def upstream_errors(name: str) -> Iterator[None]:
    """Upstream code that cannot be found or read is a bad target: one line naming it."""
    from streamfuzz.fuzz import upstream

    try:
        yield
    except upstream.UpstreamError as exc:
        raise TargetError(f"target {name!r}: {exc}") from None


def resolve(name: str) -> str:
    """Built-in name or ``module:attr`` -> import spec; raises TargetError."""
    builtin = protocols.builtin_targets()
    if name in builtin:
        return builtin[name]
    if ":" not in name and name.endswith(".py"):
        raise TargetError(f"target {name!r} names a file, not the factory in it: write "
                          f"{name}:FACTORY (the function that makes the handler, e.g. "
                          f"{name}:make)")
    if TargetName.parse(name).module is None:
        known = ", ".join(sorted(builtin) + [f"{f}@VERSION" for p in
                                             protocols.all_protocols().values()
                                             for f in p.families])
        raise TargetError(f"unknown target {name!r}: use one of {known}, package.module:attr "
                          f"or path/to/file.py:attr")
    return name


def import_name(name: str, module_name: str) -> str:
    """What to import a target's module by: a dotted name as it is; for the path
    of a ``.py`` file, its own name, with its folder put first on ``sys.path``,
    as ``python file.py`` would run it: its imports of the files beside it work,
    and the ranks, given the same target, import the same module. A file
    inside a package (folders with an ``__init__.py``) is imported as part of
    it, by its dotted name from the folder above the outermost one, as
    ``python -m`` would: its relative imports work too. A file of this project's
    ``fuzz/`` or ``strategies/`` in a checkout is named as installed
    (``streamfuzz.fuzz...``), its only name.
    """
    if not module_name.endswith(".py"):
        return module_name
    path = Path(module_name).resolve()
    if not path.is_file():
        raise TargetError(f"target {name!r}: no such file {module_name!r}")
    if not path.stem.isidentifier():
        raise TargetError(f"target {name!r}: {path.name!r} cannot be imported by its name; "
                          f"rename it to a valid Python module name")
    root, parts = path.parent, [path.stem]
    while (root / "__init__.py").is_file() and root.name.isidentifier():
        parts.insert(0, root.name)
        root = root.parent
    if str(root) == ROOT and parts[0] in MAPPED:
        parts.insert(0, "streamfuzz")
    dotted = ".".join(parts)
    top = sys.modules.get(parts[0])
    if len(parts) > 1 and top is not None and str(root / parts[0]) not in {
            str(Path(p).resolve()) for p in getattr(top, "__path__", ())}:
        raise TargetError(f"target {name!r}: {path.name!r} is in package {parts[0]!r}, but "
                          f"a package of that name is already imported from "
                          f"{getattr(top, '__file__', None) or 'elsewhere'}")
    known = sys.modules.get(dotted)
    known_file = getattr(known, "__file__", None)
    if known is not None and (known_file is None or Path(known_file).resolve() != path):
        raise TargetError(f"target {name!r}: a module named {dotted!r} is already imported "
                          f"from {known_file or 'elsewhere'}; rename {path.name!r}")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return dotted
