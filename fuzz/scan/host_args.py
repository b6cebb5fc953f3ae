"""Which arguments a package passes as host memory: the calls under a test that
the tensor is on the CPU (``is_cpu``, ``device.type == "cpu"``, ``is_pinned()``,
``not is_cuda``), and the arguments made by ``.cpu()`` or ``.pin_memory()``."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from streamfuzz.fuzz.scan.names import dotted


def host_guarded_calls(body: list[ast.stmt], hosted: frozenset[str]
                        ) -> Iterator[tuple[ast.Call, frozenset[str]]]:
    """Every call under ``body``, with the names its enclosing ``if`` tests say are
    host memory where it runs."""
    for s in body:
        if isinstance(s, ast.If):
            yield from ((c, hosted) for c in calls_in(s.test))
            yield from host_guarded_calls(s.body, hosted | host_tested(s.test))
            yield from host_guarded_calls(s.orelse, hosted)
            continue
        inner = frozenset() if isinstance(
            s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else hosted
        for name, value in ast.iter_fields(s):
            items = value if isinstance(value, list) else [value]
            if items and all(isinstance(x, ast.stmt) for x in items):
                yield from host_guarded_calls(items, inner)
            for x in items:
                if isinstance(x, (ast.ExceptHandler, ast.match_case)):
                    yield from host_guarded_calls(x.body, inner)
                elif isinstance(x, ast.AST) and not isinstance(x, ast.stmt) and \
                        name != "decorator_list":
                    yield from ((c, inner) for c in calls_in(x))


def calls_in(node: ast.AST) -> Iterator[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def host_tested(test: ast.expr) -> frozenset[str]:
    """The names a true ``test`` says are host memory (its ``and``ed parts only)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return frozenset().union(*(host_tested(v) for v in test.values))
    node: ast.expr | None = None
    if isinstance(test, ast.Attribute) and test.attr == "is_cpu":
        node = test.value
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(
            test.operand, ast.Attribute) and test.operand.attr == "is_cuda":
        node = test.operand.value
    elif isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and \
            test.func.attr == "is_pinned" and not test.args:
        node = test.func.value
    elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], (ast.Eq, ast.Is)) and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value == "cpu":
        side = test.left
        if isinstance(side, ast.Attribute) and side.attr == "type":
            side = side.value
        if isinstance(side, ast.Attribute) and side.attr == "device":
            node = side.value
    name = dotted(node) if node is not None else None
    return frozenset((name,)) if name else frozenset()


def host_args(call: ast.Call, hosted: frozenset[str]) -> set[int | str]:
    """The positions and keywords at which ``call`` passes host memory."""
    def host(a: ast.expr) -> bool:
        if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and \
                a.func.attr in ("cpu", "pin_memory") and not a.args:
            return True
        return (dotted(a) or "") in hosted
    starred = next((i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)),
                   len(call.args))
    out: set[int | str] = {i for i, a in enumerate(call.args[:starred]) if host(a)}
    out |= {k.arg for k in call.keywords if k.arg and host(k.value)}
    return out
