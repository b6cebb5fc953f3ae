"""Any package's module, compiled unchanged, with its unimportable imports stood in.

``streamfuzz.fuzz.targets.vllm_standins`` answers the few vLLM imports of ``PPHandler``
by hand. A harness written by ``fuzz scan --harness`` needs the same for any
function of any package: ``load`` reads one file from a tree, wheel, sdist or
installed package, and runs it as a module whose ``__import__`` tries the real
import first and, where that fails, hands back a stand-in. A stand-in is a
class (so it can be subclassed, used in annotations or called) whose
attributes are stand-ins too; a call with one callable argument returns it, so
a stood-in decorator leaves the function as it is. ``Loaded.stood_in`` names
every stand-in handed out, for the harness to say what the user must fill in.
"""

from __future__ import annotations

import builtins as _builtins
import linecache
import types
from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.scan.sources import ScanInputError, open_source


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
        return super().__call__()


class _StandInBase:
    _registry: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in(f"{type(self).__qualname__}().{attr}", self._registry)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _stand_in(f"{type(self).__qualname__}()()", self._registry)()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


def _stand_in(name: str, registry: list[str]) -> type:
    if name not in registry:
        registry.append(name)
    return _StandInType(name.rsplit(".", 1)[-1], (_StandInBase,),
                        {"__qualname__": name, "_registry": registry,
                         "__module__": "streamfuzz.standin"})


@dataclass
class Loaded:
    module: types.ModuleType
    filename: str
    stood_in: list[str] = field(default_factory=list)


def load(spec: str, file: str, name: str = "_streamfuzz_target") -> Loaded:
    """``file`` of ``spec``, run as module ``name``; raises ``ScanInputError``."""
    source = open_source(spec)
    text = find_text(source, file)
    filename = file if source.kind == "file" else f"{source.label}/{file}".replace(" ", "-")
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    stood: list[str] = []

    def _import(mod: str, globals: Any = None, locals: Any = None,  # noqa: A002
                fromlist: Any = (), level: int = 0) -> Any:
        if level == 0:
            try:
                return _builtins.__import__(mod, globals, locals, fromlist, level)
            except Exception:  # noqa: BLE001 - any failure to import is stood in
                pass
        shown = "." * level + mod
        return _module_stand_in(shown, fromlist, stood)

    module = types.ModuleType(name)
    module.__file__ = filename
    module.__dict__["__builtins__"] = {**_builtins.__dict__, "__import__": _import}
    exec(compile(text, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    return Loaded(module, filename, stood)


def find_text(source: Any, file: str) -> str:
    """The text of ``file`` in ``source``: an exact path, else the one path ending so."""
    want = file.replace("\\", "/").lstrip("./")
    matches = []
    for f in source.files():
        if f.path == want:
            return f.text
        if f.path.endswith("/" + want) or want.endswith("/" + f.path):
            matches.append(f)
    if len(matches) == 1:
        return matches[0].text
    if not matches:
        raise ScanInputError(f"{file}: no such Python file in {source.spec}")
    raise ScanInputError(f"{file}: {len(matches)} files in {source.spec} end so; give more "
                         "of the path")


def _module_stand_in(name: str, fromlist: Any, stood: list[str]) -> types.ModuleType:
    mod = types.ModuleType(name, "streamfuzz stand-in (streamfuzz.fuzz.targets.standins)")
    if name not in stood:
        stood.append(name)
    for attr in fromlist or ():
        if attr != "*":
            setattr(mod, attr, _stand_in(f"{name}.{attr}", stood))
    mod.__getattr__ = lambda attr: _stand_in(f"{name}.{attr}", stood)  # type: ignore[method-assign]
    return mod
