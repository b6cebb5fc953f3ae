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


def branch_paths(fn: ast.AST) -> dict[int, tuple[tuple[int, int], ...]]:
    """Each own node's id -> the branches it runs in, outermost first: (the ``if``
    or ``except``, its part). A node runs wherever another whose path is a prefix
    of its own runs: the branch that holds it also holds the other."""
    out: dict[int, tuple[tuple[int, int], ...]] = {}
    stack: list[tuple[ast.AST, tuple[tuple[int, int], ...]]] = [
        (n, ()) for n in ast.iter_child_nodes(fn)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        out[id(node)] = path
        if isinstance(node, ast.If):
            stack.append((node.test, path))
            stack += [(s, (*path, (id(node), 0))) for s in node.body]
            stack += [(s, (*path, (id(node), 1))) for s in node.orelse]
        elif isinstance(node, ast.ExceptHandler):
            stack += [(s, (*path, (id(node), 0))) for s in ast.iter_child_nodes(node)]
        else:
            stack += [(s, path) for s in ast.iter_child_nodes(node)]
    return out
