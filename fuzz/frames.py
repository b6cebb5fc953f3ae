"""Whose code a frame is: the program under test's, a test runner's, or the harness's.

Findings cite the user's lines, never torch's, the standard library's or this
package's own: the lifetime oracle walks the stack at every op it records,
and the simulation names a stream after the user's line that made it. So the
decision is made once per source file and kept.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import torch

Frames = tuple[tuple[str, int, str], ...]
"""Frames as plain strings, innermost first: (path, line, function)."""

_FUZZ = Path(__file__).parent


def _package_dirs(*names: str) -> tuple[str, ...]:
    """Where these packages live, found without importing them."""
    dirs: list[str] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(str(Path(d)) + os.sep for d in spec.submodule_search_locations)
    return tuple(dirs)


# Never the user's frames: torch, this checker and a checked block's own code
# (the modules of the streamfuzz package itself, by file: installed, its folder
# also holds streamfuzz.fuzz, whose built-in targets are code a finding names).
_SKIP_DIRS = (str(Path(torch.__file__).parent), str(_FUZZ.resolve() / "oracles"),
              str(_FUZZ.resolve() / "sim") + os.sep)
# Test runners around a checked block: everything outward of them is theirs too,
# and a user's test file, which they call, is user code.
_RUNNER_DIRS = _package_dirs("hypothesis", "_pytest", "pytest", "pluggy", "xdist", "execnet")
# ``streamfuzz check`` runs a program through runpy, as ``python`` does.
_RUNNER_PATHS = frozenset({"<frozen runpy>", runpy.__file__,
                           str(_FUZZ / "commands" / "check.py")})
# torch's by name (wherever that torch lives); the standard library's and this
# package's by path, so that a user's own streams.py or threads.py stays theirs.
_SKIP_FILES = ("_python_dispatch.py", "distributed_c10d.py", "c10d_logger.py",
               "_gpu_trace.py")
_API = Path(str(sys.modules["streamfuzz"].__file__)).parent
_SKIP_PATHS = frozenset(
    p for f in (Path(contextlib.__file__), Path(threading.__file__), _FUZZ / "streams.py",
                _FUZZ / "protocol" / "runner.py", *_API.glob("*.py"),
                # The wrappers a user's call goes through: a finding quotes the call.
                _FUZZ / "collectives.py", _FUZZ / "annotations.py",
                # A stood-in extension call: the package line that called it is the site.
                _FUZZ / "scan" / "standins.py")
    for p in (str(f), str(Path(f).resolve())))
# A mode's hook is the harness watching an op, never the code that issued it.
_MODE_HOOKS = frozenset({"__torch_dispatch__", "__torch_function__"})


_first: Callable[[FrameType], None] | None = None
"""While a run keeps a record: told of each user function's frame the first
time a walk meets the function (``streamfuzz._record`` sketches the call)."""
_counts: dict[int, list] | None = None
"""While a run keeps a record (``streamfuzz._record``): per user function met
in a walk, by its code object's id, ``[code, walks]``. The entry holds the
code, so its id is not reused while counted."""

_SKIP, _USER, _RUNNER = 0, 1, 2
_FILE_KINDS: dict[str, int] = {}
"""Each source file's kind, decided once: frames are walked at every op. Keyed
by file name, not by code object: a code object's hash is not cached (every
lookup hashes its constants and names again), a string's is."""


def user_code(path: str) -> bool:
    """Whether a frame in the file at ``path`` is the code under test's (not
    torch's, the standard library's nor the harness's)."""
    kind = _FILE_KINDS.get(path)
    return (kind if kind is not None else _file_kind(path)) != _SKIP


def _file_kind(path: str) -> int:
    kind = (_RUNNER if path.startswith(_RUNNER_DIRS) or path in _RUNNER_PATHS else
            _USER if (not path.startswith(_SKIP_DIRS) and not path.endswith(_SKIP_FILES)
                      and path not in _SKIP_PATHS)
            else _SKIP)
    if len(_FILE_KINDS) > 100_000:  # code made at run time, each with a name of its own
        _FILE_KINDS.clear()
    _FILE_KINDS[path] = kind
    return kind


def count_functions(counts: dict[int, list] | None,
                    first: Callable[[FrameType], None] | None = None) -> None:
    """From now on, count every user function each walk meets in ``counts``
    (``None``: stop), and tell ``first`` of its frame when it is met first. A
    walk is made where an op's stream work is recorded, so this is the
    cheapest place to learn which functions did stream work, and with what."""
    global _counts, _first
    _counts, _first = counts, first


def frames_here(limit: int = 4) -> Frames:
    """The innermost frames of the program under test, as plain strings."""
    out: list[tuple[str, int, str]] = []
    kinds = _FILE_KINDS
    counts = _counts
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        code = f.f_code
        path = code.co_filename
        kind = kinds.get(path)  # asked at every op: the dict first, the decision once
        if kind is None:
            kind = _file_kind(path)
        if kind == _USER:
            if code.co_name not in _MODE_HOOKS:
                out.append((path, f.f_lineno, code.co_name))
                if counts is not None:
                    entry = counts.get(id(code))
                    if entry is not None:
                        entry[1] += 1
                    else:
                        counts[id(code)] = [code, 1]
                        if _first is not None:
                            _first(f)
                if len(out) == limit:
                    break
        elif kind == _RUNNER:
            break
        f = f.f_back
    return tuple(out)
