"""The package a scan reads, parsed once: its functions, what each class's
attributes are, which functions threads run, streams and events kept at module
level, and what a same-package callee does to ordering.

Every function is walked (``streamfuzz.fuzz.scan.streams_ast``) with the facts of its
class and module, and with ``effects`` answering for its calls into the same
package, so a wait or a ``record_stream`` done in a helper counts where the
helper is called.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from streamfuzz.fuzz.scan import callers, host_args
from streamfuzz.fuzz.scan.functions import Function
from streamfuzz.fuzz.scan.names import (
    DEVICE_MODULES,
    MAPPING_ANN,
    MODULES,
    OTHER_FRAMEWORKS,
    dotted,
    is_scalar_annotation,
)
from streamfuzz.fuzz.scan.nodes import own_nodes as _own_nodes
from streamfuzz.fuzz.scan.ops import (
    ANY,
    CURRENT,
    OWN,
    STORAGE,
    SUBMITTER,
    THREAD,
    ClassFacts,
    K,
    Op,
    Trace,
)
from streamfuzz.fuzz.scan.sources import SourceFile
from streamfuzz.fuzz.scan.streams_ast import Walker

_CACHE_DECORATORS = {"lru_cache", "cache", "cached_property", "cached"}
# An ordering argument is named for what it is: its last word an event, a fence or a
# wait (``wait_event``, ``ready_events``, ``fence``), or it starts with a wait
# (``wait_for``); ``event_backend`` or ``expected_event_type`` name something else.
_OPTIONAL_WAIT = re.compile(r"(^|_)(wait|waits|fence|fences|event|events)$|^wait(_|$)", re.I)
_MAKES_STREAM = {"Stream": "stream", "ExternalStream": "stream", "Event": "event"}
_DEPTH = 4  # how deep callee effects are followed
_MAX_EFFECTS = 24  # uses of a callee's parameters lent to its callers, at most


class Effect(NamedTuple):
    """What a callee does, seen from its caller: ``wait`` (it orders some stream
    unconditionally), ``sync`` (the host waits), ``record`` (record_stream on
    ``param``+``suffix``), ``use`` (its work on the caller's stream touches them),
    ``free`` (it drops the argument's attribute ``suffix``); ``flag`` is a use's
    (``ops.COPY_SOURCE``), or a sync's (``event``: an event's, which covers only the
    work queued before the event was recorded)."""

    what: str
    param: str = ""
    suffix: str = ""
    write: bool = False
    flag: str = ""


@dataclass
class ModuleCache:
    """A stream or event kept beyond one call at module or class level."""

    file: str
    line: int
    name: str
    what: str  # stream | event
    how: str


@dataclass
class Module:
    path: str
    tree: ast.Module
    lines: list[str]
    facts: ClassFacts = field(default_factory=ClassFacts)
    classes: dict[str, ClassFacts] = field(default_factory=dict)
    host: frozenset[str] = frozenset()  # its names for threading, asyncio, multiprocessing


class Package:
    def __init__(self, files: Iterable[SourceFile]) -> None:
        self.modules: dict[str, Module] = {}
        self.unparsed: list[str] = []
        self.quiet_attributes: set[str] = set()  # attributes named in files not read
        self.records: set[str] = set()
        """Classes declared as dataclasses or named tuples, in any file of the package."""
        self._quiet_defs: set[str] = set()  # function names defined in files not read
        for f in files:
            if "dataclass" in f.text or "NamedTuple" in f.text:
                self.records |= set(_RECORD.findall(f.text)) | set(_NAMED_TUPLE.findall(f.text))
            if not _STREAM_TEXT.search(f.text):
                self.quiet_attributes |= set(_ATTRIBUTE.findall(f.text))
                self._quiet_defs |= set(_DEF.findall(f.text))
                continue  # no stream word: nothing to walk, no wait or sync to lend
            try:
                tree = ast.parse(f.text, filename=f.path)
            except (SyntaxError, ValueError, RecursionError):
                self.unparsed.append(f.path)
                continue
            self.modules[f.path] = Module(f.path, tree, f.text.splitlines())
        self.functions: list[Function] = []
        self.by_name: dict[str, list[Function]] = {}
        self.inits: dict[str, list[Function]] = {}  # class name -> its __init__s
        self.thread_targets: set[tuple[str, str]] = set()
        self._spawns: dict[tuple[str, str], list[ast.Call]] = {}
        self.caches: list[ModuleCache] = []
        for m in self.modules.values():
            self._index(m)
        self._host_votes: dict[str, list[set[int | str]]] = {}
        for m in self.modules.values():
            for call, hosted in host_args.host_guarded_calls(m.tree.body, frozenset()):
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in self.by_name:
                    self._host_votes.setdefault(name, []).append(host_args.host_args(call, hosted))
        self._summaries: dict[int, tuple[Effect, ...]] = {}
        self._call_index: dict[str, list[tuple[Function, ast.Call]]] | None = None
        self.same_stream_threads = self._same_stream_threads()

    # -- indexing ------------------------------------------------------------

    def _index(self, m: Module) -> None:
        host: set[str] = set()
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Import):
                m.facts.modules |= {(a.asname or a.name).split(".")[0] for a in node.names}
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                m.facts.foreign |= _imported_from(node, OTHER_FRAMEWORKS)
                host |= _imported_from(node, _HOST_MODULES)
        m.host = frozenset(host)
        for stmt in m.tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                self._module_value(m, stmt, stmt.value)
        for node, qual, cls in _functions(m.tree):
            fn = Function(m.path, qual, node, cls)
            self.functions.append(fn)
            self.by_name.setdefault(node.name, []).append(fn)
            if node.name == "__init__" and cls is not None:
                self.inits.setdefault(cls, []).append(fn)
            fn.text = "\n".join(m.lines[node.lineno - 1:node.end_lineno or node.lineno])
            if "Stream(" in fn.text or "Event(" in fn.text:
                self._cached_maker(m, fn)
        for cnode in ast.walk(m.tree):
            if isinstance(cnode, ast.ClassDef):
                m.classes[cnode.name] = _class_facts(m, cnode, self.caches)
            elif isinstance(cnode, ast.Call):
                target = _thread_target(cnode)
                if target:
                    self.thread_targets.add((m.path, target))
                    self._spawns.setdefault((m.path, target), []).append(cnode)

    def _module_value(self, m: Module, stmt: ast.Assign | ast.AnnAssign,
                      value: ast.expr) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        made = _makes(value, m.host)
        for n in names:
            if made:
                (m.facts.streams if made == "stream" else m.facts.events).add(n)
                self.caches.append(ModuleCache(m.path, stmt.lineno, n, made,
                                               "made at import, shared by every caller"))
            elif _pins(value):
                m.facts.pinned.add(n)
                m.facts.tensors.add(n)

    def _cached_maker(self, m: Module, fn: Function) -> None:
        """Streams or events made once and kept: a cached function, or a global."""
        decos = {(dotted(d.func) if isinstance(d, ast.Call) else dotted(d)) or ""
                 for d in fn.node.decorator_list}
        cached = any(d.rsplit(".", 1)[-1] in _CACHE_DECORATORS for d in decos)
        globs = {n for s in ast.walk(fn.node) if isinstance(s, ast.Global) for n in s.names}
        for node in _own_nodes(fn.node):
            if isinstance(node, ast.Call):
                made = _makes(node, m.host)
                if made and cached:
                    self.caches.append(ModuleCache(m.path, node.lineno, fn.qualname, made,
                                                   "made once by a cached function"))
            elif isinstance(node, ast.Assign) and globs:
                made = _makes(node.value, m.host)
                for t in node.targets:
                    if made and isinstance(t, ast.Name) and t.id in globs:
                        self.caches.append(ModuleCache(m.path, node.lineno, t.id, made,
                                                       f"kept in a global by {fn.qualname}"))
                        (m.facts.streams if made == "stream" else m.facts.events).add(t.id)

    # -- walking -------------------------------------------------------------

    def traces(self) -> Iterator[Trace]:
        """Every function that touches streams, walked, in file and line order."""
        for fn in sorted(self.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
            if not _STREAM_TEXT.search(fn.text):
                continue
            yield self.walk(fn)

    def _same_stream_threads(self) -> set[tuple[str, str]]:
        """Thread targets whose every submitter runs on the default stream: a new
        thread's current stream is the default stream, so the two are one stream.
        A submitter is taken to run there when neither it nor any caller of it in
        the package enters or sets a stream."""
        files = {path for path, _ in self._spawns}  # only these hold a spawn call
        spawner = {id(node): fn for fn in self.functions if fn.file in files
                   for node in _own_nodes(fn.node) if isinstance(node, ast.Call)}
        out = set()
        for key, calls in self._spawns.items():
            fns = [spawner.get(id(c)) for c in calls]
            if all(f is None or not self._may_enter_stream(f) for f in fns):
                out.add(key)
        return out

    def _may_enter_stream(self, fn: Function) -> bool:
        if _ENTERS_STREAM.search(fn.text):
            return True
        return any(_ENTERS_STREAM.search(caller.text) for caller, call in
                   self.call_index().get(fn.name, ()) if self.resolve(caller, call) is fn)

    def walk(self, fn: Function, depth: int = 0) -> Trace:
        m = self.modules[fn.file]
        params = fn.params()
        key = (fn.file, fn.name)
        thread = key in self.thread_targets and key not in self.same_stream_threads
        facts = m.classes.get(fn.cls) if fn.cls else None
        learned: Trace | None = None
        for _ in range(2):  # the first walk learns what names are, the second uses it
            t = Trace(fn.file, fn.qualname, fn.node.lineno, fn.cls,
                      tuple(p.arg for p in params), thread)
            if learned is not None:
                t.tensors |= learned.tensors
                t.host |= learned.host
                t.containers |= learned.containers
                t.streams |= learned.streams
                t.events |= learned.events | (learned.recorded & learned.waited)
            t.host |= self.host_params(fn)
            for p in params:
                ann = ast.unparse(p.annotation) if p.annotation is not None else ""
                if "Tensor" in ann:
                    t.tensors.add(p.arg)
                elif "Event" in ann:
                    t.events.add(p.arg)
                elif "Stream" in ann:
                    t.streams.add(p.arg)
                elif MAPPING_ANN.match(ann):
                    t.mappings.add(p.arg)
            w = Walker(t, facts, m.facts, callee=lambda call: self._call_effects(fn, call, depth),
                       helper=lambda call: self.stream_helper(fn, call), holds=self.holds)
            w.bound |= set(t.params)
            for p in params:
                if is_scalar_annotation(p.annotation):
                    w.alias[p.arg] = f"<scalar {p.arg}>"
            for name in callers.current_stream_params(self, fn):
                w.alias[name] = t.base  # every caller passes its current stream
            w.walk(fn.node.body)
            learned = t
        self._caller_waits(fn, t)
        t.persistent |= {k for k in t.tensors if k.startswith(("self.", "cls."))}
        t.persistent |= m.facts.tensors | m.facts.pinned
        return t

    def _caller_waits(self, fn: Function, t: Trace) -> None:
        """The waits every caller does before the call, as if done at the function's
        entry: on the streams it enters or puts work on."""
        used = (t.entered | {o.stream for o in t.ops if o.kind in (K.USE, K.ALLOC)}) - {
            t.base, ANY, THREAD, SUBMITTER}
        if not used:
            return
        waited = callers.entry_waits(self, fn, used, fn.receiver())
        if not waited:
            return
        t.ops[:0] = [Op(K.WAIT, fn.node.lineno, stream=s, other=t.base) for s in sorted(waited)]
        t.entries = [(s, i + len(waited)) for s, i in t.entries]

    def call_index(self) -> dict[str, list[tuple[Function, ast.Call]]]:
        """Every call in the package, by the called name (built once)."""
        if self._call_index is None:
            self._call_index = {}
            for fn in sorted(self.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
                for node in _own_nodes(fn.node):
                    if isinstance(node, ast.Call):
                        name = _call_name(node)
                        if name in self.by_name or name in self.inits:
                            self._call_index.setdefault(name, []).append((fn, node))
        return self._call_index

    def host_params(self, fn: Function) -> set[str]:
        """The parameters every call of ``fn`` in the package passes host memory
        (tested ``x.is_cpu`` / ``x.device.type == "cpu"`` / ``x.is_pinned()`` /
        ``not x.is_cuda`` around the call, or made by ``.cpu()``/``.pin_memory()``)."""
        votes = self._host_votes.get(fn.name)
        if not votes:
            return set()
        return {p.arg for i, p in enumerate(fn.params())
                if all(i in v or p.arg in v for v in votes)}

    # -- callees -------------------------------------------------------------

    def resolve(self, caller: Function, call: ast.Call) -> Function | None:
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else None
        if not name or name not in self.by_name:
            return None
        if isinstance(f, ast.Attribute) and (dotted(f.value) or "").split(".")[0] in MODULES:
            return None  # torch.distributed.broadcast is torch's, whatever the package names
        cands = self.by_name[name]
        if isinstance(f, ast.Attribute) and dotted(f.value) in ("self", "cls"):
            same = [c for c in cands if c.file == caller.file and c.cls == caller.cls]
            if same:
                return same[0]
        same_file = [c for c in cands if c.file == caller.file]
        if isinstance(f, ast.Name) and same_file:
            return same_file[0]
        if len(cands) > 1 and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            cls = _classes_of(caller).get(f.value.id)
            typed = [c for c in cands if cls is not None and c.cls == cls]
            if len(typed) == 1:
                return typed[0]
        # one function of that name, unless a file not read defines another
        return cands[0] if len(cands) == 1 and name not in self._quiet_defs else None

    def holds(self, call: ast.Call) -> bool:
        """Whether ``Cls(...)`` makes an object of the package's that only stores what it
        is given: a dataclass or named tuple with no ``__post_init__``, or a class whose
        one ``__init__`` only assigns to ``self`` (a ``super().__init__()`` aside)."""
        name = _call_name(call)
        if not name[:1].isupper() or name in self.by_name or _STREAM_OR_EVENT.search(name):
            return False  # a function, or a class with a method of that name: unknown
        root = (dotted(call.func) or "").split(".")[0]
        if isinstance(call.func, ast.Attribute) and (root in MODULES or root in ("self", "cls")):
            return False  # torch's, or a device module's (``self.device_module.Event()``)
        if name in self.records:
            return not any(f.cls == name for f in self.by_name.get("__post_init__", []))
        inits = self.inits.get(name, [])
        return len(inits) == 1 and _only_assigns(inits[0].node)

    def constructed(self, caller: Function, call: ast.Call) -> Function | None:
        """The ``__init__`` that a construction ``Cls(...)`` calls, where the package
        has one class of that name (or one in the caller's file)."""
        cands = self.inits.get(_call_name(call), [])
        same_file = [c for c in cands if c.file == caller.file]
        if len(same_file) == 1:
            return same_file[0]
        return cands[0] if len(cands) == 1 else None

    def effects(self, caller: Function, call: ast.Call, depth: int) -> tuple[Effect, ...]:
        """What a same-package callee does that the caller's ordering depends on
        (``Effect``), from the callee's own walk."""
        callee = self.resolve(caller, call)
        if callee is None or depth >= _DEPTH:
            return ()
        key = id(callee.node)
        if key in self._summaries:
            return self._summaries[key]
        self._summaries[key] = ()  # recursion guard
        t = self.walk(callee, depth + 1)
        params = set(t.params)
        if callee.receiver() is not None:
            params.add(callee.receiver() or "")  # what it does to its object's attributes
        found: dict[Effect, None] = {}
        for o in t.ops:
            root = o.key.split(".")[0] if o.key else ""
            suffix = o.key[len(root):]
            if o.kind in (K.WAIT, K.WAIT_EVENT) and not o.guards:
                found[Effect("wait")] = None
            elif o.kind is K.HOST_SYNC and not o.guards:
                # an event's sync covers only the work before its record
                found[Effect("sync", flag="event" if o.key in t.events or o.flag == "event"
                             else "")] = None
            elif o.kind is K.RECORD and root in params:
                found[Effect("record", root, suffix)] = None
            elif o.kind is K.FREE and root in params and (suffix or o.flag == STORAGE):
                found[Effect("free", root, suffix, flag=o.flag)] = None
            elif o.kind is K.USE and root in params and o.stream == t.base and \
                    o.key in t.tensors and len(found) < _MAX_EFFECTS:
                found.setdefault(Effect("use", root, suffix, o.write, o.flag), None)
        self._summaries[key] = tuple(found)
        return self._summaries[key]

    def _call_effects(self, fn: Function, call: ast.Call, depth: int) -> list[Effect]:
        """The callee's effects with its parameter names turned into this call's
        arguments (a name chain each, or '' where the argument is an expression)."""
        out = []
        callee = self.resolve(fn, call)
        for e in self.effects(fn, call, depth):
            if not e.param:
                out.append(e)
                continue
            names = [p.arg for p in callee.params()] if callee else []
            arg: ast.expr | None = next((k.value for k in call.keywords if k.arg == e.param),
                                        None)
            if callee is not None and e.param == callee.receiver() and isinstance(
                    call.func, ast.Attribute):
                arg = call.func.value  # self.x of the callee is receiver.x here
            elif arg is None and e.param in names and names.index(e.param) < len(call.args):
                arg = call.args[names.index(e.param)]
            if arg is not None and not isinstance(arg, ast.Starred):
                out.append(Effect(e.what, ast.unparse(arg), e.suffix, e.write, e.flag))
        return out

    def stream_helper(self, caller: Function, call: ast.Call) -> tuple[str, ast.expr | str] | None:
        """A call of the package's own that returns a stream (``'stream'``) or enters one
        as a context manager (``'context'``), with the stream as the caller names it:
        the argument or the receiver's attribute it is, or the helper's name."""
        callee = self.resolve(caller, call)
        if callee is None:
            return None
        if callee.helper is None:
            callee.helper = _stream_helper(callee, self.modules[callee.file].facts.foreign)
        if not callee.helper:
            return OWN, ""  # the package's own, and no stream helper: no name guesses
        kind, expr = callee.helper
        if expr is None:
            return kind, f"{callee.name}()"
        names = [p.arg for p in callee.params()]
        recv = callee.receiver()
        root = expr
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(root, ast.Name) and root.id == recv and isinstance(call.func, ast.Attribute):
            return kind, ast.parse(ast.unparse(expr).replace(recv, ast.unparse(call.func.value), 1),
                                   mode="eval").body
        if isinstance(expr, ast.Name) and expr.id in names:
            arg = next((k.value for k in call.keywords if k.arg == expr.id), None)
            i = names.index(expr.id)
            if arg is None and i < len(call.args) and not isinstance(call.args[i], ast.Starred):
                arg = call.args[i]
            return (kind, arg) if arg is not None else None
        if isinstance(expr, ast.Call) and _call_name(expr) == "current_stream":
            return kind, expr
        return kind, f"{callee.name}()"

    def optional_waits(self) -> dict[str, list[tuple[Function, str, int]]]:
        """Functions with an ordering argument that defaults to None, by name:
        (function, parameter, position among the call's arguments)."""
        out: dict[str, list[tuple[Function, str, int]]] = {}
        for fn in self.functions:
            a = fn.node.args
            pos = fn.params()
            defaults = dict(zip([p.arg for p in pos][len(pos) - len(a.defaults):], a.defaults))
            defaults.update({k.arg: d for k, d in zip(a.kwonlyargs, a.kw_defaults) if d})
            for i, p in enumerate([*pos, *a.kwonlyargs]):
                d = defaults.get(p.arg)
                if not (isinstance(d, ast.Constant) and d.value is None):
                    continue
                if not _OPTIONAL_WAIT.search(p.arg) or "stream" in p.arg.lower():
                    continue
                if is_scalar_annotation(p.annotation):
                    continue  # ``x: str = None``: a value, not an event to wait on
                if self._host_primitive(fn, p.arg, 0):
                    continue  # a thread's Event, Lock or Condition: no stream waits on it
                if not _STREAM_TEXT.search(fn.text):
                    continue
                if not _reaches_wait(fn.node, p.arg) or self._none_is_ordered(fn, p.arg, 0):
                    continue
                position = i if i < len(pos) else 10**6
                out.setdefault(fn.name, []).append((fn, p.arg, position))
        return out


    def _host_primitive(self, fn: Function, param: str, depth: int) -> bool:
        """Is ``param`` a host thread's sync object: annotated as one of ``threading``,
        ``asyncio`` or ``multiprocessing``, set, cleared or tested with ``is_set()``
        (which no device event has), or handed to a callee's parameter that is one?"""
        p = next((a for a in [*fn.params(), *fn.node.args.kwonlyargs] if a.arg == param), None)
        if p is not None and p.annotation is not None and \
                _HOST_PRIMITIVE.search(ast.unparse(p.annotation)):
            return True
        for node in [*_own_nodes(fn.node), *_closure_nodes(fn.node, param)]:
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and dotted(node.func.value) == param and \
                    node.func.attr in ("is_set", "set", "clear"):
                return True
            if depth < _DEPTH:
                callee = self.resolve(fn, node)
                if callee is not None and callee is not fn and any(
                        self._host_primitive(callee, name, depth + 1)
                        for name in self._handed_as(fn, node, param)):
                    return True
        return False

    def _none_is_ordered(self, fn: Function, param: str, depth: int) -> bool:
        """Without ``param`` the function still orders its work: an ``if`` on it
        waits in both branches (in the function or in a closure of it that runs the
        work later), or it hands ``param`` to a callee that does."""
        for node in [*_own_nodes(fn.node), *_closure_nodes(fn.node, param)]:
            if isinstance(node, ast.If) and any(
                    isinstance(n, ast.Name) and n.id == param for n in ast.walk(node.test)):
                if _waits(node.body) and _waits(node.orelse):
                    return True
                if _fills_with_event(node.body, param) or _fills_with_event(node.orelse, param):
                    return True
            if isinstance(node, ast.Call) and depth < _DEPTH:
                for name in self._handed_as(fn, node, param):
                    callee = self.resolve(fn, node)
                    if callee is not None and callee is not fn and \
                            self._none_is_ordered(callee, name, depth + 1):
                        return True
        return False

    def _handed_as(self, fn: Function, call: ast.Call, param: str) -> list[str]:
        """The callee's parameter names that ``param`` is passed as, by name or position."""
        out = [k.arg for k in call.keywords
               if k.arg and isinstance(k.value, ast.Name) and k.value.id == param]
        at = [i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == param]
        callee = self.resolve(fn, call) if at else None
        if callee is not None:
            names = [p.arg for p in callee.params()]
            out += [names[i] for i in at if i < len(names)]
        return out

    def call_sites(self, names: set[str]) -> Iterator[tuple[Function, ast.Call]]:
        """Every call, anywhere in the package, of a function named in ``names``."""
        for fn in sorted(self.functions, key=lambda f: (f.file, f.node.lineno, f.qualname)):
            if not any(n in fn.text for n in names):
                continue
            for node in _own_nodes(fn.node):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if name in names:
                        yield fn, node


def _functions(tree: ast.Module) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef,
                                                    str, str | None]]:
    def visit(body: list[ast.stmt], prefix: str, cls: str | None) -> Iterator:
        for s in body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield s, prefix + s.name, cls
                yield from visit(s.body, prefix + s.name + ".", None)
            elif isinstance(s, ast.ClassDef):
                yield from visit(s.body, prefix + s.name + ".", s.name)
            elif isinstance(s, (ast.If, ast.Try)):
                yield from visit(s.body, prefix, cls)
    yield from visit(tree.body, "", None)


_CONTEXTS = {"stream", "StreamContext", "use_stream", "cuda_stream"}
_MAKERS = {"Stream", "ExternalStream"}


def _stream_helper(fn: Function, foreign: set[str]) -> tuple[str, ast.expr | None] | tuple[()]:
    """Does ``fn`` return a stream, or enter one for its caller (a context manager
    that enters a stream context or sets the current stream, or returns such a
    context)? The stream as ``fn`` names it (None: one it makes). A context of
    another framework's module (``foreign``: ``mx.stream``) is none of torch's."""
    decos = {((dotted(d.func) if isinstance(d, ast.Call) else dotted(d)) or "").rsplit(".", 1)[-1]
             for d in fn.node.decorator_list}
    generator = "contextmanager" in decos or "asynccontextmanager" in decos
    for node in sorted(_own_nodes(fn.node), key=lambda n: (getattr(n, "lineno", 0),
                                                           getattr(n, "col_offset", 0))):
        if generator and isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                c = item.context_expr
                if isinstance(c, ast.Call) and _call_name(c) in _CONTEXTS and c.args and \
                        not _foreign_call(c, foreign):
                    return "context", c.args[0]
        if generator and isinstance(node, ast.Call) and _call_name(node) == "set_stream" and \
                node.args and _device_call(node):
            return "context", node.args[0]
        if isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if isinstance(v, ast.Call) and _call_name(v) in _CONTEXTS and v.args and \
                    not _foreign_call(v, foreign):
                return "context", v.args[0]
            if isinstance(v, ast.Call) and _call_name(v) in _MAKERS:
                return "stream", None
            if isinstance(v, ast.Call) and _call_name(v) == "current_stream":
                return "stream", v  # the caller's current stream
            if isinstance(v, (ast.Name, ast.Attribute, ast.Subscript)):
                text = dotted(v.value if isinstance(v, ast.Subscript) else v) or ""
                last = text.rsplit(".", 1)[-1]
                if "stream" in last.lower() and (isinstance(v, ast.Subscript) or
                                                 not last.endswith("streams")):
                    return "stream", v
    return ()


def _foreign_call(c: ast.Call, foreign: set[str]) -> bool:
    """Is ``c`` called on another framework's module, as the package or ``c``'s own
    function imports it (``import mlx.core as mx`` in the helper)?"""
    root = (dotted(c.func) or "").split(".")[0]
    return root in foreign or root in OTHER_FRAMEWORKS


def _device_call(c: ast.Call) -> bool:
    """Is ``c`` called on a device module (``torch.cuda.set_stream``), or bare?"""
    f = c.func
    if not isinstance(f, ast.Attribute):
        return True
    text = dotted(f.value) or ""
    return text.split(".")[0] in MODULES or text.rsplit(".", 1)[-1] in DEVICE_MODULES


def _call_name(c: ast.Call) -> str:
    f = c.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _reaches_wait(fn: ast.AST, param: str) -> bool:
    """``param`` is waited on, or handed on (to a call, a queue, a field), here or in
    a closure that runs later."""
    for node in [*_own_nodes(fn), *_closure_nodes(fn, param)]:
        if isinstance(node, ast.Call):
            for a in [*node.args, *(k.value for k in node.keywords)]:
                if any(isinstance(n, ast.Name) and n.id == param for n in ast.walk(a)):
                    return True
            if isinstance(node.func, ast.Attribute) and dotted(node.func.value) == param:
                return True
        elif isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id == param for n in ast.walk(node.value)):
            return True
    return False


def _closure_nodes(fn: ast.AST, param: str) -> Iterator[ast.AST]:
    """The nodes of the functions nested in ``fn`` that see its ``param`` (those
    with a parameter of that name have their own)."""
    for node in ast.iter_child_nodes(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            if param in {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}:
                continue
            yield from _own_nodes(node)
            yield from _closure_nodes(node, param)
        elif not isinstance(node, ast.ClassDef):
            yield from _closure_nodes(node, param)


def _waits(body: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and
               n.func.attr in ("wait_stream", "wait_event", "synchronize", "wait")
               for s in body for n in ast.walk(s))


def _classes_of(fn: Function) -> dict[str, str]:
    """The class of each local name whose class the function states: a parameter's
    annotation (``x: Overlap``, ``x: Overlap | None``) or a constructor (``x = Overlap()``)."""
    if fn.classes is not None:
        return fn.classes
    out: dict[str, str] = {}
    for p in [*fn.params(), *fn.node.args.kwonlyargs]:
        if p.annotation is not None:
            names = [n for n in ast.walk(p.annotation) if isinstance(n, (ast.Name, ast.Attribute))
                     and (dotted(n) or "").rsplit(".", 1)[-1][:1].isupper()]
            if len(names) == 1:
                out[p.arg] = (dotted(names[0]) or "").rsplit(".", 1)[-1]
    for node in _own_nodes(fn.node):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            made = (dotted(node.value.func) or "").rsplit(".", 1)[-1]
            if made[:1].isupper():
                out[node.targets[0].id] = made
    fn.classes = out
    return out


def _fills_with_event(body: list[ast.stmt], param: str) -> bool:
    """``param = Event(); param.record()``: the default is an event recorded here, on
    the current stream, so the work that waits on it is ordered after the caller's."""
    bound = recorded = False
    for n in (n for s in body for n in ast.walk(s)):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == param
                                             for t in n.targets):
            bound = True
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr == "record" and dotted(n.func.value) == param and not n.args:
            recorded = True
    return bound and recorded


def _makes(value: ast.AST, host: frozenset[str] = frozenset()) -> str | None:
    """"stream" or "event" where ``value`` makes one; ``host`` names the module's
    imports of ``threading``, ``asyncio`` and ``multiprocessing``, whose ``Event()`` is a
    thread's flag, not a device event."""
    if isinstance(value, ast.IfExp):  # Event() if spec else None: an event, or none
        return _makes(value.body, host) or _makes(value.orelse, host)
    if isinstance(value, ast.Call):
        f = value.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else ""
        root = (dotted(f) or "").split(".")[0]
        if root in host or root in _HOST_MODULES:
            return None
        if name in _MAKES_STREAM:
            return _MAKES_STREAM[name]
    return None


_HOST_MODULES = frozenset({"threading", "asyncio", "multiprocessing"})


def _imported_from(node: ast.Import | ast.ImportFrom, roots: frozenset[str]) -> set[str]:
    """The names an import binds to modules under ``roots``, or to what it takes from
    them (``import mlx.core as mx``, ``from threading import Event``)."""
    if isinstance(node, ast.Import):
        return {(a.asname or a.name).split(".")[0] for a in node.names
                if a.name.split(".")[0] in roots}
    if node.level == 0 and (node.module or "").split(".")[0] in roots:
        return {a.asname or a.name for a in node.names}
    return set()


def _pins(value: ast.AST) -> bool:
    for n in ast.walk(value):
        if isinstance(n, ast.keyword) and n.arg == "pin_memory" and isinstance(
                n.value, ast.Constant) and n.value.value is True:
            return True
        if isinstance(n, ast.Attribute) and n.attr == "pin_memory":
            return True
    return False


def _class_facts(m: Module, cls: ast.ClassDef, caches: list[ModuleCache]) -> ClassFacts:
    facts = ClassFacts()
    for s in cls.body:  # class attributes
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and \
                "Tensor" in ast.unparse(s.annotation):
            facts.tensors.add(f"self.{s.target.id}")
        if isinstance(s, ast.Assign) and _makes(s.value, m.host):
            for t in s.targets:
                if isinstance(t, ast.Name):
                    caches.append(ModuleCache(m.path, s.lineno, f"{cls.name}.{t.id}",
                                              _makes(s.value, m.host) or "", "a class attribute, "
                                              "shared by every instance"))
    for node in ast.walk(cls):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            name = dotted(t)
            if not name or not name.startswith("self."):
                continue
            v = node.value
            made = _makes(v, m.host)
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
                    v.func.attr in ("stream", "StreamContext") and v.args and dotted(v.args[0]):
                facts.contexts[name] = dotted(v.args[0]) or ""
                facts.streams.add(facts.contexts[name])
            elif made == "stream":
                facts.streams.add(name)
            elif isinstance(v, (ast.List, ast.Tuple, ast.Dict, ast.ListComp, ast.DictComp)) \
                    and any(_makes(n, m.host) == "stream" for n in ast.walk(v)):
                facts.streams.add(name + "[]")  # a container of streams: each is one
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
                    v.func.attr in ("current_stream", "default_stream"):
                facts.alias.setdefault(name, CURRENT)  # the stream current where it is made
            elif made == "event" or isinstance(v, (ast.List, ast.Tuple, ast.ListComp)) and any(
                    _makes(n, m.host) == "event" for n in ast.walk(v)):
                facts.events.add(name)  # an event, or a list of them (``self.done[i]``)
            elif _pins(v):
                facts.pinned.add(name)
                facts.tensors.add(name)
                facts.host.add(name)
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
                    v.func.attr == "numpy" and dotted(v.func.value):
                facts.alias[name] = dotted(v.func.value) or name
                facts.host.add(dotted(v.func.value) or name)
            elif isinstance(v, ast.Call) and (dotted(v.func) or "").startswith("torch.") and \
                    (dotted(v.func) or "").rsplit(".", 1)[-1] in _TORCH_MAKERS:
                facts.tensors.add(name)
            if isinstance(node, ast.AnnAssign) and "Tensor" in ast.unparse(node.annotation):
                facts.tensors.add(name)
    return facts


_TORCH_MAKERS = {"empty", "zeros", "ones", "full", "tensor", "arange", "empty_like",
                 "zeros_like", "ones_like", "full_like", "from_numpy", "as_tensor", "cat",
                 "stack", "empty_strided", "randn", "rand", "randint"}


def _thread_target(call: ast.Call) -> str | None:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    target: ast.expr | None = None
    if name in ("Thread", "Process"):
        target = next((k.value for k in call.keywords if k.arg == "target"), None)
    elif (name in ("submit", "start_new_thread") or name.endswith("_submit")) and call.args:
        target = call.args[0]
    elif name == "run_in_executor" and len(call.args) > 1:
        target = call.args[1]
    if isinstance(target, ast.Call) and target.args and (dotted(target.func) or "").endswith(
            "partial"):
        target = target.args[0]
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    return None


_ATTRIBUTE = re.compile(r"\.([A-Za-z_]\w*)")
_DEF = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.M)
_ENTERS_STREAM = re.compile(r"\bstream\s*\(|set_stream|use_stream|StreamContext|stream_context|"
                            r"with\s[^\n]*stream", re.I)
"""Text of a function that may make a side stream current (a context, a setter)."""
_HOST_PRIMITIVE = re.compile(r"\b(?:threading|asyncio|multiprocessing|mp)\.|"
                             r"\b(?:Lock|RLock|Condition|Semaphore|Barrier)\b")
_STREAM_OR_EVENT = re.compile(r"Stream|Event")
_RECORD = re.compile(r"^@(?:dataclasses\.)?dataclass\b.*\n(?:@.*\n)*class\s+(\w+)", re.M)
_NAMED_TUPLE = re.compile(r"^class\s+(\w+)\((?:typing\.)?NamedTuple\)", re.M)

_STREAM_TEXT = re.compile(r"stream|non_blocking|pin_memory|Event|async_op|isend|irecv|"
                          r"synchronize|set_stream")
"""A cheap filter before any parse or walk: the words stream code is made of."""


def _only_assigns(init: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An ``__init__`` whose statements only store values on ``self`` (no call in them)
    or call ``super().__init__()``: a docstring, ``self.x = x``, ``self.y: T = None``."""
    for stmt in init.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                ast.unparse(stmt.value.func) == "super().__init__":
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and all(
                isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and
                t.value.id == "self" for t in (
                    stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])) and \
                not any(isinstance(n, ast.Call) for n in ast.walk(stmt.value)):
            continue
        return False
    return True
