"""The messages between the driver and its ranks, and what they carry.

One plain frozen dataclass per message, pickled as it is. Each side looks up
one handler by the message's type (``handler``), so a message it does not
know is one clear error, not a tuple unpacked wrong. A rank sends one ``Done``
or ``Raised`` per example: keep them flat (no validation, no conversion).

Driver to rank: ``Run``, ``Stats``, ``Stop``. Rank to driver: ``Hello`` (once,
with its ``RankInfo``), ``Done`` or ``Raised`` (per example), ``StatsReply``.
A protocol's runner returns a subclass of ``Observations`` with its outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.verdict import Failure


class UnknownMessageError(FuzzError, RuntimeError):
    """A message of a type the receiver has no handler for (the two sides are
    from different versions of the engine, or a bug)."""


H = TypeVar("H")


def handler(handlers: Mapping[type, H], msg: object, sender: str) -> H:
    """The handler for ``msg``'s type in ``handlers``; raises UnknownMessageError."""
    try:
        return handlers[type(msg)]
    except KeyError:
        known = ", ".join(sorted(t.__name__ for t in handlers))
        raise UnknownMessageError(
            f"{sender} sent a {type(msg).__module__}.{type(msg).__qualname__} "
            f"({str(msg)[:80]}), which is none of the messages expected here "
            f"({known}); are both sides running the same streamfuzz?") from None


# -- what a rank says about itself ----------------------------------------------
@dataclass(frozen=True)
class Memory:
    """A rank's memory now, in bytes: resident set and, on CUDA, the caching
    allocator's allocated and reserved bytes."""

    rss: int
    gpu_alloc: int | None = None
    gpu_reserved: int | None = None

    def to_dict(self) -> dict[str, int]:
        """The fields that apply (soak samples keep no CUDA fields on CPU)."""
        return {k: v for k, v in (("rss", self.rss), ("gpu_alloc", self.gpu_alloc),
                                  ("gpu_reserved", self.gpu_reserved)) if v is not None}


@dataclass(frozen=True)
class RankInfo:
    """What a rank reports once, when it joins the driver."""

    rank: int
    world_size: int
    pid: int
    node: str
    torch: str
    device_name: str
    backend: str
    gates: str
    """The gate kind (``none`` on CPU), or why gates are unavailable."""
    mem: Memory
    setup_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of the rank's cold start, for the benchmark."""
    kernels: str | None = None
    """Why the kernels were not warmed up (None: warmed, or not a GPU)."""


@dataclass(frozen=True)
class Observations:
    """One rank's side of one example, for the oracles in the driver.

    ``held``: how streams were actually held; ``oracles``: the rank-side
    oracles that ran; ``findings``: what they found, built on the rank. A
    protocol's runner returns a subclass that adds its outputs.
    """

    rank: int
    held: tuple[str, ...]
    oracles: tuple[str, ...]
    findings: tuple[Failure, ...]


# -- driver to rank ---------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """A target resolved once, in the driver (``streamfuzz.fuzz.targets.resolve_target``):
    the rank imports ``name`` and speaks ``protocol`` without deciding it again.

    ``spec``: the import spec of a built-in or user factory (``module:attr``),
    None for an upstream family (its protocol's loader finds the code);
    ``family`` and ``version``: the upstream family's (version None: installed).
    """

    name: str
    protocol: str
    spec: str | None = None
    family: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Run:
    """Run example ``eid``: ``scenario`` against ``target`` with ``options``."""

    eid: int
    target: Target
    scenario: Any
    options: RunOptions


@dataclass(frozen=True)
class Stats:
    """Ask for the rank's memory (between examples)."""


@dataclass(frozen=True)
class Stop:
    """Leave the process group and exit."""


# -- rank to driver ---------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    info: RankInfo


@dataclass(frozen=True)
class StatsReply:
    rank: int
    mem: Memory
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage so far (``streamfuzz.fuzz.stages``; empty unless counting is on)."""


@dataclass(frozen=True)
class Done:
    """Example ``eid`` ran to its end on ``rank``."""

    eid: int
    rank: int
    observations: Observations
    calls: dict[str, int] = field(default_factory=dict)
    """What the runner called on this rank this example (``RankEnv.calls``)."""


@dataclass(frozen=True)
class Raised:
    """Example ``eid`` raised on ``rank``: the exception line, the user's frames
    (innermost first), and whether the rank exits after this (a CUDA error).
    ``usage``: the target is set up wrong (not a finding: the run stops);
    ``setup``: the factory raised it, before any handler call; ``calls``: what
    the runner called before the exception (``RankEnv.calls``)."""

    eid: int
    rank: int
    error: str
    frames: str
    fatal: bool
    usage: bool = False
    setup: bool = False
    calls: dict[str, int] = field(default_factory=dict)
