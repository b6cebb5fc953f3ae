"""What every caller of a function in the package does for it before the call.

A function that queues work on a stream without waiting for its caller's may
rely on each caller to have waited already, and a parameter named ``stream``
may be passed the caller's current stream by every caller. Both are read from
the calls' shapes in the callers (``Package.call_index``), never from names:
a function with no caller in the package keeps what its own body says.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from streamfuzz.fuzz.scan.functions import Function
from streamfuzz.fuzz.scan.names import STREAMISH, dotted
from streamfuzz.fuzz.scan.nodes import branch_paths, own_nodes


class Package(Protocol):
    """What is read here of the package (``fuzz.scan.package.Package``, which
    imports this module): its call sites, and a call's callee."""

    @property
    def modules(self) -> Mapping[str, Any]: ...

    def call_index(self) -> Mapping[str, Sequence[tuple[Function, ast.Call]]]: ...

    def resolve(self, caller: Function, call: ast.Call) -> Function | None: ...

    def constructed(self, caller: Function, call: ast.Call) -> Function | None: ...

_CURRENT_CALLS = {"current_stream", "default_stream"}
_WAITS = {"wait_stream", "wait_event"}


def _sites(pkg: Package, fn: Function) -> list[tuple[Function, ast.Call]]:
    """The calls of ``fn`` in the package; for an ``__init__``, its class's
    constructions (``Cls(...)``) too, whose arguments are its parameters."""
    sites = [(caller, call) for caller, call in pkg.call_index().get(fn.name, ())
             if caller is not fn and pkg.resolve(caller, call) is fn]
    if fn.name == "__init__" and fn.cls is not None:
        sites += [(caller, call) for caller, call in pkg.call_index().get(fn.cls, ())
                  if caller is not fn and pkg.constructed(caller, call) is fn]
    return sites


def has_callers(pkg: Package, fn: Function) -> bool:
    """Is ``fn`` called anywhere in the package, where the caller's walk lends its
    effects (a construction does not lend ``__init__``'s)?"""
    return any(caller is not fn and pkg.resolve(caller, call) is fn
               for caller, call in pkg.call_index().get(fn.name, ()))


def _arg(fn: Function, call: ast.Call, param: str) -> ast.expr | None:
    """The argument ``call`` passes as ``fn``'s ``param``, if it names one."""
    arg = next((k.value for k in call.keywords if k.arg == param), None)
    names = [p.arg for p in fn.params()]
    if arg is None and param in names and names.index(param) < len(call.args):
        arg = call.args[names.index(param)]
    return None if isinstance(arg, ast.Starred) else arg


def _as_caller_names(fn: Function, call: ast.Call, stream: str, recv: str | None) -> str | None:
    """The expression, in the caller's words, of what ``fn`` calls ``stream``."""
    head, dot, rest = stream.partition(".")
    if recv is not None and head == recv and isinstance(call.func, ast.Attribute):
        return ast.unparse(call.func.value) + dot + rest
    arg = _arg(fn, call, head)
    if arg is not None:
        text = dotted(arg)
        return text + dot + rest if text else None
    return None


def entry_waits(pkg: Package, fn: Function, streams: set[str], recv: str | None,
                depth: int = 0) -> set[str]:
    """The streams of ``streams`` that every caller of ``fn`` makes wait (a
    ``wait_stream`` or ``wait_event`` on them, on every path to the call) before it;
    a caller that does not may itself be entered so by every one of its callers (one
    level more: ``commit()`` waits, then calls ``offload()``, which calls ``_flush()``)."""
    sites = _sites(pkg, fn)
    if not sites:
        return set()
    out = set()
    for s in sorted(streams):
        for caller, call in sites:
            there = _as_caller_names(fn, call, s, recv)
            if there is None:
                break
            if not _waits_before(caller, call, there) and (depth >= 1 or there not in entry_waits(
                    pkg, caller, {there}, caller.receiver(), depth + 1)):
                break
        else:
            out.add(s)
    return out


def _waits_before(caller: Function, call: ast.Call, stream: str) -> bool:

    paths = branch_paths(caller.node)
    here = paths.get(id(call), ())
    for node in own_nodes(caller.node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in _WAITS and node.lineno < call.lineno and \
                dotted(node.func.value) == stream:
            there = paths.get(id(node), ())
            if there == here[:len(there)]:
                return True  # on every path to the call: the branches that hold it
    return False


def current_stream_params(pkg: Package, fn: Function) -> set[str]:
    """The stream parameters of ``fn`` that every caller passes its current stream:
    ``current_stream()`` itself, or a name or attribute it was saved in."""
    params = [p.arg for p in fn.params() if STREAMISH.search(p.arg) or (
        p.annotation is not None and "Stream" in ast.unparse(p.annotation))]
    if not params:
        return set()
    sites = _sites(pkg, fn)
    if not sites:
        return set()
    out = set()
    for p in params:
        if all(_passes_current(pkg, caller, call, _arg(fn, call, p)) for caller, call in sites):
            out.add(p)
    return out


def _passes_current(pkg: Package, caller: Function, call: ast.Call, arg: ast.expr | None) -> bool:
    """Is ``arg`` the stream current where ``call`` runs? ``current_stream()`` there,
    or one saved before, where no stream context entered since is around the call."""
    if isinstance(arg, ast.Call):
        return _current_call(arg)
    return _is_current(pkg, caller, arg) and not _under_stream_context(caller, call)


def _under_stream_context(caller: Function, call: ast.Call) -> bool:

    for node in own_nodes(caller.node):
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                n is call for n in ast.walk(node)) and any(
                "stream" in ast.unparse(item.context_expr).lower() for item in node.items):
            return True
    return False


def _current_call(node: ast.expr) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return f is not None and (f.attr if isinstance(f, ast.Attribute) else getattr(
        f, "id", "")) in _CURRENT_CALLS


def _is_current(pkg: Package, caller: Function, arg: ast.expr | None) -> bool:
    """Is ``arg`` the caller's current stream: the call, or a name every binding of
    which in the caller is that call (an attribute: the class's saved one)?"""
    from streamfuzz.fuzz.scan.ops import CURRENT

    if arg is None:
        return False
    if isinstance(arg, ast.Call):
        return _current_call(arg)
    name = dotted(arg)
    if name is None:
        return False
    facts = pkg.modules[caller.file].classes.get(caller.cls or "")
    if name.startswith("self.") and facts is not None and facts.alias.get(name) == CURRENT:
        return True
    made = [n.value for n in own_nodes(caller.node) if isinstance(n, ast.Assign) and any(
        dotted(t) == name for t in n.targets)]
    return bool(made) and all(_current_call(v) for v in made)
