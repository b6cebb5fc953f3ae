"""What every protocol's scenario shares: its error, its validation helpers, its holds.

A scenario is one example as plain values (no Hypothesis state), so a corpus
entry survives edits to the strategies; each protocol's own scenario module
builds on these.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from streamfuzz.fuzz.errors import BadInput

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEFAULT_SPIN = 5_000_000
"""Cycles a gate's hold spins when gates are unavailable and it names no cycles:
long enough to outlast the handler's host work (the README, on gates)."""


class ScenarioError(BadInput, ValueError):
    """A scenario that does not describe a runnable example."""


def spin_cycles(cycles: int, until: str) -> int:
    """The cycles a hold spins where it is not a gate: its own, else
    ``DEFAULT_SPIN`` for a gate's hold (``until`` set), else none."""
    return cycles or (DEFAULT_SPIN if until else 0)


def polls_held(cycles: int, until: str) -> int:
    """Polls a hold of a GPU stream answers "not done" on simulated streams,
    by how long it would spin on a GPU (``spin_cycles``): 1 up to 1e5 cycles,
    2 up to 1e6, 3 beyond."""
    cycles = spin_cycles(cycles, until)
    return 0 if cycles <= 0 else 1 if cycles <= 100_000 else 2 if cycles <= 1_000_000 else 3


def check(ok: bool, message: str) -> None:
    """Raise ScenarioError(message) unless ok: every protocol's scenario validates with it."""
    if not ok:
        raise ScenarioError(message)


def fields_of(data: Any, cls: type[DataclassInstance], where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where} must be an object")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where} has unknown field(s): {', '.join(unknown)}")
    return dict(data)


def plain(value: Any) -> Any:
    """JSON's values for ``value``: a dataclass as a dict of its fields, a tuple
    as a list, in one walk. ``asdict`` and then a second walk cost twice this,
    and a soak writes the examples in flight at every example."""
    names = _FIELDS.get(type(value))
    if names is None and is_dataclass(value) and not isinstance(value, type):
        names = _FIELDS[type(value)] = tuple(f.name for f in fields(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


_FIELDS: dict[type, tuple[str, ...]] = {}
