"""An object's buffers that only the object's own stream touches.

A context object that owns a stream and a staging buffer, allocated with no
fill at its construction (``torch.empty``), and touches the buffer only under
``with stream(obj.stream)``, itself or through helpers called there, leaves no
write of it on any other stream: its last write elsewhere is its allocation,
which launches no kernel. A use of ``obj.buf`` on ``obj.stream`` then has no
writer to wait for, where the function alone would take the caller's stream for
one. A fill at construction (``torch.zeros``) is a write on the constructing
stream, so such a buffer is not one of these.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from streamfuzz.fuzz.scan import callers
from streamfuzz.fuzz.scan.functions import Function
from streamfuzz.fuzz.scan.names import callee_name
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import ANY, K, Trace
from streamfuzz.fuzz.scan.package import Package


def own_stream_buffers(pkg: Package, walked: Iterable[Trace]) -> dict[str, str]:
    """Attribute name -> the name of the stream attribute of the same object that
    every use of it in the package runs on. A use on a function's own stream counts
    only where the function has callers in the package (their walks see it, lent,
    on the stream they are in); the attribute is bound in ``__init__`` only, to an
    allocation with no fill, and no function or file the scan does not walk names it."""
    traces = list(walked)
    streams: dict[str, set[str]] = {}
    spoiled: set[str] = set()
    by_site = {(f.file, f.qualname): f for f in pkg.functions}
    called: dict[tuple[str, str], bool] = {}
    for t in traces:
        for o in t.ops:
            if o.kind is not K.USE or "." not in o.key or o.key.startswith("<"):
                continue
            owner, _, attr = o.key.rpartition(".")
            if o.stream == t.base:
                site = (t.file, t.qualname)
                if site not in called:
                    fn = by_site.get(site)
                    called[site] = fn is not None and callers.has_callers(pkg, fn)
                if not called[site]:
                    spoiled.add(attr)
            elif o.stream != ANY and o.stream.startswith(owner + ".") and \
                    "." not in o.stream[len(owner) + 1:]:
                streams.setdefault(attr, set()).add(o.stream[len(owner) + 1:])
            else:
                spoiled.add(attr)
    found = {a: next(iter(s)) for a, s in streams.items() if len(s) == 1 and a not in spoiled}
    if not found:
        return {}
    walked_sites = {(t.file, t.qualname) for t in traces}
    made: dict[str, bool] = {}
    mention = re.compile(r"\.(" + "|".join(map(re.escape, sorted(found))) + r")\b")
    for fn in pkg.functions:
        named = set(mention.findall(fn.text)) & set(found)
        if not named:
            continue
        if fn.name != "__init__" and (fn.file, fn.qualname) not in walked_sites:
            found = {a: s for a, s in found.items() if a not in named}
            continue
        for node in ast.walk(fn.node):
            for tgt, value in _bindings(node):
                if not isinstance(tgt, ast.Attribute) or tgt.attr not in found:
                    continue
                if fn.name != "__init__" or value is None:
                    del found[tgt.attr]  # bound again after construction
                else:
                    made[tgt.attr] = made.get(tgt.attr, True) and _made_empty(pkg, fn, value)
    return {a: s for a, s in found.items()
            if made.get(a) and a not in pkg.quiet_attributes}


def _made_empty(pkg: Package, init: Function, value: ast.expr) -> bool:
    """Is ``value`` a fresh allocation with no kernel that fills it (``torch.empty``),
    or a keyword-only parameter every caller that names it passes one of those?"""
    if isinstance(value, ast.Call):
        return callee_name(value) in _EMPTY
    a = init.node.args
    if not isinstance(value, ast.Name) or value.id not in {p.arg for p in a.kwonlyargs}:
        return False
    seen = False
    for fn in pkg.functions:
        if f"{value.id}=" not in fn.text:
            continue
        for node in own_nodes(fn.node):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg != value.id:
                    continue
                if not isinstance(kw.value, ast.Name):
                    return False
                bound = [v for n in own_nodes(fn.node) for t, v in _bindings(n)
                         if isinstance(t, ast.Name) and t.id == kw.value.id]
                if not bound or not all(isinstance(v, ast.Call) and callee_name(v) in _EMPTY
                                        for v in bound):
                    return False
                seen = True
    return seen


_EMPTY = frozenset({"empty", "empty_like", "empty_strided", "new_empty"})
"""Makers that allocate with no kernel: no stream has written what they give."""


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr | None]]:
    """The targets ``node`` binds, each with its value (None where it is not the
    whole value: an augmented assignment, an unpacking)."""
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, ast.AnnAssign):
        return [(node.target, node.value)]
    if isinstance(node, ast.AugAssign):
        return [(node.target, None)]
    return []


