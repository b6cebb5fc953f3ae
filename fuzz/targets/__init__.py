"""The target API: what a handler under test receives and must provide.

A target is a callable ``factory(ctx) -> handler``. The harness calls it on
every rank at the start of every example (a fresh runner), then per step:

* last rank: ``handler.broadcast_drafts(draft_table, batch)`` returns the
  tensor it broadcast (or ``None`` when nothing was broadcast);
* other ranks: ``handler.receive_drafts(batch)`` every step, and, pipeline
  depth steps after a step that broadcast, ``handler.apply_received(draft_table)``
  which applies the oldest parked step and returns the received
  ``(sampled_tokens, num_sampled, num_rejected)``.

Built-in targets are named; a user's target is ``package.module:attr``.
vLLM's own handler is the family ``vllm-pp`` (and ``vllm-pp-pre-pr``, the
derived pre-PR code), named with the upstream version: ``vllm-pp@0.32.0``
(``fuzz.upstream`` finds that version; ``fuzz.draft.targets.vllm_pp`` drives it).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuzz import protocol as protocols
from fuzz.draft import PROTOCOL as DRAFT_BROADCAST
from fuzz.errors import BadInput

if TYPE_CHECKING:  # the driver imports this module and never needs torch itself
    import torch

VERSIONS: dict[str, str] = DRAFT_BROADCAST.versions
"""The three versions of the draft-broadcast handler: what ``run`` fuzzes by default."""

MUTANTS: dict[str, str] = DRAFT_BROADCAST.mutants
"""Planted bugs (see ``fuzz.draft.targets.mutants``): each must be found on CPU."""

VARIANTS: dict[str, str] = DRAFT_BROADCAST.variants
"""Correct variants of ``main-gather`` (host syncs); run only when named."""

BUILTIN: dict[str, str] = {**VERSIONS, **MUTANTS}
"""The draft broadcast's built-in targets (the default of matrix, bench and soak).
Every protocol's built-ins: ``fuzz.protocol.builtin_targets()``."""

CORRECT: frozenset[str] = frozenset(
    name for p in protocols.all_protocols().values() for name in (p.correct, *p.variants))
"""The built-in targets that must be clean: each protocol's correct version and its variants."""


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


@dataclass
class TargetContext:
    """What one rank's handler is built from.

    ``device`` is the rank's CUDA device (``cuda:0`` on the CPU simulation).
    ``streams`` is the run's stream API with torch.cuda's meaning; plain
    torch.cuda does the same, so a target needs it only if it prefers it.
    """

    rank: int
    world_size: int
    last_rank: int
    device: torch.device
    group: Any
    max_num_reqs: int
    num_spec_steps: int
    streams: Any
    pipeline_depth: int = 1
    """Steps between a broadcast and its apply on the other ranks (vLLM's ring depth)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.last_rank


@dataclass
class Batch:
    """One step's scheduled batch as a runner hands it to the handler.

    ``idx_mapping`` is a fresh device tensor (batch row -> request slot), copied
    on the main stream. The sampling tensors exist on the last rank only. The
    harness keeps no reference once the handler call returns.
    """

    step: int
    idx_mapping: torch.Tensor
    final: list[bool]
    sampled_tokens: torch.Tensor | None = None
    num_sampled: torch.Tensor | None = None
    num_rejected: torch.Tensor | None = None
    host_idx_mapping: tuple[int, ...] = ()
    """``idx_mapping`` as the host built it (vLLM's ``idx_mapping_np``): reading
    the device tensor back would synchronize the host."""

    @property
    def num_reqs(self) -> int:
        return len(self.final)

    @property
    def samples(self) -> bool:
        """False when every request is a non-final prefill chunk: nothing is broadcast."""
        return any(self.final)


Factory = Callable[[TargetContext], Any]


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
    factory = module
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
