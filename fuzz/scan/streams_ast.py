"""The static pass of ``fuzz scan``: each function's stream code as a list of ops.

A function is walked once, statement by statement in source order, with the
stack of stream contexts it is in. What it does to tensors, streams and events
becomes an ``Op`` (an allocation on the current stream, a use, a
``record_stream``, a wait, an event record, a host sync, a non-blocking copy,
a free...), so that ``streamfuzz.fuzz.scan.hazards`` can judge orderings by position in
one flat list. Loop bodies are walked twice, so that what one iteration leaves
pending meets the next one. Branches are walked in turn; an op under an ``if``
carries the branches it is under (``guards``), so a wait that only some paths
take can be told from one they all take.

Nothing is imported or run. Here are the statements and expressions; what a
name is lives in ``streamfuzz.fuzz.scan.names``, what a call does in
``streamfuzz.fuzz.scan.calls``, what a binding does in ``streamfuzz.fuzz.scan.binding``,
and the ops in ``streamfuzz.fuzz.scan.ops``.
"""

from __future__ import annotations

import ast

from streamfuzz.fuzz.scan.binding import Binding
from streamfuzz.fuzz.scan.calls import Calls
from streamfuzz.fuzz.scan.names import INDEXISH, META_ATTRS, callee_name, dotted, negated
from streamfuzz.fuzz.scan.ops import K, Loop


class Walker(Calls, Binding):
    """Walks one function body into a ``Trace``.

    ``callee`` answers what a same-package callee does to ordering (see
    ``streamfuzz.fuzz.scan.package``): ``'wait'`` (it waits for another stream
    unconditionally), ``'sync'`` (the host waits), or record_stream of the
    call's arguments, by position.
    """

    def walk(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:  # noqa: C901 - one arm per statement kind
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        self.t.at.setdefault(s.lineno, self.cur)
        if isinstance(s, (ast.With, ast.AsyncWith)):
            self._with(s)
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            self.assign(s)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                made = self.expr(s.value)
                if made is not None and made.startswith("<work@"):
                    self.emit(K.KEEP, s.lineno, key=made)  # its caller waits for the work
                self.keep(s.value, s.lineno)
        elif isinstance(s, ast.Delete):
            for tgt in s.targets:
                k = self.key(tgt) if not isinstance(tgt, ast.Subscript) else None
                if k and not (isinstance(tgt, ast.Name) and self.held_elsewhere(tgt.id, k)):
                    self.emit(K.FREE, s.lineno, key=k)
                if isinstance(tgt, ast.Name):
                    self.alias.pop(tgt.id, None)
        elif isinstance(s, ast.If):
            if not _truth_of_iterated(s):
                self.expr(s.test)
            self.guards.append(id(s))
            self.t.tests[id(s)] = self.compares.get(s.test.id, s.test) if isinstance(
                s.test, ast.Name) else s.test
            polled = []  # `if not ev.query(): return`: past the `if`, ev's work is done
            for node in ast.walk(s.test):  # `if ev.query():` the work before ev is done
                if isinstance(node, ast.Call) and callee_name(node) == "query" and \
                        isinstance(node.func, ast.Attribute):
                    target = self.stream_of(node.func.value) or self.key(node.func.value)
                    if target and not negated(s.test, node):
                        self.emit(K.HOST_SYNC, s.lineno, key=target)
                    elif target and not s.orelse and s.body and isinstance(
                            s.body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                        polled.append(target)
            before = dict(self.alias)
            none = _none_tested(s.test)
            k = self.key(none) if none is not None else None
            if k:  # `if self.buf is None: self.buf = ...`: nothing is dropped there
                self.unset.append(k)
            excluded = _asserted_false(s.body)
            if excluded:
                self.t.excludes[id(s)] = excluded
            self.walk(s.body)
            if k:
                self.unset.pop()
            self.guards[-1] = -id(s)
            if s.orelse:
                in_body, self.alias = self.alias, dict(before)
                self.walk(s.orelse)
                self._chosen(id(s), in_body, self.alias)
                self.alias = self._merge(before, in_body, self.alias)
            self.guards.pop()
            for target in polled:
                self.emit(K.HOST_SYNC, s.lineno, key=target)
        elif isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            if isinstance(s, ast.While):
                self.expr(s.test)
            elif not isinstance(s.iter, (ast.Name, ast.Attribute)):
                self.expr(s.iter)  # iterating a name reads none of it: items, or views
            items = s.iter.elts if isinstance(s, (ast.For, ast.AsyncFor)) and isinstance(
                s.iter, (ast.Tuple, ast.List)) and isinstance(s.target, ast.Name) and all(
                isinstance(e, (ast.Name, ast.Attribute)) for e in s.iter.elts) else None
            if items and not isinstance(s, ast.While):  # for t in (x, y): once for each
                for e in items:
                    self.bind(s.target, None, s.lineno)
                    self.bind_items(s.target, e)
                    self.walk(s.body)
            loop = _loop(s, len(self.guards))
            self.t.loops.append(loop)
            for _ in range(0 if items else 2):
                first = len(self.t.ops)
                if not isinstance(s, ast.While):
                    self.bind(s.target, None, s.lineno)
                    self.bind_items(s.target, s.iter)
                self.walk(s.body)
                loop.passes.append((first, len(self.t.ops)))
            self.walk(s.orelse)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            self.walk(s.body)  # type: ignore[attr-defined]
            for h in s.handlers:  # type: ignore[attr-defined]
                self.guards.append(id(h))
                self.walk(h.body)
                self.guards.pop()
            self.walk(s.orelse)  # type: ignore[attr-defined]
            self.walk(s.finalbody)  # type: ignore[attr-defined]
        elif isinstance(s, ast.Expr):
            self.expr(s.value)
        elif isinstance(s, ast.Match):
            self.expr(s.subject)
            for case in s.cases:
                self.guards.append(id(case))
                self.walk(case.body)
                self.guards.pop()
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def _chosen(self, if_id: int, body: dict[str, str], orelse: dict[str, str]) -> None:
        """A name that one branch binds to a side stream and the other to the current
        one: that branch is the only path the side stream is used on."""
        base = self.t.base
        for n, v in body.items():
            if v in self.t.streams and v != base and orelse.get(n) == base:
                self.t.chosen.setdefault(if_id, set()).add(v)
        for n, v in orelse.items():
            if v in self.t.streams and v != base and body.get(n) == base:
                self.t.chosen.setdefault(-if_id, set()).add(v)

    def _merge(self, before: dict[str, str], body: dict[str, str],
               orelse: dict[str, str]) -> dict[str, str]:
        """The names after an ``if``/``else``, taken from one branch together: the
        one that picks a side stream where the other picks the current one (a
        stream and the buffer chosen with it are one pair), else the later one's."""
        def side(a: dict[str, str], b: dict[str, str]) -> bool:
            return any(v in self.t.streams and v != self.t.base and b.get(n) == self.t.base
                       for n, v in a.items() if v != before.get(n))
        first, last = (orelse, body) if side(body, orelse) and not side(orelse, body) else (
            body, orelse)
        out = dict(first)
        out.update({n: v for n, v in last.items() if v != before.get(n)})
        for n in before:  # dropped in the branch taken last
            if n not in last and n in out and out[n] == before[n]:
                del out[n]
        return out

    def _with(self, s: ast.With | ast.AsyncWith) -> None:
        pushed = 0
        for item in s.items:
            stream = self.context_stream(item.context_expr)
            if stream is not None and isinstance(item.context_expr, ast.Call):
                self.helper_effects(item.context_expr)
            if stream is not None:
                self.stack.append(stream)
                self.t.entered.add(stream)
                self.t.entries.append((stream, len(self.t.ops)))
                pushed += 1
            else:
                self.expr(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, None, s.lineno)
        self.walk(s.body)
        del self.stack[len(self.stack) - pushed:]


    def helper_effects(self, c: ast.Call) -> None:
        """What entering a stream through a package helper does before the work: a wait
        the helper (or a helper that gives the stream) does first."""
        if self.helped(c, "context") is not None:
            self._package_call(c, callee_name(c))
        for a in c.args:
            if isinstance(a, ast.Call) and self.helped(a, "stream") is not None:
                self._package_call(a, callee_name(a))

    def expr(self, node: ast.expr | None) -> str | None:
        """Record what evaluating ``node`` does; the key of a tensor it makes, if any."""
        if node is None:
            return None
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            # a container only holds references: no stream touches its items here
            items = [self.expr(child) for child in ast.iter_child_nodes(node)
                     if isinstance(child, ast.expr) and not isinstance(
                         child, (ast.Name, ast.Attribute, ast.Constant))]
            if items and all(items) and isinstance(node, (ast.List, ast.Tuple)):
                group = self.fresh(node)  # tensors made here, together, on this stream
                self.t.tensors.add(group)
                self.t.containers.add(group)
                return group
            return None
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp)):
            if not isinstance(node, ast.Lambda):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.expr):
                        self.expr(child)
                    elif isinstance(child, ast.comprehension):
                        self.expr(child.iter)
            return None
        if isinstance(node, ast.Attribute) and node.attr in META_ATTRS:
            return None
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot))
                                                 for op in node.ops):
            for side in (node.left, *node.comparators):  # `x is None` reads no storage
                if isinstance(side, ast.Subscript):  # nor does `xs[i] is None`
                    self.expr(side.slice)
                elif not isinstance(side, (ast.Name, ast.Attribute)):
                    self.expr(side)
            return None
        if isinstance(node, (ast.Name, ast.Attribute)):
            k = self.key(node)
            if k and k not in self.t.streams and k not in self.t.events:
                self.emit(K.USE, node.lineno, stream=self.cur, key=k, part=self.part(node))
            return None
        if isinstance(node, ast.Subscript):
            if dotted(node.value) in self.t.mappings:
                return None  # devices[p]: a dict hashes p's identity, reads none of it
            self.expr(node.slice)
            base = self.key(node.value)
            if self.is_gather(node):
                self.expr(node.value)
                made = self.fresh(node)
                self.t.tensors.add(made)
                if base:
                    self.t.tensors.add(base)
                for part in ast.walk(node.slice):
                    k = self.key(part) if isinstance(part, (ast.Name, ast.Attribute)) else None
                    if k and INDEXISH.search(k.rsplit(".", 1)[-1]):
                        self.t.tensors.add(k)
                return made
            if base:
                self.emit(K.USE, node.lineno, stream=self.cur, key=base, part=self.part(node))
                if base in self.t.host and isinstance(node.ctx, ast.Load):
                    self.emit(K.HOST_READ, node.lineno, key=base, flag="index")
            else:
                self.expr(node.value)
            return None
        if isinstance(node, ast.BinOp):
            a, b = self.expr(node.left), self.expr(node.right)
            ka, kb = self.key(node.left), self.key(node.right)
            if a or b or (ka in self.t.tensors) or (kb in self.t.tensors):
                made = self.fresh(node)
                self.t.tensors.add(made)
                return made
            return None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
        return None


def _asserted_false(body: list[ast.stmt]) -> set[str]:
    """The tests a branch asserts false at its top level (``assert not x``): the
    branch that tests them cannot have been taken on this path."""
    return {ast.unparse(s.test.operand) for s in body if isinstance(s, ast.Assert) and
            isinstance(s.test, ast.UnaryOp) and isinstance(s.test.op, ast.Not)}


def _truth_of_iterated(s: ast.If) -> bool:
    """``if xs: for x in xs: ...``: a name tested for truth and iterated in the branch is
    a Python sequence (a tensor of more elements has no truth value), so the test reads
    no tensor."""
    test = s.test.operand if isinstance(s.test, ast.UnaryOp) and isinstance(
        s.test.op, ast.Not) else s.test
    name = dotted(test) if isinstance(test, (ast.Name, ast.Attribute)) else None
    return name is not None and any(
        isinstance(n, (ast.For, ast.AsyncFor)) and dotted(n.iter) == name
        for b in s.body for n in ast.walk(b))


def _loop(s: ast.For | ast.AsyncFor | ast.While, depth: int) -> Loop:
    """What the judge needs of a loop: a ``for i in range(...)``'s index and bounds."""
    if isinstance(s, ast.For) and isinstance(s.target, ast.Name) and isinstance(
            s.iter, ast.Call) and callee_name(s.iter) == "range" and \
            1 <= len(s.iter.args) <= 2 and not s.iter.keywords:
        return Loop(s.target.id, tuple(s.iter.args), depth, s)
    return Loop(None, (), depth, s)


def _none_tested(test: ast.expr) -> ast.expr | None:
    """``x`` of a test ``x is None`` (or ``not x``), else None."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], ast.Is) and isinstance(test.comparators[0], ast.Constant) and \
            test.comparators[0].value is None:
        return test.left
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    return None
