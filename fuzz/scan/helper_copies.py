"""A host buffer that a function rewrites each call and copies to the device through
its own object's helper (``buf.np[:n] = ...`` then ``buf.copy_to_gpu(n)``).

The copy is the helper's (a method whose ``non_blocking`` copy reads the object's
host half), the rewrite is the caller's, often in a function with no stream
words at all: neither shows the hazard alone. The next call's rewrite may land
while this call's copy is still queued unless a sync that covers the copy comes
between: one in the function before the write, or an engine's input-preparation
section (a context manager that syncs an event on entry and records it on
exit) that every caller runs the function inside, so that the next section's
sync waits for this copy. Only a class that keeps that protocol in some method
is judged: elsewhere the scan cannot tell whether a copy may still be pending at
the next call. A buffer taken by a changing index from a set of
them (``self.bufs[self.idx]``, double buffering) is not one buffer, and is not
reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from streamfuzz.fuzz.scan.hazards import TEST_PATH, Finding, Hazard
from streamfuzz.fuzz.scan.names import dotted
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import K, Trace
from streamfuzz.fuzz.scan.package import Function, Package

_DEPTH = 4  # callers followed up to a protecting section


def helper_rewrites(pkg: Package, walked: Iterable[Trace]) -> Iterator[Finding]:
    """A persistent host buffer the function writes before its helper's non-blocking
    copy of it, with nothing that covers the previous call's copy before the write."""
    helpers = _helpers(pkg, walked)
    if not helpers:
        return
    sections = _sections(pkg)
    for fn in sorted(pkg.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
        if not any(f".{h}(" in fn.text for h in helpers) or not _protects(pkg, fn, sections):
            continue
        found = _rewrites(fn, helpers)
        if not found:
            continue
        if _covered(pkg, fn, sections, 0, set()):
            continue
        inside = _inside(fn, sections)
        for buf, (leaf, write, copy, helper) in sorted(found.items()):
            if _synced_before(fn, write) or any(a <= write <= b for a, b in inside):
                continue
            factors = ["previous-call", "object-state"]
            if TEST_PATH.search(fn.file):
                factors.append("test-code")
            f = Finding(
                Hazard.PINNED_REWRITE, fn.file, write, fn.qualname, (f"{buf}.{leaf}",),
                ("host", "current stream"),
                f"the host writes {buf}.{leaf} each call, and {buf}.{helper}() (line {copy}) "
                "copies it to the device without blocking: the next call's write may land "
                "while this call's copy is queued; no sync comes before the write, and no "
                f"call of it runs inside an input-prep section ({', '.join(sorted(sections))}), "
                "whose event sync would cover the copy",
                tuple(factors))
            f.safe = ("safe if the host waits, each call before the write, for the previous "
                      "call's copy (an event recorded after the copy and synchronized); made "
                      "safe by that sync, or by two buffers used in turn")
            yield f.scored()


def _helpers(pkg: Package, walked: Iterable[Trace]) -> dict[str, set[str]]:
    """Method name -> the host attributes of its object (and their NumPy views) that its
    non-blocking copy to the device reads."""
    out: dict[str, set[str]] = {}
    for t in walked:
        if t.cls is None:
            continue
        leaves = {o.other.split(".")[1] for o in t.ops if o.kind is K.NB_COPY
                  and o.flag == "h2d" and o.other.startswith("self.")
                  and o.other.count(".") == 1}
        if not leaves:
            continue
        facts = pkg.modules[t.file].classes.get(t.cls)
        views = {a.split(".", 1)[1] for a, target in (facts.alias.items() if facts else ())
                 if a.startswith("self.") and target.startswith("self.")
                 and target.split(".", 1)[1] in leaves}
        out.setdefault(t.qualname.rsplit(".", 1)[-1], set()).update(leaves | views)
    return out


def _sections(pkg: Package) -> set[str]:
    """Context managers of the package that sync an event on entry and record one on
    exit: the work queued inside one is waited for by the next one's entry."""
    out: set[str] = set()
    for fn in pkg.functions:
        decos = {((dotted(d.func) if isinstance(d, ast.Call) else dotted(d)) or "")
                 .rsplit(".", 1)[-1] for d in fn.node.decorator_list}
        if not decos & {"contextmanager", "asynccontextmanager"}:
            continue
        yields = [n.lineno for n in own_nodes(fn.node) if isinstance(n, ast.Yield)]
        calls = [(n.lineno, n.func.attr) for n in own_nodes(fn.node)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if yields and any(a == "synchronize" and ln < max(yields) for ln, a in calls) and \
                any(a == "record" and ln > min(yields) for ln, a in calls):
            out.add(fn.name)
    return out


def _inside(fn: Function, sections: set[str]) -> list[tuple[int, int]]:
    """The line spans of ``fn``'s ``with`` blocks that enter one of ``sections``."""
    spans = []
    for n in own_nodes(fn.node):
        if isinstance(n, (ast.With, ast.AsyncWith)) and any(
                isinstance(i.context_expr, ast.Call) and
                _name(i.context_expr) in sections for i in n.items):
            spans.append((n.lineno, n.end_lineno or n.lineno))
    return spans


def _covered(pkg: Package, fn: Function, sections: set[str], depth: int,
             seen: set[int]) -> bool:
    """Is ``fn`` called inside a section somewhere in the package, itself or through
    its callers? Then it is part of the step the section protects; its other callers
    are start-up and dummy runs, which the scan does not tell apart."""
    if depth >= _DEPTH or id(fn) in seen:
        return False
    seen = seen | {id(fn)}
    for caller, call in pkg.call_index().get(fn.name, []):
        if caller is fn or pkg.resolve(caller, call) is not fn:
            continue
        if any(a <= call.lineno <= b for a, b in _inside(caller, sections)) or \
                _covered(pkg, caller, sections, depth + 1, seen):
            return True
    return False


def _protects(pkg: Package, fn: Function, sections: set[str]) -> bool:
    """Does a method of ``fn``'s class enter a section? Then the class keeps its host
    buffers by that protocol (an engine that does not sync each step)."""
    return fn.cls is not None and any(
        m.file == fn.file and m.cls == fn.cls and _inside(m, sections) for m in pkg.functions)


def _synced_before(fn: Function, line: int) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
               n.func.attr == "synchronize" and n.lineno < line for n in own_nodes(fn.node))


def _rewrites(fn: Function, helpers: dict[str, set[str]]
              ) -> dict[str, tuple[str, int, int, str]]:
    """Buffer (``self.x``) -> (its host attribute, the first write of it, the helper's
    copy after that write, the helper) in ``fn``."""
    leaves = set().union(*helpers.values())
    bufs: dict[str, str] = {}  # local name -> self.x
    hosts: dict[str, tuple[str, str]] = {}  # local name -> (self.x, host attribute)
    writes: dict[str, tuple[str, int]] = {}
    out: dict[str, tuple[str, int, int, str]] = {}

    def buffer(e: ast.expr) -> str | None:
        if isinstance(e, ast.Name):
            return bufs.get(e.id)
        text = dotted(e) or ""
        return text if text.startswith("self.") and text.count(".") == 1 else None

    def host(e: ast.expr) -> tuple[str, str] | None:
        while isinstance(e, ast.Subscript):
            e = e.value
        if isinstance(e, ast.Name):
            return hosts.get(e.id)
        if isinstance(e, ast.Attribute) and e.attr in leaves:
            b = buffer(e.value)
            return (b, e.attr) if b else None
        return None

    nodes = sorted((n for n in own_nodes(fn.node) if isinstance(
        n, (ast.Assign, ast.AugAssign, ast.Call))), key=lambda n: (n.lineno, n.col_offset))
    for n in nodes:
        if isinstance(n, ast.Call):
            if not isinstance(n.func, ast.Attribute):
                continue
            b = buffer(n.func.value)
            if b and n.func.attr in helpers and b in writes and b not in out and \
                    writes[b][0] in helpers[n.func.attr]:
                out[b] = (*writes[b], n.lineno, n.func.attr)
            h = host(n.func.value)
            if h and n.func.attr.endswith("_") and not n.func.attr.startswith("_"):
                writes.setdefault(h[0], (h[1], n.lineno))  # x.fill_(0): in place
            continue
        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
        for t in targets:
            if isinstance(t, ast.Subscript):
                h = host(t)
                if h:
                    writes.setdefault(h[0], (h[1], n.lineno))
            elif isinstance(t, ast.Name) and isinstance(n, ast.Assign):
                bufs.pop(t.id, None)
                hosts.pop(t.id, None)
                b = buffer(n.value)
                h = host(n.value) if not isinstance(n.value, ast.Subscript) else None
                if b:
                    bufs[t.id] = b
                elif h:
                    hosts[t.id] = h
    return out


def _name(c: ast.Call) -> str:
    f = c.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
