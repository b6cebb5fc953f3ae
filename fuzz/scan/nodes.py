"""Which nodes of a function's tree are its own: what the function itself
runs, not what the functions and classes nested in it run when called."""

from __future__ import annotations

import ast
from collections.abc import Iterator


def text(node: ast.AST | None) -> str:
    """A node's source, as the harness rules match it; '' for none or an odd node."""
    if node is None:
        return ""
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - an odd node is no match
        return ""


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    """Each node of ``tree`` (``tree`` itself aside) -> the node it is a child of."""
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not of the functions nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def guarded_nodes(fn: ast.AST) -> set[int]:
    """The ids of the nodes that run only on some paths (under an ``if`` or an
    ``except``)."""
    out: set[int] = set()
    for node in own_nodes(fn):
        if isinstance(node, (ast.If, ast.ExceptHandler)):
            for s in [*node.body, *getattr(node, "orelse", [])]:
                out |= {id(n) for n in ast.walk(s)}
    return out
