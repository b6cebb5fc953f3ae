"""What a stream is called in findings: where it was made, as the code says it.

A finding that says ``side1`` sends the reader hunting for which stream that
is; one that says ``copy_stream`` (the attribute the stream was assigned to)
or ``packed_tensor.py:24`` (where it was made) does not. Simulated and real
streams alike are named here, once, when they are made.
"""

from __future__ import annotations

import ast
import linecache
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from streamfuzz.fuzz.frames import user_code


def site_name() -> str:
    """The name a stream made here gets in findings: the variable or attribute
    its creation is assigned to (``self.copy_stream = torch.cuda.Stream()``:
    ``copy_stream``; ``streams[]`` for each element of a comprehension assigned
    to ``streams``, numbered by ``Names``), else the file and line that made
    it. Asked once per stream, from inside the stream's constructor: the first
    frame of the code under test is the one that made it."""
    f: FrameType | None = sys._getframe(1)
    while f is not None and not user_code(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return "stream"
    key = (f.f_code, f.f_lasti)
    name = _SITES.get(key)
    if name is None:
        if len(_SITES) > 10_000:  # code made at run time, each with sites of its own
            _SITES.clear()
        name = _SITES[key] = (_assigned_to(f.f_code, f.f_lasti)
                              or f"{Path(f.f_code.co_filename).name}:{f.f_lineno}")
    return name


_SITES: dict[tuple[Any, int], str] = {}
"""Per call site (code object, instruction): the name ``site_name`` gave it."""


def _assigned_to(code: Any, lasti: int) -> str | None:
    """The name the call at instruction ``lasti`` of ``code`` is assigned to (or
    passed as, a keyword argument), or None: the source is not there, or the
    call is not the assigned value itself."""
    try:
        line, end_line, col, end_col = list(code.co_positions())[lasti // 2]
        tree = ast.parse("".join(linecache.getlines(code.co_filename)))
    except (IndexError, ValueError, SyntaxError, MemoryError):
        return None
    if line is None or col is None:
        return None
    at = (line, col, end_line, end_col)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            name = _matched(node.targets[0], node.value, at)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            name = _matched(node.target, node.value, at)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            name = node.arg if _span(node.value) == at else None
        else:
            continue
        if name is not None:
            return name
    return None


def _span(node: ast.expr | ast.stmt) -> tuple[Any, ...]:
    return (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)


def _matched(target: ast.AST, value: ast.expr, at: tuple[Any, ...]) -> str | None:
    """``target``'s name where ``value`` is the call at ``at``, or holds it as
    one branch (``a if c else b``, ``a or b``) or one element of a tuple
    unpacked into as many targets."""
    if _span(value) == at:
        if isinstance(target, ast.Name):
            return target.id
        return target.attr if isinstance(target, ast.Attribute) else None
    if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords:
        value = value.args[0]  # tuple(... for ...), list(... for ...)
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)) and _span(value.elt) == at:
        name = _matched(target, value.elt, at)
        return f"{name}[]" if name is not None else None
    if isinstance(value, ast.IfExp):
        return _matched(target, value.body, at) or _matched(target, value.orelse, at)
    if isinstance(value, ast.BoolOp):
        return next((n for v in value.values if (n := _matched(target, v, at))), None)
    if (isinstance(value, (ast.Tuple, ast.List)) and isinstance(target, (ast.Tuple, ast.List))
            and len(value.elts) == len(target.elts)):
        return next((n for t, v in zip(target.elts, value.elts, strict=True)
                     if (n := _matched(t, v, at))), None)
    return None


class Names:
    """The names of one run's streams in findings: each stream's own (its
    site's, or the one the user gave it), with ``#2``, ``#3``... after a name
    another stream of the run already has; ``main`` is the default stream's.
    The elements of a comprehension (``streams[]``) are numbered from 0 in
    the order they were made."""

    def __init__(self) -> None:
        self._given: dict[Any, str] = {}
        self._taken: dict[str, int] = {"main": 1}

    def of(self, key: Any, own: str) -> str:
        name = self._given.get(key)
        if name is None:
            if own.endswith("[]"):
                i = self._taken[own] = self._taken.get(own, -1) + 1
                own = f"{own[:-2]}[{i}]"
            n = self._taken[own] = self._taken.get(own, 0) + 1
            name = self._given[key] = own if n == 1 else f"{own}#{n}"
        return name

    def rename(self, key: Any, name: str) -> None:
        self._given[key] = name
