"""The hazards seen across a package, not in one function's ops: streams and
events kept at module level, and calls that leave out an ordering argument
another call of the same function passes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from streamfuzz.fuzz.scan.hazards import TEST_PATH, Finding, Hazard
from streamfuzz.fuzz.scan.names import dotted
from streamfuzz.fuzz.scan.ops import CURRENT
from streamfuzz.fuzz.scan.package import Function, ModuleCache, Package


def cached_streams(caches: Iterable[ModuleCache]) -> Iterator[Finding]:
    for c in caches:
        factors = ["test-code"] if TEST_PATH.search(c.file) else []
        yield Finding(Hazard.CACHED_STREAM, c.file, c.line, c.name, (), (c.name,),
                      f"a {c.what} {c.how}: its users must each order it against their own "
                      "stream, and it belongs to the device current when it was made",
                      tuple(factors)).scored()


def sibling_omissions(pkg: Package) -> Iterator[Finding]:
    """Calls that leave out an ordering argument another call of the same function passes."""
    optional = pkg.optional_waits()
    sites: dict[str, list[tuple[Function, ast.Call]]] = {}
    for fn, call in pkg.call_sites(set(optional)):
        f = call.func
        # call_sites yields calls of a Name or an Attribute only.
        sites.setdefault(f.attr if isinstance(f, ast.Attribute) else f.id, []).append(  # type: ignore[attr-defined]
            (fn, call))
    for name, calls in sorted(sites.items()):
        params = {p for _, p, _ in optional[name]}
        if name.startswith("__") or len(params) != 1 or len(optional[name]) != len(
                pkg.by_name.get(name, ())):
            continue  # every function of that name must take the same ordering argument
        for callee, param, pos in optional[name][:1]:
            passing = [(fn, c) for fn, c in calls if _passes(c, param, pos)]
            omitting = [(fn, c) for fn, c in calls if not _passes(c, param, pos)]
            if not passing or not omitting:
                continue
            ref_fn, ref = passing[0]
            for fn, c in omitting:
                factors = ["sibling-passes"]
                if TEST_PATH.search(fn.file):
                    factors.append("test-code")
                if (fn.file, fn.name) in pkg.thread_targets:
                    factors.append("thread")
                args = [dotted(a) or "" for a in c.args]
                yield Finding(
                    Hazard.UNORDERED, fn.file, c.lineno, fn.qualname,
                    tuple(a for a in args if a), (CURRENT, f"{name}'s stream"),
                    f"calls {name}() without {param}=, which {ref_fn.file}:{ref.lineno} "
                    f"passes to order {name}'s stream work after the caller's",
                    tuple(factors), extra={"callee": f"{callee.file}:{callee.node.lineno}"}
                ).scored()


def _passes(call: ast.Call, param: str, pos: int) -> bool:
    """Does ``call`` give ``param`` (by name, by position, or maybe through ``*``/``**``)?"""
    return any(k.arg in (param, None) for k in call.keywords) or len(call.args) > pos \
        or any(isinstance(a, ast.Starred) for a in call.args)
