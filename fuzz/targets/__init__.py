"""Target names: which factory a name loads, and what reports say about it.

A target is a callable ``factory(ctx) -> handler``; what ``ctx`` holds and
which handler methods are called is its protocol's (``fuzz.draft.context``,
``fuzz.weight_sync.context``). Built-in targets are named by their protocols
(``fuzz.protocol.builtin_targets``); a user's target is ``package.module:attr``
or ``path/to/file.py:attr``; upstream code is a family with a version
(``vllm-pp@0.32.0``: ``fuzz.upstream`` finds that version).

``TargetContext`` and ``Batch`` are the draft broadcast's, kept here by name.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fuzz import protocol as protocols
from fuzz.errors import BadInput

_COMPAT = {"TargetContext": "fuzz.draft.context:TargetContext",
           "Batch": "fuzz.draft.context:Batch"}
"""Names this module had when it was the draft broadcast's target API."""


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
        return getattr(importlib.import_module(module), attr)
    tables = _tables()
    if name in tables:
        return tables[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_builtin(name: str) -> bool:
    return name in protocols.builtin_targets()


UPSTREAM: dict[str, bool] = {"vllm-pp": False, "vllm-pp-pre-pr": True}
"""vLLM's ``PPHandler`` as shipped, and with the AST edit that gives the pre-PR code."""

WEIGHTS_FAMILY = "vllm-weights"
"""vLLM's packed NCCL weight broadcast (``fuzz.weight_sync.vllm_weights``), a weight-sync target."""

UPSTREAM_FIXED = "vllm-pp@0.34.0"
"""vLLM's handler after the fix (gather on the main stream): where it is cached,
every entry found on vLLM's code must pass on it."""


class TargetError(BadInput, ValueError):
    """A target spec that does not name a loadable factory."""


Factory = Callable[[Any], Any]
"""A target: ``factory(ctx) -> handler``; ``ctx`` is its protocol's context."""


def upstream_family(name: str) -> tuple[str, str | None] | None:
    """``vllm-pp@0.32.0`` -> (``vllm-pp``, ``0.32.0``); None outside the family."""
    family, _, version = name.partition("@")
    return (family, version or None) if family in UPSTREAM else None


def upstream_of(name: str) -> Any:
    """The ``fuzz.upstream.Upstream`` a family name runs (None for other targets);
    for a mutant of one (``fuzz.targets.mutated``), the file it edits."""
    from fuzz.targets import mutated

    parts = mutated.split(name)
    fam = upstream_family(parts[0] if parts else name)
    if fam is None:
        return None
    from fuzz import upstream

    with _upstream_errors(name):
        up = upstream.find(fam[1]) if fam[1] else upstream.resolve(None)
        return upstream.pre_pr(up) if UPSTREAM[fam[0]] else up


@contextlib.contextmanager
def _upstream_errors(name: str) -> Iterator[None]:
    """Upstream code that cannot be found or read is a bad target: one line naming it."""
    from fuzz import upstream

    try:
        yield
    except upstream.UpstreamError as exc:
        raise TargetError(f"target {name!r}: {exc}") from None


def _weights_version(name: str) -> tuple[str | None] | None:
    """``vllm-weights@0.34.0`` -> (``0.34.0``,): vLLM's packed weight broadcast."""
    family, _, version = name.partition("@")
    return (version or None,) if family == WEIGHTS_FAMILY else None


def provenance(name: str) -> dict[str, Any] | None:
    """What reports and corpus entries say about the upstream code a target runs."""
    weights = _weights_version(name)
    if weights is not None:
        from fuzz.weight_sync import vllm_weights

        with _upstream_errors(name):
            return vllm_weights.provenance(weights[0])
    up = upstream_of(name)
    if up is None:
        return None
    info = up.provenance()
    from fuzz.targets import mutated

    parts = mutated.split(name)
    if parts:
        info["mutant"] = f"the sync call at line {parts[1]}, col {parts[2]} removed"
    return info


def check_upstream(name: str, recorded: dict[str, Any] | None) -> None:
    """A corpus entry replays on the same upstream code it was found on, or not at all."""
    up = upstream_of(name)
    if up is None or not recorded:
        return
    if (recorded.get("sha256"), recorded.get("edit")) != (up.sha256, up.edit):
        from fuzz import upstream

        raise TargetError(
            f"target {name!r} was found on {upstream.FILE} sha256 {recorded.get('sha256')} "
            f"but vLLM {up.version} here ({up.kind}) has {up.sha256}: "
            f"{upstream.fetch_hint(up.version)}")


def resolve(name: str) -> str:
    """Built-in name or ``module:attr`` -> import spec; raises TargetError."""
    builtin = protocols.builtin_targets()
    if name in builtin:
        return builtin[name]
    if ":" not in name:
        known = ", ".join(sorted(builtin) + [f"{f}@VERSION"
                                             for f in (*UPSTREAM, WEIGHTS_FAMILY)])
        raise TargetError(f"unknown target {name!r}: use one of {known}, package.module:attr "
                          f"or path/to/file.py:attr")
    return name


def load(name: str) -> Factory:
    """Import a target factory by built-in name, ``vllm-pp@VERSION``, ``module:attr``
    or mutant name (``target#line:col``, see ``fuzz.targets.mutated``)."""
    from fuzz.targets import mutated

    if mutated.split(name) is not None:
        return mutated.load(name)
    weights = _weights_version(name)
    if weights is not None:
        from fuzz.weight_sync import vllm_weights

        with _upstream_errors(name):
            return vllm_weights.factory(weights[0])
    up = upstream_of(name)
    if up is not None:
        from fuzz.draft.targets import vllm_pp

        return vllm_pp.factory(up)
    spec = resolve(name)
    module_name, _, attr = spec.partition(":")
    importable = import_name(name, module_name)
    try:
        module = importlib.import_module(importable)
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


def import_name(name: str, module_name: str) -> str:
    """What to import a target's module by: a dotted name as it is; for the path
    of a ``.py`` file, its own name, with its folder put first on ``sys.path``,
    as ``python file.py`` would run it: its imports of the files beside it work,
    and the ranks, given the same target, import the same module. A file
    inside a package (folders with an ``__init__.py``) is imported as part of
    it, by its dotted name from the folder above the outermost one, as
    ``python -m`` would: its relative imports work too.
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


def check_importable(name: str) -> None:
    """Fail early, in the driver, on a target that cannot be imported.

    Built-in names are modules of this package, importable wherever it is:
    importing one would only load torch into the driver, which never uses it
    (a second or more of every start)."""
    if name in protocols.builtin_targets():
        return
    factory = load(name)
    if isinstance(factory, type):  # the handler's class itself: its methods are known now
        try:
            protocols.check_handler(protocols.of_target(name, factory), factory)
        except protocols.ProtocolError as exc:
            raise misused(name, exc) from None
