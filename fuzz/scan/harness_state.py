"""State a harness must set up before the flagged call, read from the package's code.

A reading of one function's parameters gives values that are each right
alone; these rules give what holds between them, or what another part of
the class or package makes. ``ties``: where the function looks one
argument's items up in a list another argument holds (``{r: i for i, r in
enumerate(batch.req_ids)}`` then ``[idx[r] for r in req_ids]``), both get
the same one key. ``filled_entry``: a dict the class fills by key in
another method (``self.plans[b] = (name,)`` in ``__init__``) holds an entry
under the key the function reads, the filler's own literal value. ``real_class``:
a collaborator the class constructs from a class of the same file, whose
``__init__`` only stores what it is given, is that class (its methods
return what the function needs: a region, a view), and what the class
passes that collaborator answers as the collaborator's code checks
(``duck_for``). ``unreachable``: where the function's stream work is all in
a collaborator whose package classes reach the GPU through ctypes, the
harness says so and skips rather than passing with no work done.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from streamfuzz.fuzz.scan.nodes import parents as _parents
from streamfuzz.fuzz.scan.nodes import text as _text
from streamfuzz.fuzz.scan.package import Function, Package
from streamfuzz.fuzz.scan.sources import SourceFile

_FIXED: ContextVar[dict[str, str] | None] = ContextVar("_FIXED", default=None)


def fixed(key: str) -> str | None:
    """The value a tie decided for ``key`` (``param`` or ``param.attr``), if any."""
    return (_FIXED.get() or {}).get(key)


@contextmanager
def fixing(values: dict[str, str]) -> Iterator[None]:
    """Decide arguments with ``values`` fixed (``fixed`` answers them)."""
    token = _FIXED.set(values)
    try:
        yield
    finally:
        _FIXED.reset(token)


def _iterated(fn: ast.AST) -> dict[str, str]:
    """Loop and comprehension targets (a plain name) -> what they iterate."""
    out = {}
    for n in ast.walk(fn):
        if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.target, ast.Name):
            out[n.target.id] = _text(n.iter)
    return out


def _keyed_by(value: ast.expr) -> str | None:
    """``{r: i for i, r in enumerate(A)}``, ``{r: ... for r in A}``, ``dict(zip(A, ...))``:
    the sequence ``A`` whose items are the mapping's keys."""
    if isinstance(value, ast.DictComp) and len(value.generators) == 1:
        gen = value.generators[0]
        key = _text(value.key)
        it = gen.iter
        if isinstance(it, ast.Call) and _text(it.func) == "enumerate" and it.args and \
                isinstance(gen.target, ast.Tuple) and len(gen.target.elts) == 2 and \
                _text(gen.target.elts[1]) == key:
            return _text(it.args[0])
        if _text(gen.target) == key:
            return _text(it)
    if isinstance(value, ast.Call) and _text(value.func) == "dict" and value.args and \
            isinstance(value.args[0], ast.Call) and _text(value.args[0].func) == "zip" and \
            value.args[0].args:
        return _text(value.args[0].args[0])
    return None


def ties(fn: Function) -> dict[str, str]:
    """Pairs of the function's values that must hold the same keys: the sequence a
    lookup's keys come from and the one the looked-up mapping (or list) is built from,
    each given one key (``['x']``, or ``[0]`` where the annotation says ints)."""
    mappings = {}
    for n in ast.walk(fn.node):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                n.targets[0], ast.Name):
            source = _keyed_by(n.value)
            if source is not None:
                mappings[n.targets[0].id] = source
    loops = _iterated(fn.node)
    pairs = []
    for n in ast.walk(fn.node):
        looked, key = None, None
        if isinstance(n, ast.Subscript) and _text(n.value) in mappings:
            looked, key = mappings[_text(n.value)], _text(n.slice)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr == "index" and len(n.args) == 1:
            looked, key = _text(n.func.value), _text(n.args[0])
        elif isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.In):
            looked, key = _text(n.comparators[0]), _text(n.left)
        if looked and key in loops and loops[key] != looked:
            pairs.append((looked, loops[key]))
    annotations = {p.arg: _text(p.annotation) for p in fn.params()}
    out = {}
    for looked, keys in pairs:
        item = "[0]" if re.search(r"\[\s*int\s*\]", annotations.get(keys, "")) else "['x']"
        out[looked] = out[keys] = item
    return out


def branch_to(fn: Function, line: int) -> dict[str, str]:
    """Flags that take the function down the finding's branch: for each ``if`` around
    ``line`` whose test is a flag (``self.group.is_last``, ``not use_side``, or an
    ``and`` of such in a body), the value that enters the branch holding the line. A
    flag is a name or attribute the function only tests; a harness that left it an
    object took the other branch of ``if not flag:`` and never ran the finding's code."""
    parents = _parents(fn.node)
    inside = [n for n in ast.walk(fn.node) if isinstance(n, ast.stmt) and
              getattr(n, "lineno", 0) == line]
    if not inside:
        return {}
    out: dict[str, str] = {}
    node: ast.AST = inside[0]
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If):
            if node in parent.body:
                out.update(_entering(parent.test, True, fn.node, parents))
            elif node in parent.orelse:
                out.update(_entering(parent.test, False, fn.node, parents))
        node = parent
    return out


def _entering(test: ast.expr, wanted: bool, scope: ast.AST,
              parents: dict[ast.AST, ast.AST]) -> dict[str, str]:
    """The flag values that give ``test`` the truth ``wanted`` (none where that is not
    one assignment of flags: an ``or`` to make true, an ``and`` to make false)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _entering(test.operand, not wanted, scope, parents)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and wanted:
        out: dict[str, str] = {}
        for v in test.values:
            out.update(_entering(v, True, scope, parents))
        return out
    if isinstance(test, (ast.Name, ast.Attribute)) and _only_tested(_text(test), scope, parents):
        return {_text(test): repr(wanted)}
    return {}


def _only_tested(text: str, scope: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether every use of ``text`` in ``scope`` is as a truth value: a flag."""
    uses = [n for n in ast.walk(scope) if isinstance(n, (ast.Name, ast.Attribute)) and
            isinstance(n.ctx, ast.Load) and _text(n) == text]
    for n in uses:
        p = parents.get(n)
        if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not):
            continue
        if isinstance(p, ast.BoolOp):
            continue
        if isinstance(p, (ast.If, ast.IfExp, ast.While, ast.Assert)) and p.test is n:
            continue
        return False
    return bool(uses)


def stream_context(files: Iterable[SourceFile], attr: str) -> str | None:
    """``self.X_ctx = torch.cuda.stream(self.X)`` made anywhere in the package (a mixin's
    attribute its host class sets): the harness's object enters that stream where the
    code enters ``self.X_ctx``, not a context that switches nothing; ``self.X`` is a
    stream."""
    want = re.compile(rf"self\.{re.escape(attr)}\s*=\s*[\w.]*\.stream\(\s*self\.(\w+)\s*\)")
    entered = re.compile(rf"self\.\w+\s*=\s*[\w.]*\.stream\(\s*self\.{re.escape(attr)}\s*\)")
    for f in files:
        if attr in f.text:
            m = want.search(f.text)
            if m:
                return f"_stream_context(obj, {m.group(1)!r})"
            if entered.search(f.text):  # the stream such a context enters
                return "torch.cuda.Stream()"
    return None


def _resolved(fn: Function, key: ast.expr) -> str | None:
    """A subscript's key in the harness's words: ``n`` where it is the first size of a
    parameter (``b = x.shape[0]``; the harness's tensors and lists are ``n`` long), a
    literal as it is."""
    if isinstance(key, ast.Constant):
        return repr(key.value)
    params = {p.arg for p in fn.params()}
    text = _text(key)
    for _ in range(3):
        m = re.fullmatch(r"(\w+)\.shape\[0\]|(\w+)\.size\(0\)|len\((\w+)\)", text)
        if m:
            return "n" if (m.group(1) or m.group(2) or m.group(3)) in params else None
        bound = _bound_to(fn.node, text)
        if bound is None:
            return None
        text = bound
    return None


def _bound_to(scope: ast.AST, name: str) -> str | None:
    """What a local ``name`` is assigned once, including from a tuple (``a, b = x, y``)."""
    found = []
    for n in ast.walk(scope):
        if not isinstance(n, ast.Assign) or len(n.targets) != 1:
            continue
        t, v = n.targets[0], n.value
        if isinstance(t, ast.Name) and t.id == name:
            found.append(_text(v))
        elif isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(
                v.elts):
            found += [_text(b) for a, b in zip(t.elts, v.elts) if _text(a) == name]
    return found[0] if len(found) == 1 else None


def _guarded_values(scope: ast.AST, target: str) -> Iterator[ast.expr]:
    """Each value assigned to ``target`` (``self.plans[...]``'s text up to the key), with
    a name that an enclosing ``if NAME == LITERAL`` fixes replaced by that literal."""

    def walk(body: Iterable[ast.stmt], known: dict[str, ast.expr]) -> Iterator[ast.expr]:
        for stmt in body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Subscript) and _text(t.value) == target:
                        yield _Substitute(known).visit(ast.parse(_text(stmt.value),
                                                                  mode="eval").body)
            if isinstance(stmt, ast.If):
                test, inner = stmt.test, dict(known)
                if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
                        test.ops[0], ast.Eq) and isinstance(test.left, ast.Name) and \
                        isinstance(test.comparators[0], ast.Constant):
                    inner[test.left.id] = test.comparators[0]
                yield from walk(stmt.body, inner)
                yield from walk(stmt.orelse, known)
            elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
                for part in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(stmt, part, []), known)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(stmt.body, {})

    yield from walk([scope] if isinstance(scope, ast.stmt) else [], {})


class _Substitute(ast.NodeTransformer):
    def __init__(self, known: dict[str, ast.expr]) -> None:
        self.known = known

    def visit_Name(self, node: ast.Name) -> ast.expr:  # noqa: N802 - ast's visitor name
        return self.known.get(node.id, node)


def filled_entry(cls: ast.ClassDef, fn: Function, attr: str) -> str | None:
    """``{KEY: VALUE}`` for a dict ``self.attr`` that ``fn`` reads by a key and a method of
    the class fills by key; VALUE is the first the filler writes that is a literal
    once its guards are read (``if name == "trtllm": self.plans[b] = (name,)``)."""
    target = f"self.{attr}"
    keys = [n.slice for n in ast.walk(fn.node) if isinstance(n, ast.Subscript) and
            _text(n.value) == target and isinstance(n.ctx, ast.Load)]
    key = next((k for k in (_resolved(fn, k) for k in keys) if k is not None), None)
    if key is None:
        return None
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
                method.name == fn.name:
            continue
        for value in _guarded_values(method, target):
            try:
                ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
            return f"{{{key}: {_text(value)}}}"
    return None


def _class_in(pkg: Package, file: str, name: str) -> ast.ClassDef | None:
    return next((n for n in pkg.modules[file].tree.body if isinstance(n, ast.ClassDef) and
                 n.name == name), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name),
                None)


_SCALAR = {"int": None, "float": "1.0", "bool": "False", "str": "'x'"}


def real_class(pkg: Package, fn: Function, value: ast.expr) -> str | None:
    """``TARGET.module.C(args)`` where ``value`` constructs ``C``, a class of the
    function's own file whose ``__init__`` calls nothing (it only stores what it is
    given, so it builds on any machine) and whose required parameters are literals
    at the call or scalars by their annotation; else None."""
    from streamfuzz.fuzz.scan.harness_args import _int

    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
        return None
    cls = _class_in(pkg, fn.file, value.func.id)
    init = _method(cls, "__init__") if cls is not None else None
    if init is None or any(isinstance(n, ast.Call) for n in ast.walk(init)):
        return None
    a = init.args
    params = [*a.posonlyargs, *a.args][1:]
    required = params[:len(params) - len(a.defaults)]
    args = []
    for i, p in enumerate(required):
        given = value.args[i] if i < len(value.args) else None
        if isinstance(given, ast.Constant):
            args.append(_text(given))
            continue
        ann = _text(p.annotation)
        if ann not in _SCALAR:
            return None
        args.append(_SCALAR[ann] or _int(p.arg))
    return f"TARGET.module.{value.func.id}({', '.join(args)})"


def _result_needed(param: str, method: str, scope: ast.AST) -> str | None:
    """What ``param.method(...)`` must return for the code after it to go on: the
    literal a raising ``if r != LITERAL`` checks, True where ``not r`` leaves."""
    call = f"{param}.{method}"
    results = {n.targets[0].id for n in ast.walk(scope) if isinstance(n, ast.Assign) and
               len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and
               isinstance(n.value, ast.Call) and _text(n.value.func) == call}
    for n in ast.walk(scope):
        if not isinstance(n, ast.If) or not any(isinstance(s, (ast.Raise, ast.Return))
                                                for s in n.body):
            continue
        for t in ast.walk(n.test):
            if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(
                    t.ops[0], (ast.NotEq, ast.IsNot)) and isinstance(
                    t.comparators[0], ast.Constant) and (
                    _text(t.left) in results or _text(t.left).startswith(call + "(")):
                return _text(t.comparators[0])
            if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and (
                    _text(t.operand) in results or _text(t.operand).startswith(call + "(")):
                return "True"
    return None


def _aliases_of(scope: ast.AST, key: str) -> set[str]:
    return {key} | {n.targets[0].id for n in ast.walk(scope) if isinstance(n, ast.Assign)
                    and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and
                    _text(n.value) == key}


def duck_for(pkg: Package, fn: Function, cls: ast.ClassDef, attr: str,
             reals: dict[str, str]) -> str | None:
    """``self.attr`` where the class only passes it to a method of a collaborator it
    builds for real (``reals``: attribute -> class name): an object whose methods
    that collaborator calls return what its code checks for."""
    methods: dict[str, str] = {}
    for scope in cls.body:
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for owner, name in reals.items():
            holders = _aliases_of(scope, f"self.{owner}")
            for call in ast.walk(scope):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and _text(call.func.value) in holders):
                    continue
                where = [i for i, x in enumerate(call.args) if _text(x) == f"self.{attr}"]
                other = _class_in(pkg, fn.file, name)
                callee = _method(other, call.func.attr) if other is not None else None
                if not where or callee is None:
                    continue
                params = [p.arg for p in [*callee.args.posonlyargs, *callee.args.args][1:]]
                if where[0] >= len(params):
                    continue
                param = params[where[0]]
                for n in ast.walk(callee):
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                            _text(n.func.value) == param:
                        methods.setdefault(n.func.attr, _result_needed(
                            param, n.func.attr, callee) or "None")
    if not methods:
        return None
    fields = ", ".join(f"{m}=lambda *args, **kwargs: {v}" for m, v in sorted(methods.items()))
    return f"_Object({fields})"


_DRIVER = re.compile(r"""[b]?["'](cu[A-Z]\w+|cuda[A-Z]\w+)["']""")
_STREAM_WORK = re.compile(r"\btorch\.|\.copy_\(|\.record_stream\(|\.wait_stream\(|"
                          r"\.wait_event\(|\.record\(|\.synchronize\(")


def _imports(text: str, files: dict[str, SourceFile]) -> list[SourceFile]:
    """The package's files a file imports from (``from a.b import c``)."""
    out = []
    for m in re.finditer(r"^\s*from\s+([\w.]+)\s+import\b", text, re.M):
        path = m.group(1).replace(".", "/") + ".py"
        if path in files:
            out.append(files[path])
    return out


def _driver_symbol(f: SourceFile, files: dict[str, SourceFile]) -> str | None:
    """The CUDA driver or runtime entry a file (or one it imports from) calls through
    ctypes, named in a string: ``cuMemcpyBatchAsync``."""
    for g in [f, *_imports(f.text, files)]:
        if re.search(r"^\s*import ctypes\b", g.text, re.M):
            m = _DRIVER.search(g.text)
            if m:
                return m.group(1)
    return None


def unreachable(files: Iterable[SourceFile], pkg: Package, fn: Function) -> str | None:
    """Why a harness of ``fn`` would check nothing on this machine: its stream work is
    all in ``self.X.method()``, and every class the package assigns to ``self.X``
    reaches the GPU through ctypes (a CUDA driver entry a CPU run cannot call).
    None where the function does stream work of its own, or a collaborator builds."""
    if fn.cls is None or _STREAM_WORK.search(_text(fn.node)):
        return None
    cls = _class_in(pkg, fn.file, fn.qualname.split(".")[0])
    if cls is None:
        return None
    by_path = {f.path: f for f in files}
    for call in ast.walk(fn.node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        holder = _text(call.func.value)
        attr = holder[5:] if holder.startswith("self.") else (_bound_to(fn.node, holder) or "")[5:]
        if not attr:
            continue
        names = sorted({n.value.func.id for n in ast.walk(cls) if isinstance(n, ast.Assign)
                        and any(_text(t) == f"self.{attr}" for t in n.targets) and
                        isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)})
        found = []
        for name in names:
            home = next((f for f in by_path.values() if re.search(
                rf"^class {re.escape(name)}\b", f.text, re.M)), None)
            symbol = _driver_symbol(home, by_path) if home is not None else None
            if symbol is None:
                break
            found.append((name, symbol))
        else:
            if found:
                classes = " and ".join(n for n, _ in found)
                return (f"needs a GPU and the real {classes}: {fn.name}'s stream work is "
                        f"self.{attr}.{call.func.attr}(), whose copies go through ctypes "
                        f"({found[0][1]}), a CUDA driver call that is not simulated; a "
                        "stand-in would do no copy")
    return None
