"""Which passes of a ``for i in range(...)`` loop an op runs in, from the ``if``s on
the index it is under.

A layer-by-layer loop often puts its side stream's work in one pass (``if i == 0``)
and a device sync in a later one (``if i > 0 and i <= n``): the sync orders that
work, on every path where the work ran, if the loop always reaches the sync's
pass after the work's. The tests are small integer expressions of the index and
of names the function does not fix (``self.num_layers``); each such name is tried
at every value of ``SAMPLES``, and the answer is yes only where it holds for all.
"""

from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.scan.ops import Loop, Op

SAMPLES = range(-1, 5)
"""The values tried for each name a loop's bounds and tests leave open."""
_MAX_OPEN = 3  # more open names than this: no answer (6**3 cases at most)
_MAX_PASSES = 16

_CMP: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
    ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class _Unknown(FuzzError):
    """A test or bound this reading cannot evaluate (never leaves this module)."""


def synced_after(loop: Loop, use: Op, syncs: list[Op], tests: dict[int, ast.expr]) -> bool:
    """Does one of ``syncs`` run after ``use`` in every run of ``loop`` where ``use``
    runs: in a later pass, or later in the same pass? All are ops of the loop's body;
    their guards past ``loop.depth`` are the ``if``s inside it."""
    if loop.var is None or not syncs or any(
            isinstance(n, (ast.Break, ast.Return)) for n in ast.walk(loop.node)):
        return False  # a break or return may end the loop before the sync's pass
    try:
        conds = [_conds(o, loop, tests) for o in (use, *syncs)]
        open_names = sorted({n for c in conds for t, _ in c for n in _open(t, loop.var)} |
                            {n for b in loop.bounds for n in _open(b, loop.var)})
        if len(open_names) > _MAX_OPEN:
            return False
        for values in itertools.product(SAMPLES, repeat=len(open_names)):
            env = dict(zip(open_names, values))
            bounds = [_value(b, loop.var, 0, env) for b in loop.bounds]
            passes = list(range(*bounds))[:_MAX_PASSES]
            runs = [[_holds(c, loop.var, i, env) for i in passes] for c in conds]
            for i in (k for k, ran in enumerate(runs[0]) if ran):
                if not any(ran[j] for s, ran in zip(syncs, runs[1:])
                           for j in range(i if s.line > use.line else i + 1, len(passes))):
                    return False
        return True
    except (_Unknown, TypeError, ValueError, ZeroDivisionError):
        return False


def _conds(o: Op, loop: Loop, tests: dict[int, ast.expr]) -> list[tuple[ast.expr, bool]]:
    out = []
    for g in o.guards[loop.depth:]:
        test = tests.get(abs(g))
        if test is None:
            raise _Unknown  # an except handler or a match case: not an index test
        out.append((test, g > 0))
    return out


def _holds(conds: list[tuple[ast.expr, bool]], var: str, i: int, env: dict[str, int]) -> bool:
    return all(bool(_value(t, var, i, env)) is want for t, want in conds)


def _open(node: ast.expr, var: str) -> Iterator[str]:
    """The names (and attribute chains, calls) in ``node`` that are not the index."""
    if _leaf(node, var):
        yield ast.unparse(node)
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            yield from _open(child, var)


def _leaf(node: ast.expr, var: str) -> bool:
    return isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and not any(
        isinstance(n, ast.Name) and n.id == var for n in ast.walk(node))


def _value(node: ast.expr, var: str, i: int, env: dict[str, int]) -> Any:
    if isinstance(node, ast.Name) and node.id == var:
        return i
    if _leaf(node, var):
        return env[ast.unparse(node)]
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
        return node.value
    if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
        left = _value(node.left, var, i, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _value(right_node, var, i, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        vals = (bool(_value(v, var, i, env)) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        v = _value(node.operand, var, i, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return _ARITH[type(node.op)](_value(node.left, var, i, env),
                                     _value(node.right, var, i, env))
    raise _Unknown
