"""Target names: which factory a name loads, and what reports say about it.

A target is a callable ``factory(ctx) -> handler``; what ``ctx`` holds and
which handler methods are called is its protocol's (``streamfuzz.draft``,
``streamfuzz.weight_sync``). Built-in targets are named by their protocols
(``streamfuzz.fuzz.protocol.builtin_targets``); a user's target is ``package.module:attr``
or ``path/to/file.py:attr``; upstream code is a family with a version
(``vllm-pp@0.32.0``), loaded by the protocol that drives it
(``streamfuzz.fuzz.targets.names.family_of``). What a name means is
``streamfuzz.fuzz.targets.names``.

``TargetContext`` and ``Batch`` are the draft broadcast's, kept here by name for
one release (deprecated: ``streamfuzz.draft``).
"""

from __future__ import annotations

import importlib
import traceback
import warnings
from typing import Any

from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.messages import Target
from streamfuzz.fuzz.targets.names import (
    MAPPED,
    UPSTREAM,
    UPSTREAM_FIXED,
    WEIGHTS_FAMILY,
    Factory,
    TargetError,
    TargetName,
    family_of,
    import_name,
    resolve,
    split,
    upstream_errors,
    upstream_family,
    upstream_of,
)

__all__ = ["UPSTREAM", "UPSTREAM_FIXED", "WEIGHTS_FAMILY", "Factory", "Target", "TargetError",
           "TargetName", "check_importable", "check_upstream", "family_of", "import_name",
           "is_builtin", "load", "misused", "protocol_of", "provenance", "resolve",
           "resolve_target", "upstream_family", "upstream_of"]

_COMPAT = {"TargetContext": "streamfuzz.fuzz.draft.context:TargetContext",
           "Batch": "streamfuzz.fuzz.draft.context:Batch"}
"""Names this module had when it was the draft broadcast's target API:
deprecated for ``streamfuzz.draft``'s, removed in the next release."""


def _tables() -> dict[str, Any]:
    every = protocols.all_protocols().values()
    versions = {n: s for p in every for n, s in p.versions.items()}
    mutants = {n: s for p in every for n, s in p.mutants.items()}
    return {
        # Every protocol's versions: what ``run`` fuzzes by default.
        "VERSIONS": versions,
        # Every protocol's planted bugs: each must be found on CPU.
        "MUTANTS": mutants,
        # Correct variants of a protocol's correct version; run only when named.
        "VARIANTS": {n: s for p in every for n, s in p.variants.items()},
        # Every protocol's built-in targets (the default of matrix, bench and soak).
        "BUILTIN": {**versions, **mutants},
        # The built-in targets that must be clean: each correct version and its variants.
        "CORRECT": frozenset(n for p in every for n in (p.correct, *p.variants)),
    }


def __getattr__(name: str) -> Any:
    """The tables of built-in names, read from the registry at each use (a
    protocol added through ``STREAMFUZZ_PROTOCOLS`` is in them), and the
    draft broadcast's context types under their old names."""
    if name in _COMPAT:
        module, _, attr = _COMPAT[name].partition(":")
        new = "DraftContext" if attr == "TargetContext" else attr
        warnings.warn(f"{__name__}.{name} is deprecated: use `from streamfuzz.draft import "
                      f"{new}`", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), attr)
    tables = _tables()
    if name in tables:
        return tables[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_builtin(name: str) -> bool:
    return name in protocols.builtin_targets()


def provenance(name: str) -> dict[str, Any] | None:
    """What reports and corpus entries say about the upstream code a target runs."""
    parts = split(name)
    found = family_of(parts[0] if parts else name)
    if found is None:
        return None
    loader, family, version = found
    with upstream_errors(name):
        info = loader.provenance(family, version)
    if parts:
        info["mutant"] = f"the sync call at line {parts[1]}, col {parts[2]} removed"
    return info


def check_upstream(name: str, recorded: dict[str, Any] | None) -> None:
    """A corpus entry replays on the same upstream code it was found on, or not at all."""
    up = upstream_of(name)
    if up is None or not recorded:
        return
    if (recorded.get("sha256"), recorded.get("edit")) != (up.sha256, up.edit):
        from streamfuzz.fuzz import upstream

        raise TargetError(
            f"target {name!r} was found on {upstream.FILE} sha256 {recorded.get('sha256')} "
            f"but vLLM {up.version} here ({up.kind}) has {up.sha256}: "
            f"{upstream.fetch_hint(up.version)}")


def _import(dotted: str) -> Any:
    """``dotted`` imported; a name of this project's own modules as they were
    before the package owned one import name (``fuzz.x``, ``strategies.x``, as
    older corpus entries and scripts give them) is tried as ``streamfuzz.x``
    when nothing else answers to it."""
    try:
        return importlib.import_module(dotted)
    except ImportError as exc:
        head = dotted.partition(".")[0]
        if head not in MAPPED or exc.name != head:
            raise
        try:
            return importlib.import_module(f"streamfuzz.{dotted}")
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"No module named {dotted!r}", name=dotted) from None


def load(name: str) -> Factory:
    """Import a target factory by built-in name, ``vllm-pp@VERSION``, ``module:attr``
    or mutant name (``target#line:col``, see ``streamfuzz.fuzz.targets.mutated``)."""
    parsed = TargetName.parse(name)
    if parsed.site is not None:
        from streamfuzz.fuzz.targets import mutated

        return mutated.load(name)
    found = family_of(name) if parsed.family is not None else None
    if found is not None:
        loader, family, version = found
        with upstream_errors(name):
            return loader.factory(family, version)
    module_name, _, attr = (f"{parsed.module}:{parsed.attr}" if parsed.module is not None
                            else resolve(name)).partition(":")
    importable = import_name(name, module_name)
    try:
        module = _import(importable)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (importable + ".").startswith(exc.name + "."):
            raise TargetError(f"target {name!r}: cannot import {module_name!r} ({exc})") from None
        raise TargetError(_import_failure(name, module_name, exc)) from None
    except Exception as exc:  # the module itself is broken: say where
        raise TargetError(_import_failure(name, module_name, exc)) from None
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise TargetError(f"target {name!r}: {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise TargetError(f"target {name!r}: {attr!r} is not callable")
    return factory


def _import_failure(name: str, module_name: str, exc: BaseException) -> str:
    """One line: the module, and the file and line where importing it failed.

    For a syntax error that is the offending line; otherwise the innermost
    frame of the traceback that is not the import machinery.
    """
    where = "?"
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<frozen ")]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    what = (exc.msg if isinstance(exc, SyntaxError) else str(exc)).splitlines()
    return (f"target {name!r}: importing {module_name!r} failed at {where}: "
            f"{type(exc).__name__}: {what[0] if what else ''}")


def misused(name: str, exc: Exception) -> TargetError:
    """A protocol's complaint about target ``name`` (its runners do not know
    the name), as the one line the user sees, in the driver or from a rank."""
    return TargetError(f"target {name!r}: {exc}")


def resolve_target(name: str | Target) -> Target:
    """Target ``name`` resolved once, in the driver: the one place its protocol
    is decided. A built-in's and an upstream family's protocol is the one that
    lists it, a mutant's its base target's, and a user's factory's the one it
    declares (its ``protocol`` attribute; else the draft broadcast's). A user's
    target that cannot be imported fails here (TargetError); a built-in's or a
    family's name is not imported (``check_importable`` looks for its code)."""
    if isinstance(name, Target):
        return name
    parsed = TargetName.parse(name)
    builtin = protocols.builtin_targets()
    for p in protocols.all_protocols().values():
        if parsed.base in p.targets or parsed.family in p.families:
            return Target(name, p.name, spec=builtin.get(parsed.base), family=parsed.family,
                          version=parsed.version)
    factory = load(name)
    protocol = protocols.of_factory(factory)
    if isinstance(factory, type):  # the handler's class itself: its methods are known now
        try:
            protocols.check_handler(protocol, factory)
        except protocols.ProtocolError as exc:
            raise misused(name, exc) from None
    return Target(name, protocol.name, spec=parsed.base if parsed.module else None)


def protocol_of(target: str | Target) -> protocols.Protocol:
    """The protocol ``target`` speaks (resolving a name: see ``resolve_target``)."""
    return protocols.get(resolve_target(target).protocol)


def check_importable(name: str) -> Target:
    """Target ``name`` resolved, failing early, in the driver, where it cannot
    be imported: before any rank starts.

    Built-in names are modules of this package, importable wherever it is:
    importing one would only load torch into the driver, which never uses it
    (a second or more of every start). A family's code and a mutant's site
    are looked for now."""
    target = resolve_target(name)
    parsed = TargetName.parse(name)
    if parsed.module is None and not parsed.builtin:
        load(name)
    return target
