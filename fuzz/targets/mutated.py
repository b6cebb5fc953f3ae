"""Mutant targets: a target's own module, compiled again with one sync removed.

A mutant is named ``<target>#<line>:<col>`` (``main-gather#57:12``), so the
ranks load it like any target, from its name alone, and a corpus entry found
on it replays the same way. The base target's module file is parsed, the site
is removed (``streamfuzz.fuzz.sync_sites.remove``), and the edited tree is compiled under
the original file name: findings cite the original lines.

An upstream target (``vllm-pp@VERSION``) is mutated in the file the upstream
loader reads (``streamfuzz.fuzz.upstream``), through that loader; any other target in
the module file of its factory.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import env, sync_sites
from streamfuzz.fuzz.sites import display_path
from streamfuzz.fuzz.sync_sites import Site
from streamfuzz.fuzz.targets.names import (
    SEP,
    Factory,
    TargetError,
    family_of,
    file_name,
    import_name,
    resolve,
    split,
    upstream_of,
)

__all__ = ["HITS_ENV", "SEP", "Source", "hit_file", "load", "module_source", "name", "sites",
           "source_of", "split"]

HITS_ENV = env.MUTANT_HITS
"""A directory where a mutant's rank leaves a file the first time its removed
site is reached; unset, nothing is written."""


@dataclass
class Source:
    """What ``mutate`` edits, and how an edited copy becomes a factory."""

    path: str
    """Shown in tables: the file's path below its import root."""
    tree: ast.Module
    root: str
    """The top-level name the target starts from (see ``sync_sites.scope``)."""
    build: Callable[[ast.Module, dict[str, Any], str], Factory]
    """(edited tree, names to add to its namespace, module suffix) -> factory."""


def name(target: str, site: Site) -> str:
    return f"{target}{SEP}{site.key}"


def hit_file(mutant: str) -> str:
    """The file name a mutant's first reached site leaves in ``HITS_ENV``."""
    return file_name(mutant)


def source_of(target: str) -> Source:
    """The source ``mutate`` edits for ``target``; raises TargetError."""
    up = upstream_of(target)
    if up is not None:
        return _upstream_source(target, up)
    spec = resolve(target)
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(import_name(target, module_name))
    except ImportError as exc:
        raise TargetError(f"target {target!r}: cannot import {module_name!r} ({exc})") from None
    return module_source(module, attr)


def module_source(module: types.ModuleType, attr: str) -> Source:
    """The default: the factory's own module file."""
    file = getattr(module, "__file__", None)
    if not file or not file.endswith(".py") or not os.path.exists(file):
        raise TargetError(f"module {module.__name__!r} has no Python source file to mutate")
    text = Path(file).read_text()
    tree = ast.parse(text, filename=file)
    shown = display_path(os.path.abspath(file))  # as findings name it

    def build(edited: ast.Module, extra: dict[str, Any], suffix: str) -> Factory:
        mod_name = f"{module.__name__}__{suffix}"
        mod = types.ModuleType(mod_name)
        mod.__file__ = file
        mod.__package__ = module.__package__
        mod.__dict__.update(extra)
        sys.modules[mod_name] = mod  # dataclasses and pickling look modules up here
        exec(compile(edited, file, "exec"), mod.__dict__)  # noqa: S102 - the point
        return _attr(mod, attr)

    return Source(path=shown, tree=tree, root=attr.split(".")[0], build=build)


def _upstream_source(target: str, up: Any) -> Source:
    """Upstream code as its family's loader runs it (an AST edit, such as the
    pre-PR one, included): the mutant is that code with one more AST edit."""
    found = family_of(target)
    assert found is not None  # upstream_of found the family
    path, tree, root, build = found[0].source(up)
    return Source(path=path, tree=tree, root=root, build=build)


def _attr(mod: types.ModuleType, attr: str) -> Factory:
    obj: Any = mod
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def sites(target: str) -> list[Site]:
    """Every sync site in ``target``'s own source, in source order."""
    src = source_of(target)
    return sync_sites.find(sync_sites.scope(src.tree, src.root), src.path)


def load(mutant: str) -> Factory:
    """The factory of ``base#line:col``: base's source without that site."""
    parts = split(mutant)
    if parts is None:
        raise TargetError(f"{mutant!r} is not a mutant name (target#line:col)")
    base, line, col = parts
    src = source_of(base)
    site = next((s for s in sync_sites.find(sync_sites.scope(src.tree, src.root), src.path)
                 if (s.line, s.col) == (line, col)), None)
    if site is None:
        raise TargetError(f"mutant {mutant!r}: {src.path} has no sync site at line {line} "
                          f"col {col}")
    edited = sync_sites.remove(src.tree, site)
    extra = {sync_sites.HIT: _hit_function(hit_file(mutant))}
    return src.build(edited, extra, f"streamfuzz_mutant_{line}_{col}")


def _hit_function(file_name: str) -> Callable[..., Any]:
    directory = env.text(HITS_ENV)
    marked = False

    def hit(stream: Any = None) -> Any:
        nonlocal marked
        if directory and not marked:
            marked = True
            Path(directory, file_name).touch()
        return None if stream is None else _unrecorded_event(stream)

    return hit


def _unrecorded_event(stream: Any) -> Any:
    """An event of ``stream``'s kind that was never recorded (its waits are no-ops)."""
    api = getattr(stream, "_api", None)  # a simulated stream knows its API
    if api is not None:
        return api.Event()
    import torch

    return torch.cuda.Event()
