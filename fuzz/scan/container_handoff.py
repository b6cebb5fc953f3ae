"""Values handed between functions through an object's containers.

One function puts what work on a side stream made into a container kept on an
object (``ctx.requests[name] = out``); another takes it out there (``.pop``,
``.get``, an index) and uses it on its own stream. Neither function alone shows
the hand-off: the producer's stream may be one its caller entered, and the
consumer never names it. A value taken so and used with no ``record_stream`` for
the taker's stream is freed, when its last reference goes, to the producer
stream's pool, which may hand the block out again while the taker's work on it
is queued (the caching allocator's contract). The container is an attribute of
an object handed around (a context, a parameter), not the function's own
``self.x``: it is matched by its attribute's name across the package, and only
where its producer ran on a side stream.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from streamfuzz.fuzz.scan.hazards import TEST_PATH, Finding, Hazard
from streamfuzz.fuzz.scan.names import dotted
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import ANY, CURRENT, SUBMITTER, THREAD, K, Op, Trace
from streamfuzz.fuzz.scan.package import Function, Package

_STORE = re.compile(r"\.\w+\[[^\]\n]*\]\s*=[^=]|\.\w+\.append\(")
_TAKE = {"pop", "get", "popleft", "popitem"}
_NOT_TENSOR = re.compile(r"(^|_)(event|events|stream|streams|lock|name|names)$", re.I)
_BASES = {CURRENT, THREAD, SUBMITTER, ANY, ""}


@dataclass(frozen=True)
class _Put:
    fn: Function
    line: int
    stream: str  # the side stream the value was made on


def container_handoffs(pkg: Package, walked: Iterable[Trace]) -> Iterator[Finding]:
    """A value taken out of an object's container, made there by another function's work
    on a side stream, and used by the taker's stream with no ``record_stream``."""
    known = {(t.file, t.qualname): t for t in walked}
    puts = _puts(pkg, known)
    if not puts:
        return
    for fn in sorted(pkg.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
        attrs = [a for a in sorted(puts) if f".{a}" in fn.text]
        if not attrs:
            continue
        takes = _takes(fn, set(attrs))
        if not takes:
            continue
        t = known.get((fn.file, fn.qualname)) or pkg.walk(fn)
        for attr, (line, taken, names) in sorted(takes.items()):
            producers = [p for p in puts[attr] if p.fn is not fn]
            if not producers:
                continue
            streams = sorted({p.stream for p in producers})
            if names & {o.key.split(".")[0] for o in t.ops if o.kind is K.RECORD}:
                continue  # the taker records it for its stream
            used = [o for o in t.ops if o.kind is K.USE and o.line > line
                    and o.key.split(".")[0] in names and o.stream not in streams]
            if not used:
                used = _returned(fn, line, names, t.base)
            if not used:
                continue
            p = producers[0]
            factors = ["object-state", "other-method"]
            if TEST_PATH.search(fn.file):
                factors.append("test-code")
            f = Finding(
                Hazard.LIFETIME, fn.file, line, fn.qualname, (taken,),
                (*streams, _show(used[0].stream)),
                f"{taken} is taken out of .{attr}, which {p.fn.qualname} "
                f"({p.fn.file}:{p.line}) fills with what work on {', '.join(streams)} made; "
                f"it is used here on the {_show(used[0].stream)} (line {used[0].line}) "
                "with no record_stream, so when it is dropped its block goes back to "
                f"{streams[0]}'s pool while this stream's work on it may be queued",
                tuple(factors))
            f.safe = (f"safe if every reference is held until the {_show(used[0].stream)} "
                      f"has passed its work on it; made safe by "
                      f"{taken}.record_stream(current stream) where it is taken (or on "
                      "the tensors it holds)")
            yield f.scored()


def _returned(fn: Function, line: int, names: set[str], base: str) -> list[Op]:
    """The taken value returned after ``line`` inside what it is returned in (``return
    LazyNoWait(out)``, a record that only holds it): the caller's use, on its stream."""
    for node in own_nodes(fn.node):
        if isinstance(node, ast.Return) and node.value is not None and node.lineno > line \
                and not isinstance(node.value, (ast.Name, ast.Attribute)) and any(
                    isinstance(x, ast.Name) and x.id in names for x in ast.walk(node.value)):
            return [Op(K.USE, node.lineno, stream=base or CURRENT)]
    return []


def _show(stream: str) -> str:
    return "current stream" if stream == CURRENT else stream


def _puts(pkg: Package, known: dict[tuple[str, str], Trace]) -> dict[str, list[_Put]]:
    """Container attribute -> where a value made by a call on a side stream is put in it."""
    out: dict[str, list[_Put]] = {}
    for fn in sorted(pkg.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
        if not _STORE.search(fn.text):
            continue
        made = _made_by_calls(fn)
        t = known.get((fn.file, fn.qualname))
        for name in (t.events | t.recorded | t.streams) if t is not None else ():
            made.pop(name, None)  # an event or a stream handed on is no tensor
        for attr, line, made_line in _stores(fn, made):
            stream = _stream_at(pkg, known, fn, made_line)
            if stream:
                out.setdefault(attr, []).append(_Put(fn, line, stream))
    return out


def _made_by_calls(fn: Function) -> dict[str, int]:
    """Local names bound to what a call returns -> the line of that binding."""
    out: dict[str, int] = {}
    for n in own_nodes(fn.node):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and len(n.targets) == 1 \
                and isinstance(n.targets[0], ast.Name):
            out.setdefault(n.targets[0].id, n.lineno)
    return out


def _stores(fn: Function, made: dict[str, int]) -> Iterator[tuple[str, int, int]]:
    """(container attribute, line of the store, line the value was made) for each value
    that a call made put into an attribute's container: ``x.attr[k] = v`` or
    ``x.attr.append(v)``."""
    for n in own_nodes(fn.node):
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                n.targets[0], ast.Subscript):
            target, value = n.targets[0].value, n.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr == "append" and len(n.args) == 1:
            target, value = n.func.value, n.args[0]
        if not isinstance(target, ast.Attribute) or dotted(target) is None or \
                _NOT_TENSOR.search(target.attr) or _own(target):
            continue
        if isinstance(value, ast.Call):
            yield target.attr, n.lineno, n.lineno  # type: ignore[attr-defined]
        elif isinstance(value, ast.Name) and value.id in made and \
                not _NOT_TENSOR.search(value.id):
            yield target.attr, n.lineno, made[value.id]  # type: ignore[attr-defined]


def _stream_at(pkg: Package, known: dict[tuple[str, str], Trace], fn: Function,
               line: int) -> str:
    """The side stream current at ``line`` of ``fn``: its own (a stream context it
    entered), else the one every caller in the package calls it under; '' if none."""
    t = known.get((fn.file, fn.qualname))
    here = t.at.get(line, t.base) if t is not None else CURRENT
    if here not in _BASES:
        return here
    sites = pkg.call_index().get(fn.name, [])
    streams: set[str] = set()
    for caller, call in sites:
        ct = known.get((caller.file, caller.qualname))
        on = next((c[4] for c in ct.calls if c[0] == fn.name and c[1] == call.lineno),
                  "") if ct is not None else ""
        if on in _BASES:
            return ""
        streams.add(on)
    return ", ".join(sorted(streams))


def _takes(fn: Function, attrs: set[str]) -> dict[str, tuple[int, str, set[str]]]:
    """Container attribute -> (the line where ``fn`` first takes a value out of it, the
    name it is bound to, the local names that hold the value or what is read from it)."""
    out: dict[str, tuple[int, str, set[str]]] = {}
    nodes = sorted((n for n in own_nodes(fn.node) if isinstance(n, (ast.Assign, ast.For))),
                   key=lambda n: (n.lineno, n.col_offset))
    for n in nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                n.targets[0], ast.Name):
            attr = _taken(n.value, attrs)
            if attr and attr not in out:
                out[attr] = (n.lineno, n.targets[0].id, {n.targets[0].id})
    for line, _, names in out.values():  # what is read from the value, through calls
        for n in nodes:
            if n.lineno <= line:
                continue
            value = n.value if isinstance(n, ast.Assign) else n.iter
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if _root(value) in names:
                names |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
    return out


def _taken(value: ast.expr, attrs: set[str]) -> str | None:
    """The container attribute ``value`` takes an item out of (``x.attr.pop(k)``,
    ``x.attr[k]``, ``x.attr.get(k)``, or a call on that item), or None."""
    node: ast.expr = value
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            inner = node.func.value
            if isinstance(inner, ast.Attribute) and inner.attr in attrs and \
                    node.func.attr in _TAKE and not _own(inner):
                return inner.attr
            node = inner
        elif isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Attribute) and node.value.attr in attrs and \
                    not _own(node.value):
                return node.value.attr
            node = node.value
        else:
            return None


def _own(container: ast.Attribute) -> bool:
    """Is the container an attribute of the function's own object (``self.out``)? Then
    it is that class's state, which another class's attribute of the same name is not."""
    return isinstance(container.value, ast.Name) and container.value.id in ("self", "cls")


def _root(value: ast.expr) -> str | None:
    """The local name a chain of calls, attributes and indexes starts from."""
    node: ast.expr = value
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None
