"""Streams a package's own loop or thread keeps current, and the functions that
order their work after the current stream only, without ever naming them.

An overlap scheduler runs its forward pass on a stream of its own, entered by a
method its event loop (or a thread) calls; a cache controller elsewhere orders
its loads after "the current stream" with an event it records, and hands that
event to the engine that does the copy. Whether the forward stream touches the
loaded pages is a question of the package's bookkeeping (page allocators,
indices), which no dataflow the scan follows links; the published bug of this
shape was found only at run time. A rule that flagged every such function
would nearly double a report, so each is reported once, at a low score, naming
the owner's stream and sending the reader to the dynamic check.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from streamfuzz.fuzz.scan.hazards import TEST_PATH, Finding, Hazard
from streamfuzz.fuzz.scan.names import dotted
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import CURRENT, K, Trace
from streamfuzz.fuzz.scan.package import Function, Package

DYNAMIC_CHECK = "pytest --streamfuzz (or python -m streamfuzz check)"
_CONTEXTS = {"stream", "StreamContext", "use_stream"}


class Owner(NamedTuple):
    """A stream kept on an object and entered by ``function``, which a loop or a
    thread of the package runs."""

    stream: str  # the attribute's name, as every user of the object spells it
    function: Function
    line: int
    how: str


def owners(pkg: Package) -> list[Owner]:
    """Object streams entered by a function that a loop or thread of the package runs."""
    looped = _loop_callees(pkg)
    found: dict[str, Owner] = {}
    for fn in pkg.functions:
        if "stream" not in fn.text.lower():
            continue
        facts = pkg.modules[fn.file].classes.get(fn.cls or "")
        threaded = (fn.file, fn.name) in pkg.thread_targets
        how = "a thread" if threaded else "a loop" if fn.name in looped else ""
        in_loop = {id(n) for w in own_nodes(fn.node) if isinstance(w, ast.While)
                   for n in ast.walk(w)}
        for node in own_nodes(fn.node):
            if not isinstance(node, (ast.With, ast.AsyncWith)) or not (
                    how or id(node) in in_loop):
                continue
            for item in node.items:
                attr = _entered_attribute(item.context_expr, facts.contexts if facts else {})
                if attr and attr not in found:
                    found[attr] = Owner(attr, fn, node.lineno, how or "a loop")
    return sorted(found.values(), key=lambda o: (o.function.file, o.line))


def _entered_attribute(ctx: ast.expr, contexts: dict[str, str]) -> str:
    """``self.X`` entered by ``with ...stream(self.X)`` or a kept context of it: X."""
    if isinstance(ctx, ast.Call) and isinstance(ctx.func, ast.Attribute) and \
            ctx.func.attr in _CONTEXTS and ctx.args:
        text = dotted(ctx.args[0]) or ""
    else:
        text = contexts.get(dotted(ctx) or "", "")
    return text.split(".", 1)[1] if text.startswith("self.") and text.count(".") == 1 else ""


def _loop_callees(pkg: Package) -> set[str]:
    """The names called on ``self`` inside a ``while`` loop, or by a thread's function."""
    out: set[str] = set()
    for fn in pkg.functions:
        threaded = (fn.file, fn.name) in pkg.thread_targets
        bodies = [fn.node] if threaded else [n for n in own_nodes(fn.node)
                                             if isinstance(n, ast.While)]
        for body in bodies:
            for n in ast.walk(body):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        dotted(n.func.value) == "self":
                    out.add(n.func.attr)
    return out


def unseen_owners(pkg: Package, traces: Iterable[Trace]) -> Iterator[Finding]:
    """A function that records an event on its current stream and hands it to a call
    (the callee's work waits on it), where a loop or thread of a module beside
    it (the same folder) keeps another stream current that it never names."""
    found = owners(pkg)
    if not found:
        return
    folders = {_folder(o.function.file) for o in found}
    walked = {(t.file, t.qualname): t for t in traces}
    for fn in sorted(pkg.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
        if _folder(fn.file) not in folders or ".record(" not in fn.text or any(
                o.function is fn for o in found):
            continue  # an event recorded here, beside an owner: walked even with no "stream"
        t = walked.get((fn.file, fn.qualname)) or pkg.walk(fn)
        line = _ordered_after_current_only(t, fn) if not t.thread else 0
        unnamed = [o for o in found if o.stream not in fn.text and
                   _folder(o.function.file) == _folder(fn.file)]
        if not line or not unnamed:
            continue
        names = ", ".join(dict.fromkeys(o.stream for o in unnamed))
        o = unnamed[0]
        factors = ["owner-unseen", *(["test-code"] if TEST_PATH.search(t.file) else [])]
        yield Finding(
            Hazard.UNORDERED, t.file, line, t.qualname, (), (CURRENT, *dict.fromkeys(
                o.stream for o in unnamed)),
            f"work ordered after the current stream only; {names}, kept current by "
            f"{o.function.qualname} ({o.function.file}:{o.line}, run by {o.how}), never "
            "named here: whether it touches the same memory cannot be told from the "
            f"source; check with {DYNAMIC_CHECK}", tuple(factors),
            safe=f"safe if nothing {names} runs touches what this work reads or writes "
                 "while it is pending; made safe by waiting for it (an event it records) "
                 "before the work; the scan cannot decide this, the dynamic check "
                 "can").scored()


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def _ordered_after_current_only(t: Trace, fn: Function) -> int:
    """The line of an event recorded on the current stream and handed to a call (the
    only ordering the callee's work gets), or 0. Any side stream ordered after the
    current stream only would flood the report (docs/scan.md, "Recall")."""
    for o in t.ops:
        if o.kind is K.EVENT_RECORD and o.stream == t.base and not _timing(t, fn, o.key) \
                and _handed(fn, o.key, o.line):
            return o.line
    return 0


def _timing(t: Trace, fn: Function, event: str) -> bool:
    """Is ``event`` made here to time work (``Event(enable_timing=True)``) and not waited
    on here, or read by ``elapsed_time`` here? Handing it on then orders nothing."""
    last = event.rsplit(".", 1)[-1]
    waited = any(o.kind in (K.WAIT_EVENT, K.HOST_SYNC) and o.key == event for o in t.ops)
    timed = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
                n.func.attr == "elapsed_time" and any(
                    (dotted(x) or "").rsplit(".", 1)[-1] == last
                    for x in (n.func.value, *n.args)) for n in own_nodes(fn.node))
    return timed or (event in t.timing_events and not waited)


def _handed(fn: Function, event: str, line: int) -> bool:
    """Is ``event`` passed to a call (not its own record/wait) after ``line``? Matched by
    its last name, as an alias (``ev = self.events[i]``) keys it by what it names."""
    last = event.rsplit(".", 1)[-1]
    for node in own_nodes(fn.node):
        if not isinstance(node, ast.Call) or node.lineno < line or (
                isinstance(node.func, ast.Attribute) and node.func.attr in ("record", "wait")):
            continue
        for a in [*node.args, *(k.value for k in node.keywords)]:
            text = dotted(a) or ""
            if text == event or (text.rsplit(".", 1)[-1] == last and "." in text):
                return True
    return False
