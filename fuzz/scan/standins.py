"""Any package's module, compiled unchanged, with its unimportable imports stood in.

A harness written by ``scan --harness`` needs one function of any package,
with what it calls, without installing the package: ``load`` reads the
function's file from a tree, wheel, sdist or installed package, and runs it
as a module whose ``__import__`` answers in three ways. An import of the same
package loads that file from the same source, compiled unchanged too (so a
callee in another file does what it does), up to ``depth`` files away; any
other import is tried for real; what fails, or lies deeper, is handed a
stand-in. A stand-in is a class (so it can be subclassed, used in
annotations or called) whose attributes are stand-ins too; a call with one
callable argument returns it, so a stood-in decorator leaves the function as
it is. Every loaded file is a module in ``sys.modules`` under a private
prefix, as ``dataclasses`` and ``typing`` expect. A top-level statement that
raises (a path the real machine has) is skipped, the rest of the file runs.
``Loaded.stood_in`` names every stand-in handed out and every skipped
statement, for the harness to say what the user must fill in.
"""

from __future__ import annotations
import __future__

import ast
import builtins as _builtins
import dis
import inspect
import itertools
import linecache
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.scan.sources import ScanInputError, Source, open_source

PLATFORMS = ("npu", "xpu", "musa", "mlu", "hpu")
"""``torch.<name>`` device modules with CUDA's stream API that a package's files see
as ``torch.cuda`` (the simulated device, or the real one)."""

DEPTH = 2
"""How many files away from the function's own a package import is still loaded
for real: its callees' files, and theirs; further ones are stood in."""

_LOADS = itertools.count(1)


class _StandInType(type):
    """The metaclass of stand-ins: attribute access and indexing give stand-ins."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in(f"{cls.__qualname__}.{attr}", cls._registry)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(
                args[0], _StandInType):
            return args[0]  # a stood-in decorator
        _reads_tensors(cls.__qualname__, args, kwargs)
        if _PREDICATE.match(cls.__qualname__.rsplit(".", 1)[-1]):
            return False  # ``is_pin_memory_available()``: a flag torch takes only as a bool
        if _counted(sys._getframe(1)):
            return 1  # ``triton.cdiv(n, BLOCK)``: a count the code goes on to compute with
        count = _results_taken(sys._getframe(1))
        if count:
            return _results(count, args, kwargs, lambda: super(_StandInType, cls).__call__())
        return super().__call__()


_PREDICATE = re.compile(r"(is|has|supports?|can)_\w+$")


class _StandInBase:
    _registry: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in(f"{type(self).__qualname__}().{attr}", self._registry)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        _reads_tensors(f"{type(self).__qualname__}()", args, kwargs)
        if _counted(sys._getframe(1)):
            return 1
        made = _stand_in(f"{type(self).__qualname__}()()", self._registry)
        count = _results_taken(sys._getframe(1))
        if count:
            return _results(count, args, kwargs, made)
        return made()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


def _tensors_in(values: Any, depth: int = 0) -> list[Any]:
    torch = sys.modules["torch"]
    out: list[Any] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)) and depth < 2:
            out.extend(_tensors_in(v, depth + 1))
    return out


_TAKEN: dict[tuple[Any, int], int] = {}


def _results_taken(frame: Any) -> int:
    """How many results the caller takes from the call it is making: the names it
    unpacks them into (``hit, pos = kernel(...)``), or one more than the constant it
    indexes (``kernel(...)[1]``); 0 where it keeps the result whole. Read from the
    caller's bytecode after its call, so a stood-in kernel's outputs can be used as
    the code goes on to use them."""
    key = (frame.f_code, frame.f_lasti)
    taken = _TAKEN.get(key)
    if taken is None:
        after = [i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti][:2]
        taken = 0
        if after and after[0].opname == "UNPACK_SEQUENCE":
            taken = after[0].arg or 0
        elif len(after) == 2 and after[0].opname == "LOAD_CONST" and isinstance(
                after[0].argval, int) and after[1].opname == "BINARY_SUBSCR":
            taken = max(after[0].argval + 1, 0)
        _TAKEN[key] = taken
    return taken


_ARITHMETIC = frozenset({"BINARY_OP", "COMPARE_OP"})
_LOADS_ONE = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF"})
_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_COUNTED: dict[tuple[Any, int], bool] = {}


def _operand(instructions: list[Any], at: int) -> bool:
    """Whether the value pushed just before ``instructions[at]`` is an operand of
    arithmetic or a comparison: the next instruction is one, or one load comes first."""
    nxt = instructions[at:at + 2]
    if nxt and nxt[0].opname in _ARITHMETIC:
        return True
    return len(nxt) == 2 and nxt[0].opname in _LOADS_ONE and nxt[1].opname in _ARITHMETIC


def _counted(frame: Any) -> bool:
    """Whether the caller computes with the result of the call it is making: as an
    operand right away (``cdiv(n, b) * 2``), or through the name it stores it in
    (``tiles = cdiv(n, b)`` and later ``tiles * split``, ``tiles < sms``). Read from the
    caller's bytecode, as ``_results_taken`` is, so a stood-in helper that computes a
    count or a size gives a number the code can go on with."""
    key = (frame.f_code, frame.f_lasti)
    counted = _COUNTED.get(key)
    if counted is None:
        code = list(dis.get_instructions(frame.f_code))
        at = next((i for i, ins in enumerate(code) if ins.offset > frame.f_lasti), len(code))
        counted = _operand(code, at)
        if not counted and at < len(code) and code[at].opname in _STORES:
            name = code[at].argval
            counted = any(ins.opname == code[at].opname.replace("STORE", "LOAD")
                          and ins.argval == name and _operand(code, i + 1)
                          for i, ins in enumerate(code))
        _COUNTED[key] = counted
    return counted


def _results(count: int, args: Any, kwargs: Any, made: Any) -> tuple[Any, ...]:
    """``count`` outputs of a stood-in kernel: each a zeroed tensor like the one of its
    tensor arguments with the most dimensions (the last of those), as an extension's
    outputs are per element of its main input; stand-ins where it was given none."""
    tensors = _tensors_in([*args, *kwargs.values()]) if "torch" in sys.modules else []
    if not tensors:
        return tuple(made() for _ in range(count))
    torch = sys.modules["torch"]
    widest = max(reversed(tensors), key=lambda t: t.dim())
    return tuple(torch.zeros_like(widest) for _ in range(count))


def _reads_tensors(name: str, args: Any, kwargs: Any) -> None:
    """A stood-in call given tensors: an extension's kernel, seen as one that reads them
    on the current stream (its writes are not known, so not claimed)."""
    if "torch" not in sys.modules:
        return
    from streamfuzz.fuzz import streams

    if streams.running() is None and "streamfuzz.fuzz.oracles.lifetime_cuda" not in sys.modules:
        return
    tensors = _tensors_in([*args, *kwargs.values()])
    if tensors:
        from streamfuzz.fuzz.annotations import describe

        describe(tensors, [], f"stood-in {name}")


class _PlatformTorch(types.ModuleType):
    """``torch`` as a package's files see it: every platform's device module
    (``PLATFORMS``) is ``torch.cuda``."""

    def __getattr__(self, attr: str) -> Any:
        torch = sys.modules.get("torch")
        if torch is None:  # at interpreter exit (an engine's __del__): nothing to answer
            raise AttributeError(attr)
        if attr in PLATFORMS:
            return torch.cuda
        if attr == "get_device_module":  # the accelerator's module: the simulated one
            return lambda device=None: torch.cuda
        return getattr(torch, attr)


def _platform_torch() -> types.ModuleType:
    import torch

    proxy = _PlatformTorch("torch", torch.__doc__)
    proxy.__file__ = torch.__file__
    proxy.__path__ = list(torch.__path__)
    return proxy


def _stand_in(name: str, registry: list[str]) -> type:
    if name not in registry:
        registry.append(name)
    return _StandInType(name.rsplit(".", 1)[-1], (_StandInBase,),
                        {"__qualname__": name, "_registry": registry,
                         "__module__": "streamfuzz.standin"})


@dataclass
class Loaded:
    """The function's module, its file's name in tracebacks, and what was stood in."""

    module: types.ModuleType
    filename: str
    stood_in: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)  # the package's other files run for real


def load(spec: str, file: str, name: str = "_streamfuzz_target", depth: int = DEPTH) -> Loaded:
    """``file`` of ``spec``, run as a module; raises ``ScanInputError``."""
    source = open_source(spec)
    return _Loader(source, f"{name}{next(_LOADS)}", depth).target(file)


def find_text(source: Any, file: str) -> str:
    """The text of ``file`` in ``source``: an exact path, else the one path ending so."""
    return source_file(source, file)[1]


def source_file(source: Any, file: str) -> tuple[str, str]:
    """The path and text of ``file`` in ``source`` (an exact path, else the one ending so)."""
    want = file.replace("\\", "/").lstrip("./")
    matches = []
    for f in source.files():
        if f.path == want:
            return f.path, f.text
        if f.path.endswith("/" + want) or want.endswith("/" + f.path):
            matches.append(f)
    if len(matches) == 1:
        return matches[0].path, matches[0].text
    if not matches:
        raise ScanInputError(f"{file}: no such Python file in {source.spec}")
    raise ScanInputError(f"{file}: {len(matches)} files in {source.spec} end so; give more "
                         "of the path")


def module_name(path: str) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``pkg/__init__.py`` -> ``pkg``."""
    parts = path[:-3].split("/") if path.endswith(".py") else path.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


class _Loader:
    """One load: the source's files by module name, and the modules run so far."""

    def __init__(self, source: Source, prefix: str, depth: int) -> None:
        self.source, self.prefix, self.depth = source, prefix, depth
        self.texts: dict[str, tuple[str, str]] = {}  # module -> (path, text)
        self.packages: set[str] = set()
        for f in source.files():
            mod = module_name(f.path)
            if mod and mod not in self.texts:
                self.texts[mod] = (f.path, f.text)
            if f.path.endswith("/__init__.py") or f.path == "__init__.py":
                self.packages.add(mod)
        self.tops = {m.split(".")[0] for m in self.texts}
        self.modules: dict[str, types.ModuleType] = {}
        self.stood: list[str] = []
        self.loaded: list[str] = []

    def target(self, file: str) -> Loaded:
        path, _ = source_file(self.source, file)
        mod = module_name(path)
        module = self._run(mod, 0)
        if module is None:
            raise ScanInputError(f"{file}: could not be run as a module ({self.failed})")
        return Loaded(module, module.__file__ or path, self.stood,
                      [m for m in self.loaded if m != mod])

    failed = ""

    def _filename(self, path: str) -> str:
        if self.source.kind == "file":
            return path
        return f"{self.source.label}/{path}".replace(" ", "-")

    def _run(self, mod: str, level: int) -> types.ModuleType | None:
        """Module ``mod`` of the source, run ``level`` files from the function's; None
        where it raised (its importer stands it in)."""
        if mod in self.modules:
            return self.modules[mod]
        path, text = self.texts[mod]
        filename = self._filename(path)
        linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
        module = types.ModuleType(f"{self.prefix}.{mod}")
        module.__file__ = filename
        module.__package__ = mod if mod in self.packages else mod.rpartition(".")[0]
        if mod in self.packages:
            module.__path__ = []
        module.__dict__["__builtins__"] = {**_builtins.__dict__,
                                           "__import__": self._importer(level)}
        self.modules[mod] = module
        sys.modules[module.__name__] = module
        try:
            skipped = _run_statements(text, filename, module.__dict__, self.stood)
        except SyntaxError as exc:  # a file that does not parse is stood in
            if level == 0:
                raise ScanInputError(f"{path}: {exc}") from None
            self.failed = f"SyntaxError: {exc}".splitlines()[0]
            del self.modules[mod]
            sys.modules.pop(module.__name__, None)
            return None
        self.stood.extend(f"{path}:{line} ({why})" for line, why in skipped)
        _launchable(text, module.__dict__)
        self.loaded.append(mod)
        return module

    def _importer(self, level_of_file: int) -> Any:
        def _import(mod: str, globals: Any = None, locals: Any = None,  # noqa: A002
                    fromlist: Any = (), level: int = 0) -> Any:
            absolute = _absolute(mod, globals, level)
            if absolute is not None and absolute.split(".")[0] in self.tops:
                return self._package_import(absolute, fromlist, level_of_file + 1)
            if level == 0 and (mod == "torch" or mod.startswith("torch.")):
                return self._torch(mod, fromlist)
            if level == 0:
                try:
                    return _builtins.__import__(mod, globals, locals, fromlist, level)
                except Exception:  # noqa: BLE001 - any failure to import is stood in
                    pass
            return _module_stand_in("." * level + mod, fromlist, self.stood)
        return _import

    def _torch(self, mod: str, fromlist: Any) -> Any:
        """``import torch...``: the real modules, seen through ``_PlatformTorch``, where a
        platform's device module is ``torch.cuda``."""
        parts = mod.split(".")
        if len(parts) > 1 and parts[1] in PLATFORMS:
            import torch

            if fromlist:
                return torch.cuda if len(parts) == 2 else _module_stand_in(mod, fromlist,
                                                                           self.stood)
            return self._torch_proxy()
        module = _builtins.__import__(mod, None, None, fromlist, 0)
        if fromlist and mod != "torch":
            return module
        return self._torch_proxy()

    _proxy: types.ModuleType | None = None

    def _torch_proxy(self) -> types.ModuleType:
        if self._proxy is None:
            self._proxy = _platform_torch()
        return self._proxy

    def _package_import(self, absolute: str, fromlist: Any, level: int) -> Any:
        """``import absolute`` (or ``from absolute import ...``) inside the package."""
        names = [a for a in fromlist or () if a != "*"]
        subs = absolute in self.packages and names and all(
            f"{absolute}.{a}" in self.texts or f"{absolute}.{a}" in self.packages for a in names)
        if not fromlist:  # ``import a.b.c``: the chain of packages down to it, then it
            parts = absolute.split(".")
            for i in range(1, len(parts)):
                self._module(".".join(parts[:i]), level, shallow=True)
        module = self._module(absolute, level, shallow=bool(subs))
        for attr in fromlist or ():
            if attr == "*" or hasattr(module, attr):
                continue
            sub = f"{absolute}.{attr}"
            value = self._module(sub, level) if sub in self.texts else None
            setattr(module, attr, value if value is not None else
                    _stand_in(f"{absolute}.{attr}", self.stood))
        if fromlist:
            return module
        return self.modules.get(absolute.split(".")[0], module)

    def _module(self, mod: str, level: int, shallow: bool = False) -> Any:
        """The package's module ``mod``: run from its file within ``depth``, else a
        stand-in; a package on the way to a submodule is an empty module whose
        submodules load on first use (its ``__init__`` runs only when imported)."""
        if mod in self.modules:
            return self.modules[mod]
        if not shallow and mod in self.texts and level <= self.depth:
            module = self._run(mod, level)
            if module is not None:
                self._link(mod)
                return module
            shown = f"{mod} (failed: {self.failed})"
            return _module_stand_in(mod, (), self.stood, shown=shown)
        if mod in self.packages or any(m.startswith(mod + ".") for m in self.texts):
            return self._shell(mod, level)
        return _module_stand_in(mod, (), self.stood)

    def _shell(self, mod: str, level: int) -> types.ModuleType:
        shell = types.ModuleType(f"{self.prefix}.{mod}")
        shell.__path__ = []

        def _getattr(attr: str) -> Any:
            sub = f"{mod}.{attr}"
            value = self._module(sub, level) if (
                sub in self.texts or any(m.startswith(sub + ".") for m in self.texts)) else None
            if value is None:
                value = _stand_in(sub, self.stood)
            setattr(shell, attr, value)
            return value

        shell.__getattr__ = _getattr  # type: ignore[method-assign]
        self.modules[mod] = shell
        self._link(mod)
        return shell

    def _link(self, mod: str) -> None:
        """Set ``mod`` on its parent package's module, where that is already made."""
        parent, _, attr = mod.rpartition(".")
        if parent in self.modules and not hasattr(self.modules[parent], attr):
            setattr(self.modules[parent], attr, self.modules[mod])


class _Kernel:
    """A ``@jit`` kernel whose compiler is not here (its decorator left the plain
    function, the package's own placeholder or a stood-in compiler's):
    ``kernel[grid](...)`` is an extension's launch on the current stream, seen as one
    that reads its tensors, as a stood-in kernel is, and writes those it takes as
    parameters named as outputs (``out``, ``output_ptr``, ``dst``): the only
    statement of its writes a kernel's signature makes."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> None:
            written = _outputs(self.fn, args, kwargs)
            if not written:
                _reads_tensors(f"{self.__name__}[grid]", args, kwargs)
                return
            from streamfuzz.fuzz.annotations import describe

            tensors = _tensors_in([*args, *kwargs.values()])
            describe([t for t in tensors if not any(t is w for w in written)], written,
                     f"stood-in {self.__name__}[grid]")
        return launch


_OUTPUT = re.compile(r"(^|_)(out|output|outputs|dst|dest|result)(_|$)", re.IGNORECASE)


def _outputs(fn: Any, args: Any, kwargs: Any) -> list[Any]:
    """The tensors a launch passes to ``fn``'s parameters named as outputs."""
    if "torch" not in sys.modules:
        return []
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return []
    torch = sys.modules["torch"]
    return [v for k, v in bound.items() if _OUTPUT.search(k) and isinstance(v, torch.Tensor)]


_JIT = re.compile(r"(^|\.)(jit|autotune|heuristics)$")


def _launchable(text: str, namespace: dict[str, Any]) -> None:
    """Wrap each top-level ``@...jit`` function that is still a plain function."""
    for stmt in ast.parse(text).body:
        if not isinstance(stmt, ast.FunctionDef) or not any(
                _JIT.search(ast.unparse(d.func if isinstance(d, ast.Call) else d))
                for d in stmt.decorator_list):
            continue
        value = namespace.get(stmt.name)
        if isinstance(value, types.FunctionType):
            namespace[stmt.name] = _Kernel(value)


def _run_statements(text: str, filename: str, namespace: dict[str, Any],
                    stood: list[str]) -> list[tuple[int, str]]:
    """Run a file's top-level statements one by one; one that raises is skipped (a
    module-level line that needs the real machine, such as a CUDA_HOME path, must
    not keep the functions below it from being defined), and each name it would
    have bound and did not is a stand-in. The skipped: (line, why)."""
    tree = ast.parse(text, filename)
    flags = 0
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            for alias in stmt.names:
                feature = getattr(__future__, alias.name, None)
                flags |= getattr(feature, "compiler_flag", 0)
    skipped = []
    for stmt in tree.body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), filename, "exec",
                       flags=flags, dont_inherit=True)
        try:
            exec(code, namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - the statement is skipped, said in stood_in
            skipped.append((stmt.lineno, f"{type(exc).__name__}: {exc}".splitlines()[0][:120]))
            for name in _bound_names(stmt):
                if name not in namespace:
                    namespace[name] = _stand_in(name, stood)
    return skipped


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The module-level names a statement binds (not those inside its functions)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    out: list[str] = []
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.append(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _absolute(mod: str, globals: Any, level: int) -> str | None:
    """The absolute name of ``mod`` imported at ``level`` from a module with ``globals``."""
    if level == 0:
        return mod
    package = (globals or {}).get("__package__") or ""
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[:len(parts) - (level - 1)]
    return ".".join([*base, mod] if mod else base) or None


def _module_stand_in(name: str, fromlist: Any, stood: list[str],
                     shown: str | None = None) -> types.ModuleType:
    mod = types.ModuleType(name, "streamfuzz stand-in (streamfuzz.standins)")
    label = shown or name
    if label not in stood:
        stood.append(label)
    for attr in fromlist or ():
        if attr != "*":
            setattr(mod, attr, _stand_in(f"{name}.{attr}", stood))
    mod.__getattr__ = lambda attr: _stand_in(f"{name}.{attr}", stood)  # type: ignore[method-assign]
    return mod
