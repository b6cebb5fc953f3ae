"""The seam between the engine and the protocols it fuzzes: the registry.

A protocol bundles what is particular to one kind of cross-stream code: its
scenario type and strategies, its runner (the caller's side of the target:
what happens before, between and after the target's calls), its value oracle
(a CPU reference), its built-in targets and the correct one among them. The
driver, ranks, lifetime and reuse oracles, corpus, replay, matrix, soak and
mutate know only this interface. Parts are named by import spec and loaded on
first use, so this module stays light enough for the target registry to read.

Adding a protocol: its own modules, one ``Protocol`` value, one line in
``_DECLARED`` (or, for one that lives outside this package, its spec in
``STREAMFUZZ_PROTOCOLS``, which rank processes inherit).
``tests/test_third_protocol.py`` holds the engine to that. The shared parts
a protocol builds on: ``streamfuzz.fuzz.protocol.scenario`` and ``streamfuzz.fuzz.protocol.runner``.
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, runtime_checkable
from typing import Protocol as _TypingProtocol

from streamfuzz.fuzz import env
from streamfuzz.fuzz.errors import BadInput, FuzzError

DEFAULT = "draft-broadcast"
"""The protocol of a corpus entry that names none (entries from before there
were several) and of a user's target that declares none."""


class ProtocolError(BadInput, ValueError):
    """A protocol name or a scenario of no known protocol."""


ENV = env.PROTOCOLS
"""More protocols, as ``module:attr`` specs separated by commas."""


@runtime_checkable
class ScenarioType(_TypingProtocol):
    """What the engine asks of a protocol's scenario (an instance of its type)."""

    world_size: int

    def to_dict(self) -> dict[str, Any]: ...
    def describe(self) -> str: ...


@runtime_checkable
class Runner(_TypingProtocol):
    """A protocol's ``run`` part: one example on one rank -> its observations
    (``streamfuzz.fuzz.messages.Observations``); ``streamfuzz.fuzz.protocol.runner`` is its
    skeleton."""

    def __call__(self, scenario: Any, factory: Callable[[Any], Any], env: RankEnv,
                 options: Any) -> Any: ...


@dataclass(frozen=True)
class RankEnv:
    """What a rank offers every protocol's runner for one example."""

    rank: int
    world_size: int
    device: Any
    group: Any
    streams: Any
    calls: Counter[str] = field(default_factory=Counter)
    """What the runner called this example, by name (``Protocol.counted``),
    counted before each call: the rank sends it back whatever the example did."""


@dataclass(frozen=True)
class Protocol:
    """One protocol; every field but ``name`` and the target tables is an import spec.

    * ``scenario``: the scenario type (``from_dict``, ``to_dict``, ``describe``,
      ``world_size``);
    * ``strategy``: ``f(world_size=...) -> SearchStrategy`` of scenarios;
    * ``run``: ``f(scenario, factory, RankEnv, RunOptions) -> observations``
      (the protocol's subclass of ``streamfuzz.fuzz.messages.Observations``, with its
      own outputs), on the rank;
    * ``values``: ``f(scenario, observations) -> list[Failure]``, in the driver;
    * ``behaviours``: ``f(scenario) -> list[str]``, coarse labels of what an
      example exercised;
    * ``smallest``: ``f(world_size) -> scenario``, what the strategy shrinks
      to: a factory that raises there is set up wrong, not buggy.
    """

    name: str
    scenario: str
    strategy: str
    run: str
    values: str
    behaviours: str
    smallest: str
    versions: dict[str, str]
    """The versions ``fuzz run`` fuzzes when no target is named: name -> import spec."""
    mutants: dict[str, str] = field(default_factory=dict)
    correct: str = ""
    """The built-in version that must be clean; replay checks fixes against it."""
    variants: dict[str, str] = field(default_factory=dict)
    """Correct variants of ``correct`` written as engine code often is (host
    syncs): clean like it, runnable by name, not fuzzed by default."""
    families: tuple[str, ...] = ()
    """Upstream target families (``family@VERSION``) this protocol drives."""
    upstream: str = ""
    """Import spec of the loader of ``families`` (a ``streamfuzz.fuzz.targets.names.Family``):
    how ``family@VERSION`` becomes a factory, and what reports say it ran."""
    handler_methods: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per role (as a report names it), the handler methods the runner calls there."""
    receiver_side: frozenset[str] = frozenset()
    """Mutants whose planted bug lies only in the receiving roles: a world of
    one rank (one GPU) runs none of that code, so nothing can find them there."""
    alone: str = ""
    """The role of a world of one rank; every other role is the receiver side,
    which only a world of two or more runs."""
    callbacks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per role, what the runner hands the handler to call (counted like its methods)."""

    @property
    def counted(self) -> dict[str, tuple[str, ...]]:
        """Per role, every name coverage counts: the handler's methods, then callbacks."""
        return {role: ms + self.callbacks.get(role, ())
                for role, ms in self.handler_methods.items()}

    @property
    def targets(self) -> dict[str, str]:
        return {**self.versions, **self.mutants, **self.variants}

    def part(self, which: str) -> Any:
        return _load(getattr(self, which))


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


_DECLARED: tuple[str, ...] = (
    "streamfuzz.fuzz.draft:PROTOCOL",
    "streamfuzz.fuzz.weight_sync:PROTOCOL",
)


def all_protocols() -> dict[str, Protocol]:
    """Every protocol by name: the declared ones, then ``STREAMFUZZ_PROTOCOLS``'s."""
    extra = tuple(env.items(ENV))
    return _protocols(_DECLARED + extra)


@functools.cache
def _protocols(specs: tuple[str, ...]) -> dict[str, Protocol]:
    out: dict[str, Protocol] = {}
    for spec in specs:
        try:
            p = _load(spec)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ProtocolError(f"protocol {spec!r} cannot be loaded: {exc}") from None
        if not isinstance(p, Protocol):
            raise ProtocolError(f"{spec!r} is not a streamfuzz.fuzz.protocol.Protocol")
        out[p.name] = p
    return out


def get(name: str) -> Protocol:
    try:
        return all_protocols()[name]
    except KeyError:
        known = ", ".join(sorted(all_protocols()))
        raise ProtocolError(f"unknown protocol {name!r}: use one of {known}") from None


def builtin_targets() -> dict[str, str]:
    """Every protocol's built-in targets: name -> import spec."""
    out: dict[str, str] = {}
    for p in all_protocols().values():
        out.update(p.targets)
    return out


def methods_of(role: type) -> tuple[str, ...]:
    """The methods a role's ``typing.Protocol`` declares, in the order it
    declares them: the one source of a protocol's ``handler_methods``."""
    return tuple(n for n, v in vars(role).items() if callable(v) and not n.startswith("_"))


def check_handler(p: Protocol, handler: Any, role: str | None = None) -> None:
    """Raise ProtocolError, in one line, where ``handler`` (or a handler class)
    lacks a method ``p``'s runner calls in ``role`` (None: in every role),
    naming the protocol whose methods it has instead, if one."""
    wanted = p.handler_methods.get(role, ()) if role is not None else tuple(
        dict.fromkeys(m for ms in p.handler_methods.values() for m in ms))
    missing = [m for m in wanted if not callable(getattr(handler, m, None))]
    if not missing:
        return
    kind = handler if isinstance(handler, type) else type(handler)
    where = f" on {role}" if role is not None else ""
    hint = next((f"; it has the {q.name} protocol's methods: declare protocol = "
                 f"{q.name!r} on the factory (@streamfuzz.target, or a function or class "
                 f"attribute)"
                 for q in all_protocols().values() if q is not p and q.handler_methods
                 and all(callable(getattr(handler, m, None))
                         for ms in q.handler_methods.values() for m in ms)), "")
    raise ProtocolError(f"the handler {kind.__qualname__} has no {', '.join(missing)}, which "
                        f"the {p.name} protocol calls{where}{hint}")


class FactoryRaised(FuzzError):
    """The target's factory raised (the ``__cause__``), before any handler call.
    Where it does so on the smallest scenario too, the target is set up wrong
    (``streamfuzz.fuzz.driver``); else the scenario made it raise, a finding."""


def make_handler(factory: Callable[[Any], Any], ctx: Any) -> Any:
    """``factory(ctx)``, with what it raises marked as the factory's."""
    try:
        return factory(ctx)
    except Exception as exc:
        raise FactoryRaised(f"the factory raised {type(exc).__name__}") from exc


def of_factory(factory: Any) -> Protocol:
    """The protocol a user's factory declares (its ``protocol`` attribute, which
    ``streamfuzz.target`` sets); the draft broadcast's where it declares none."""
    declared = getattr(factory, "protocol", None)
    return get(declared) if isinstance(declared, str) else get(DEFAULT)


def of_scenario(scenario: Any) -> Protocol:
    for p in all_protocols().values():
        if isinstance(scenario, p.part("scenario")):
            return p
    raise ProtocolError(f"{type(scenario).__name__} is the scenario of no known protocol")
