"""What a collaborator's method gives back, read from how the package uses its result.

A duck-typed collaborator's method stood in by one that returns ``None`` stopped
harnesses at the first use of its result: ``works.extend(group.send(...))`` (not
iterable), ``recv = group.send_recv(...)`` then ``recv.get(k)`` in a helper. The
package's own use says what the result is: iterated, extended or listed, a list;
looked up by key, or handed to a function that looks it up, a dict; entered by
a ``with``, a context: given a stream, that stream's (``self._stream_context(s)``,
a device module's ``stream`` kept as an attribute). Such a method stands for a
send, a copy or a collective, so the harness's stand-in reads the tensors it is
given on the current stream (``_gives`` in the harness).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from streamfuzz.fuzz.scan.nodes import parents as _parents
from streamfuzz.fuzz.scan.nodes import text as _text

_LISTING = frozenset(("list", "tuple", "sorted", "set", "enumerate", "zip", "len"))
_MAPPING = frozenset(("get", "items", "keys", "values", "setdefault", "pop"))


def result_shape(names: set[str], where: Iterable[ast.AST]) -> str | None:
    """``"list"``, ``"dict"`` or ``"context"`` (entered by a ``with``): what the calls of
    ``names`` in ``where`` give, by the first use of a result that says; None where no
    use says (the result is dropped, tested, or used in a way none fits)."""
    for scope in where:
        parents = _parents(scope)
        for call in ast.walk(scope):
            if isinstance(call, ast.Call) and _text(call.func) in names:
                shape = _use(call, parents, 0)
                if shape is not None:
                    return shape
    return None


def _use(value: ast.expr, parents: dict[ast.AST, ast.AST], depth: int) -> str | None:
    """What ``value``'s direct use says it is."""
    p = parents.get(value)
    if isinstance(p, ast.withitem) and p.context_expr is value:
        return "context"
    if isinstance(p, (ast.For, ast.comprehension)) and p.iter is value:
        return "list"
    if isinstance(p, ast.Call) and value in p.args:
        func = _text(p.func)
        if func.endswith(".extend") or func in _LISTING:
            return "list"
        if func.endswith(".update") or func == "dict":
            return "dict"
    if isinstance(p, ast.Attribute) and p.value is value and p.attr in _MAPPING:
        return "dict"
    if isinstance(p, ast.Subscript) and p.value is value and isinstance(
            p.slice, ast.Constant) and isinstance(p.slice.value, str):
        return "dict"
    if depth < 2 and isinstance(p, (ast.Assign, ast.AnnAssign)) and p.value is value:
        targets = p.targets if isinstance(p, ast.Assign) else [p.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            scope = _enclosing_function(p, parents)
            if scope is not None:
                return _name_use(targets[0].id, scope, depth + 1)
    return None


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _name_use(name: str, func: ast.AST, depth: int) -> str | None:
    """What a local's uses in ``func`` say it is: directly, or as the argument of a
    function defined in ``func`` (a nested helper) whose parameter's uses say."""
    parents = _parents(func)
    nested = {n.name: n for n in ast.walk(func)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not func}
    for node in ast.walk(func):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        shape = _use(node, parents, depth)
        if shape is not None:
            return shape
        call = parents.get(node)
        if depth < 2 and isinstance(call, ast.Call) and node in call.args and isinstance(
                call.func, ast.Name) and call.func.id in nested:
            helper = nested[call.func.id]
            params = helper.args.posonlyargs + helper.args.args
            at = call.args.index(node)
            if at < len(params):
                shape = _name_use(params[at].arg, helper, depth + 1)
                if shape is not None:
                    return shape
    return None
