"""What the lifetime model keeps of each storage: its accesses, per stream and kind.

An access is a point on a stream's vector clock plus where it was made and
which bytes it touched. Per storage, each stream keeps only the accesses no
later one of its own covers (a later access of the same bytes is ordered
after them), at most ``_MAX_KEPT`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from streamfuzz.fuzz.frames import Frames
from streamfuzz.fuzz.oracles.spans import WHOLE, Span, covers, union

Clock = dict[Any, int]
_MAX_KEPT = 16
"""The most accesses a storage keeps per stream and kind (older ones merge: more
overlap, never less)."""


def join(into: Clock, other: Clock) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


@dataclass(slots=True)
class Access:
    """One use of a storage: on which stream, at which point, by which op, from
    where, and which of its bytes (``span``). ``alloc``: not a use but the
    allocation itself, standing for the work queued on its stream before it
    that may still use the block (``LifetimeModel.allocate``)."""

    stream: Any
    time: int
    op: str
    write: bool
    frames: Frames
    step: int | None
    span: Span = WHOLE
    alloc: bool = False


def ordered(a: Access, point: Clock) -> bool:
    """Whether access ``a`` happens before ``point`` on every interleaving."""
    return point.get(a.stream, 0) >= a.time


Accesses = dict[Any, list[Access]]
"""Per stream, its accesses of one kind to one storage that no later one of its own covers."""


def keep(table: Accesses, now: Access) -> None:
    """Add ``now`` to its stream's accesses, dropping those it covers: a later
    access of the same stream over the same bytes is ordered after them, so
    whatever races with them races with it."""
    kept = table.get(now.stream)
    if kept is None or now.span is WHOLE:
        table[now.stream] = [now]
        return
    kept = [a for a in kept if not covers(now.span, a.span)]
    if len(kept) >= _MAX_KEPT:
        first, second = kept[0], kept[1]
        kept[:2] = [replace(second, span=union(first.span, second.span))]
    kept.append(now)
    table[now.stream] = kept


def drop_covered(table: Accesses, now: Access) -> None:
    kept = table.get(now.stream)
    if kept:
        kept = [a for a in kept if not covers(now.span, a.span)]
        if kept:
            table[now.stream] = kept
        else:
            del table[now.stream]


@dataclass(slots=True)
class StorageInfo:
    """What the model knows of one live storage (never the storage itself)."""

    key: int
    ref: Any
    stream: Any
    shape: tuple[int, ...]
    dtype: str
    alloc_op: str
    alloc_frames: Frames
    nbytes: int = 0
    name: str | None = None
    recorded: set[Any] = field(default_factory=set)
    writes: Accesses = field(default_factory=dict)
    reads: Accesses = field(default_factory=dict)
    reported: set[tuple[Any, ...]] = field(default_factory=set)
    """The pairs of sites already reported as racing on this storage."""


def site(a: Access) -> tuple[str, tuple[str, int, str] | None]:
    """Where an access was made: its op and innermost frame."""
    return a.op, a.frames[0] if a.frames else None
