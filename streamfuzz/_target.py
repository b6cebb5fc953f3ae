"""``streamfuzz.target``: which protocol a target factory serves, said once and typed.

The engine reads the factory's ``protocol`` attribute (``make.protocol =
"weight-sync"`` still works); this decorator sets it, from the name given or
from the factory's context annotation, and lets a type checker hold the
factory's handler to that protocol's ``typing.Protocol``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from streamfuzz.fuzz.errors import BadInput

if TYPE_CHECKING:
    from streamfuzz.draft import DraftContext, DraftHandler
    from streamfuzz.weight_sync import WeightSyncContext, WeightSyncHandler

ProtocolName = Literal["draft-broadcast", "weight-sync"]
"""The protocols this package ships; one added through ``STREAMFUZZ_PROTOCOLS``
is declared with the ``protocol`` attribute instead."""

_BY_CONTEXT: dict[str, str] = {"DraftContext": "draft-broadcast",
                               "TargetContext": "draft-broadcast",
                               "WeightSyncContext": "weight-sync"}
"""A context type's name -> the protocol whose handlers are built from it."""

_Draft = TypeVar("_Draft", bound="Callable[[DraftContext], DraftHandler]")
_Weights = TypeVar("_Weights", bound="Callable[[WeightSyncContext], WeightSyncHandler]")


@overload
def target(factory: _Draft, /) -> _Draft: ...
@overload
def target(factory: _Weights, /) -> _Weights: ...
@overload
def target(*, protocol: Literal["draft-broadcast"]) -> Callable[[_Draft], _Draft]: ...
@overload
def target(*, protocol: Literal["weight-sync"]) -> Callable[[_Weights], _Weights]: ...
def target(factory: Any = None, /, *, protocol: str | None = None) -> Any:
    """Mark ``factory`` as a target of ``protocol``; bare, the protocol is the
    one whose context the factory's first parameter is annotated with."""
    if factory is None:
        if protocol is None:
            raise BadInput("streamfuzz.target: give a factory or protocol=")
        return lambda f: _mark(f, protocol)
    return _mark(factory, protocol if protocol is not None else _inferred(factory))


def _mark(factory: Any, protocol: str) -> Any:
    if not callable(factory):
        raise BadInput(f"streamfuzz.target: {factory!r} is not a factory (a callable)")
    factory.protocol = protocol
    return factory


def _inferred(factory: Callable[..., Any]) -> str:
    """The protocol of the context type ``factory``'s first parameter names
    (a class or, under ``from __future__ import annotations``, its name)."""
    try:
        first = next(iter(inspect.signature(factory).parameters.values()), None)
    except (TypeError, ValueError):
        first = None
    annotation = first.annotation if first is not None else inspect.Parameter.empty
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    found = _BY_CONTEXT.get(name.rpartition(".")[2])
    if found is None:
        where = getattr(factory, "__qualname__", repr(factory))
        raise BadInput(f"streamfuzz.target: cannot tell the protocol of {where}: annotate its "
                       f"first parameter as {', '.join(sorted(_BY_CONTEXT))} or pass protocol=")
    return found
