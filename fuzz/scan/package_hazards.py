"""The hazards seen across a package, not in one function's ops: streams and
events kept at module level, calls that leave out an ordering argument
another call of the same function passes, an object's tensor that one
method leaves in use on a side stream and another frees, and one that a method
leaves being copied to the host and another reads there.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from streamfuzz.fuzz.scan.hazards import (
    TEST_PATH,
    Finding,
    Hazard,
    pending_attributes,
    unordered_frees,
    waits_on,
)
from streamfuzz.fuzz.scan.names import HOSTISH, dotted
from streamfuzz.fuzz.scan.nodes import own_nodes
from streamfuzz.fuzz.scan.ops import BLOCKING_READS, CURRENT, K, Op, Trace
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
            # passed only by work another thread runs: there it carries the submitter's
            # stream to a thread whose current stream is another; it says nothing of a
            # call on the caller's own thread
            threaded = all(_on_thread(pkg, f) for f, _ in passing)
            for fn, c in omitting:
                if threaded and not _on_thread(pkg, fn):
                    continue
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


def _on_thread(pkg: Package, fn: Function) -> bool:
    return (fn.file, fn.name) in pkg.thread_targets


def _passes(call: ast.Call, param: str, pos: int) -> bool:
    """Does ``call`` give ``param`` (by name, by position, or maybe through ``*``/``**``)?"""
    return any(k.arg in (param, None) for k in call.keywords) or len(call.args) > pos \
        or any(isinstance(a, ast.Starred) for a in call.args)


def attribute_lifetimes(pkg: Package, traces: Iterable[Trace]) -> Iterator[Finding]:
    """An attribute one method leaves in use on a side stream (no ``record_stream``, no
    wait after) and another method of the class frees (``del``, rebinding, a storage
    resize, through helpers) with no wait for that stream first."""
    by_class: dict[tuple[str, str], list[Trace]] = {}
    for t in traces:
        if t.cls is not None:
            by_class.setdefault((t.file, t.cls), []).append(t)
    for (file, cls), walked in sorted(by_class.items()):
        pending = {(t.qualname, k): v for t in walked for k, v in pending_attributes(t).items()}
        if not pending:
            continue
        known = {t.qualname: t for t in walked}
        by_name = {fn.qualname: fn for fn in pkg.functions if fn.file == file}
        frees: dict[tuple[str, str], list[tuple[Trace, int]]] = {}
        methods: list[Trace] = []
        for fn in pkg.functions:
            if fn.file != file or fn.cls != cls:
                continue
            t = known.get(fn.qualname) or pkg.walk(fn)
            methods.append(t)
            if fn.name == "__init__":
                continue
            for (owner, k), (stream, use_line, _) in sorted(pending.items()):
                # another method's rebinding may be its setup; only a drop says it frees
                lines = unordered_frees(t, k, stream, rebound=owner == fn.qualname)
                if owner == fn.qualname:  # a previous call's use, freed before this call's
                    lines = [ln for ln in lines if ln < use_line]
                if lines:
                    frees.setdefault((owner, k), []).append((t, lines[0]))
        for (owner, k), sites in sorted(frees.items()):
            stream, use_line, event = pending[(owner, k)]
            # an event recorded after the use, or a handle the use's call gave back
            # (an awaitable kept on the object), that another method waits on: a protocol
            handles = [event] if event else []
            handles += _kept_handles(by_name.get(owner), use_line)
            handed = any(waits_on(m, h) for m in methods for h in handles)
            sites = _uncovered(sites, methods)
            # where a method drops it through another method that does, the latter says it
            names = {t.qualname.rsplit(".", 1)[-1] for t, _ in sites}
            for t, line in sites:
                if any(c[0] in names and c[1] == line for c in t.calls):
                    continue
                factors = ["freed", "object-state",
                           "previous-call" if owner == t.qualname else "other-method",
                           *(["consumed-elsewhere"] if handed else [])]
                if TEST_PATH.search(file):
                    factors.append("test-code")
                yield Finding(
                    Hazard.LIFETIME, file, line, t.qualname, (k,), (stream, CURRENT),
                    f"{k} is left in use on {stream} by {owner} (line {use_line}: no "
                    f"record_stream, no wait after it); {t.qualname} drops it here with "
                    f"no wait for {stream}" + (f" (another method waits on {event}, "
                                               "recorded after that use)" if handed else ""),
                    tuple(factors)).scored()


def _uncovered(sites: list[tuple[Trace, int]], methods: list[Trace]) -> list[tuple[Trace, int]]:
    """The sites left once a method whose every caller in the class orders the free
    (the caller is no site itself, or is covered) is dropped."""
    def name(t: Trace) -> str:
        return t.qualname.rsplit(".", 1)[-1]

    open_ = {name(t) for t, _ in sites}
    while True:
        covered = set()
        for m in open_:
            callers = {name(t) for t in methods if any(c[0] == m for c in t.calls)} - {m}
            if callers and not callers & open_:
                covered.add(m)
        if not covered:
            return [(t, line) for t, line in sites if name(t) in open_]
        open_ -= covered


def _kept_handles(fn: Function | None, line: int) -> list[str]:
    """``self.x`` bound to a call's result at or after ``line`` in ``fn``: a handle to
    work the call started (``self._pending = self._launch_async()``)."""
    if fn is None:
        return []

    return sorted({dotted(t) or "" for n in own_nodes(fn.node) if isinstance(n, ast.Assign)
                   and n.lineno >= line and isinstance(n.value, ast.Call)
                   for t in n.targets if (dotted(t) or "").startswith("self.")})


def attribute_d2h_reads(pkg: Package, traces: Iterable[Trace]) -> Iterator[Finding]:
    """An attribute one method fills by a ``non_blocking`` device-to-host copy and leaves
    in flight (no host sync after it there), read by the host in another method of the
    class with no sync first that covers the copy: the reader runs in the next step of an
    engine that avoids syncs on purpose, so nothing says the copy has landed."""
    by_class: dict[tuple[str, str], list[Trace]] = {}
    for t in traces:
        if t.cls is not None:
            by_class.setdefault((t.file, t.cls), []).append(t)
    views = _numpy_views(pkg)
    for (file, cls), walked in sorted(by_class.items()):
        pending = {k: (t, i) for t in walked for k, i in _pending_d2h(t, views).items()}
        if not pending:
            continue
        known = {t.qualname: t for t in walked}
        methods = [known.get(fn.qualname) or pkg.walk(fn) for fn in pkg.functions
                   if fn.file == file and fn.cls == cls and fn.name != "__init__"]
        for k, (owner, i) in sorted(pending.items()):
            after = {o.key for o in owner.ops[i + 1:] if o.kind is K.EVENT_RECORD}
            for t in methods:
                if t.qualname == owner.qualname or _copies(t, k, views) or \
                        _synced_by_callers(t, methods, after):
                    continue
                read = _unsynced_read(t, k, views, after)
                if read is None:
                    continue
                factors = ["object-state", "other-method"]
                if TEST_PATH.search(file):
                    factors.append("test-code")
                yield Finding(
                    Hazard.UNSYNCED_D2H, file, read, t.qualname, (k,), (CURRENT,),
                    f"the host reads {k}, which {owner.qualname} fills by a non_blocking "
                    f"copy from the device (line {owner.ops[i].line}) and leaves in flight; "
                    "no sync that covers the copy comes before this read here",
                    tuple(factors)).scored()
                break  # one reader names the copy


def _numpy_views(pkg: Package) -> dict[str, str]:
    """Attribute names bound to a NumPy view of another attribute in some class of the
    package (``self.x_np = self.x.numpy()``): ``x_np`` -> ``x``. An object's two
    attributes are one memory wherever they are read, in any class."""
    out: dict[str, str] = {}
    for m in pkg.modules.values():
        for facts in m.classes.values():
            for name, target in facts.alias.items():
                if name.startswith("self.") and target.startswith("self.") and \
                        target in facts.tensors | facts.host:
                    out[name.split(".", 1)[1]] = target.split(".", 1)[1]
    return out


def _storage(key: str, views: dict[str, str]) -> str:
    head, _, leaf = key.rpartition(".")
    return f"{head}.{views[leaf]}" if head and leaf in views else key


def _pending_d2h(t: Trace, views: dict[str, str]) -> dict[str, int]:
    """The attributes ``t`` copies into from the device without blocking, with no host
    sync after the copy: attribute -> the copy's op index."""
    out: dict[str, int] = {}
    for i, o in enumerate(t.ops):
        if o.kind is K.NB_COPY and o.flag == "d2h" and o.key.startswith("self.") and \
                not any(s.kind is K.HOST_SYNC for s in t.ops[i + 1:]):
            out.setdefault(_storage(o.key, views), i)
    return out


def _copies(t: Trace, key: str, views: dict[str, str]) -> bool:
    """Does ``t`` copy ``key`` to or from the device itself (a non-blocking copy, or a
    line that reads it and writes device memory)? Then it is the buffer's own helper
    (``copy_to_gpu``), whose slicing of the host half reads no values."""
    def device(k: str) -> bool:
        return k not in t.host and not HOSTISH.search(k.rsplit(".", 1)[-1])

    read = {o.line for o in t.ops if o.kind is K.USE and _storage(o.key, views) == key}
    return any(o.kind is K.NB_COPY and key in (_storage(o.key, views), _storage(o.other, views))
               or o.kind is K.USE and o.write and o.line in read and device(o.key)
               for o in t.ops)


def _covers(o: Op, t: Trace, after: set[str]) -> bool:
    """Does ``o`` block the host until a copy queued before ``after``'s records has
    run? A device or stream sync, a device read, or a sync of one of those events; an
    event a helper syncs covers only what came before its record, which is not known."""
    if o.kind is K.HOST_READ:
        return o.flag in BLOCKING_READS and o.key not in t.host
    return o.kind is K.HOST_SYNC and o.flag != "event" and (
        o.key in ("", t.base) or o.key in t.streams or o.key in after)


def _unsynced_read(t: Trace, key: str, views: dict[str, str], after: set[str]) -> int | None:
    """The line of ``t``'s first host read of ``key`` with no covering sync before it: an
    index or a host function of it, or its values written into another host buffer
    (``self.counts.np[:n] = self.batch.counts_cpu[:n]``). The source of a copy to the
    device is no host read."""
    copied = {o.line for o in t.ops if o.kind is K.NB_COPY}
    filled = {o.line for o in t.ops if o.kind is K.HOST_WRITE}
    synced: list[Op] = []  # each covering sync so far
    for o in t.ops:
        if _covers(o, t, after):
            synced.append(o)
        elif (o.kind is K.HOST_READ or o.kind is K.KEEP and o.line in filled) and \
                o.line not in copied and _storage(o.key, views) == key:
            if any(t.on_path(x, o.guards) for x in synced):
                return None  # a sync on the read's own path (not one in a branch left)
            return o.line
    return None


def _synced_by_callers(t: Trace, methods: list[Trace], after: set[str]) -> bool:
    """Does every method of the class that calls ``t`` sync the host before the call?"""
    name = t.qualname.rsplit(".", 1)[-1]
    sites = [(m, c[1]) for m in methods for c in m.calls if c[0] == name and m is not t]
    return bool(sites) and all(any(_covers(o, m, after) and o.line < line for o in m.ops)
                               for m, line in sites)
