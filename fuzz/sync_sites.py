"""Synchronization call sites of a target's source, found and removed by AST.

A site is matched by the call's attribute name and shape, never by a module
prefix, so ``torch.cuda.stream(s)``, ``ctx.streams.stream(s)`` and
``self.streams.stream(self.side)`` are all stream contexts, and
``torch.cuda.synchronize()`` and ``ev.synchronize()`` are both host syncs.
The rules (``RULES``) are listed in docs/mutate.md.

Removing a site keeps every line number, so a mutant's findings cite the
original file's lines. The removed call is replaced by ``HIT()`` (a function the
loader puts in the mutant's namespace; it returns ``None`` like every removed
call, or an unrecorded event where the call returned one), so the engine can
tell a survivor that never ran from one that ran and was not missed.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable
from dataclasses import dataclass

HIT = "__streamfuzz_hit__"
"""The name a removed call is replaced by (see the module docstring)."""

# Attribute name -> (rule, how many positional arguments the call may have).
_CALLS: dict[str, tuple[str, range]] = {
    "record_stream": ("record_stream", range(1, 2)),
    "wait_stream": ("wait_stream", range(1, 2)),
    "wait_event": ("wait_event", range(1, 2)),
    "record_event": ("record_event", range(0, 2)),
    "record": ("Event.record", range(0, 2)),
    "wait": ("Event.wait", range(0, 2)),
    "synchronize": ("synchronize", range(0, 2)),
}
_CONTEXTS = {"stream": "stream context", "StreamContext": "stream context"}

RULES: dict[str, str] = {
    "record_stream": "t.record_stream(s): the allocator keeps t's block until s's queued work ends",
    "wait_stream": "a.wait_stream(b): a's later work waits for b's queued work",
    "wait_event": "s.wait_event(e): s's later work waits for e",
    "record_event": "s.record_event(): an event marking s's queued work (removed: an "
                    "event never recorded, whose waits are no-ops)",
    "Event.record": "e.record(s?): e marks s's queued work (removed: e stays unrecorded)",
    "Event.wait": "e.wait(s?) or work.wait(): the stream waits for e (or a collective)",
    "synchronize": "x.synchronize(d?): the host waits (device, stream or event)",
    "stream context": "with X.stream(s) / X.StreamContext(s): the body runs on s "
                      "(removed: the body runs on the enclosing stream)",
}
"""Every rule, as docs/mutate.md lists it."""


@dataclass(frozen=True)
class Site:
    """One synchronization call: where it is and what it says."""

    path: str
    line: int
    col: int
    rule: str
    call: str

    @property
    def key(self) -> str:
        """``line:col``: names the site within its file."""
        return f"{self.line}:{self.col}"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _call_rule(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    rule = _CALLS.get(node.func.attr)
    if rule is None or len(node.args) + len(node.keywords) not in rule[1]:
        return None
    return rule[0]


def _context_rule(item: ast.withitem) -> str | None:
    call = item.context_expr
    if not isinstance(call, ast.Call) or len(call.args) != 1 or call.keywords:
        return None
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return _CONTEXTS.get(name) if name is not None else None


def scope(tree: ast.Module, root: str) -> list[ast.stmt]:
    """The module's top-level definitions reachable from ``root`` by name.

    The factory, the class it builds, that class's bases and the helpers they
    call, when defined in the same file: a module that holds several targets
    (like ``fuzz/draft/targets/pp_draft.py``) then yields only this target's sites.
    """
    defs = {n.name: n for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    seen: dict[str, ast.stmt] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        node = defs.get(name)
        if node is None or name in seen:
            continue
        seen[name] = node
        todo.extend(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    return [n for n in tree.body if n in seen.values()]


def find(nodes: Iterable[ast.AST], path: str) -> list[Site]:
    """Every site under ``nodes``, in source order."""
    sites: dict[tuple[int, int], Site] = {}
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    rule = _context_rule(item)
                    if rule:
                        c = item.context_expr
                        sites[(c.lineno, c.col_offset)] = Site(
                            path, c.lineno, c.col_offset, rule, f"with {ast.unparse(c)}")
            rule = _call_rule(node)
            if rule and isinstance(node, ast.Call):
                sites[(node.lineno, node.col_offset)] = Site(
                    path, node.lineno, node.col_offset, rule, ast.unparse(node))
    return [sites[k] for k in sorted(sites)]


def _hit(node: ast.AST, *args: ast.expr) -> ast.Call:
    call = ast.Call(func=ast.Name(HIT, ast.Load()), args=list(args), keywords=[])
    return ast.copy_location(call, node)


class _Remove(ast.NodeTransformer):
    def __init__(self, line: int, col: int) -> None:
        self.at = (line, col)
        self.done = False

    def _here(self, node: ast.AST) -> bool:
        return (getattr(node, "lineno", None), getattr(node, "col_offset", None)) == self.at

    def visit_Call(self, node: ast.Call) -> ast.AST:  # noqa: N802 - ast's name
        self.generic_visit(node)
        if not self._here(node) or _call_rule(node) is None:
            return node
        self.done = True
        if _call_rule(node) == "record_event":
            # The value is an event; a stand-in that was never recorded.
            return _hit(node, node.func.value)  # type: ignore[attr-defined]
        return _hit(node)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> ast.AST | list[ast.stmt]:  # noqa: N802
        self.generic_visit(node)
        keep = [i for i in node.items if not (self._here(i.context_expr) and _context_rule(i))]
        if len(keep) == len(node.items):
            return node
        self.done = True
        gone = next(i for i in node.items if i not in keep)
        hit: ast.stmt = ast.Expr(_hit(gone.context_expr))
        if gone.optional_vars is not None:
            hit = ast.Assign(targets=[gone.optional_vars], value=_hit(gone.context_expr))
        hit = ast.copy_location(hit, gone.context_expr)
        if keep:
            node.items = keep
            node.body = [hit, *node.body]
            return node
        return [hit, *node.body]

    visit_AsyncWith = visit_With  # noqa: N815


def remove(tree: ast.Module, site: Site) -> ast.Module:
    """A copy of ``tree`` with ``site``'s call removed (see the module docstring)."""
    new = copy.deepcopy(tree)
    remover = _Remove(site.line, site.col)
    new = remover.visit(new)
    if not remover.done:
        raise ValueError(f"no synchronization call at {site.where} col {site.col}")
    return ast.fix_missing_locations(new)


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a, include_attributes=False) == ast.dump(b, include_attributes=False)


def twin(nodes: Iterable[ast.AST], site: Site) -> int | None:
    """The line of an identical call statement next to ``site``'s, if any.

    Two identical ``wait_stream``, ``record_stream``, event or sync calls with
    only ``record_stream`` calls between them order exactly what one of them
    does (``record_stream`` enqueues no work and orders nothing): either one
    is redundant. Stream contexts are not paired.
    """
    for top in nodes:
        for node in ast.walk(top):
            for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
                if not isinstance(body, list):
                    continue
                for i, stmt in enumerate(body):
                    if _at(stmt) == (site.line, site.col):
                        return _twin_in(body, i)
    return None


def _at(stmt: ast.AST) -> tuple[int, int] | None:
    if isinstance(stmt, ast.Expr) and _call_rule(stmt.value):
        return stmt.value.lineno, stmt.value.col_offset
    return None


def _twin_in(body: list[ast.stmt], i: int) -> int | None:
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(body) and _at(body[j]) is not None:
            if _same(body[j], body[i]):
                return body[j].lineno
            if _call_rule(body[j].value) != "record_stream":  # type: ignore[attr-defined]
                break
            j += step
    return None
