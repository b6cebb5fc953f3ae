"""One run, as the command line asked for it: parsed, resolved and checked once.

The commands build a frozen ``Plan`` before any work (``streamfuzz.fuzz.commands.plan``;
bad input: one line, exit 2), and pass it, or its parts, down: the targets resolved once
(``streamfuzz.fuzz.targets.resolve_target``), the device and world size
decided, the number of worlds, and ``world_of``, the one field that says
whether this process is one of several worlds. Nothing below the commands
reads an ``argparse.Namespace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from streamfuzz.fuzz.messages import Target
from streamfuzz.fuzz.options import Oracle, RunOptions


@dataclass(frozen=True)
class WorldOf:
    """Which world a child process is, and the folder the worlds share."""

    index: int
    count: int
    shared: Path

    @classmethod
    def parse(cls, text: str) -> WorldOf:
        head, sep, shared = text.partition(":")
        index, slash, count = head.partition("/")
        if not (sep and slash and index.isdigit() and count.isdigit() and shared):
            raise ValueError(f"{text!r} is not I/N:FOLDER")
        return cls(int(index), int(count), Path(shared))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}:{self.shared}"


@dataclass(frozen=True)
class RunSettings:
    """What only ``run`` asks for."""

    max_examples: int
    budget_s: float | None
    shrink_budget_s: float
    weight_scale: int
    report: Path | None
    profile: str
    requested_device: str
    """``--device`` as given (``auto`` included): the report of a run
    interrupted before the device was known names it."""


@dataclass(frozen=True)
class SoakSettings:
    """What only ``soak`` asks for."""

    budget_s: float
    out: Path
    database: Path | None
    round_s: float
    shrink_s: float | None
    round_examples: int
    stats_every_s: float
    recycle_mib: float
    listen: tuple[str, int] | None
    ranks_external: int | None
    startup_timeout_s: float
    authkey: bytes | None


@dataclass(frozen=True)
class MatrixSettings:
    """What only ``matrix`` asks for."""

    max_examples: int
    seeds: int
    columns: tuple[frozenset[Oracle], ...] | None
    """The oracles of each column, as given (None: the default columns)."""
    expect: tuple[tuple[str | None, str], ...]


@dataclass(frozen=True)
class Plan:
    """A command's run: what every process of it must agree on."""

    command: str
    argv: tuple[str, ...]
    """The command line as given. A world is not given one to parse again: its
    controller hands it its plan (``streamfuzz.fuzz.worlds.child.write_plan``)."""
    targets: tuple[Target, ...]
    device: str
    world_size: int
    options: RunOptions
    timeout_s: float
    corpus: Path
    seed: int | None = None
    worlds: int = 1
    world_of: WorldOf | None = None
    """Which world this process is (None: the only one, or the worlds' controller)."""
    mps: str = "off"
    run: RunSettings | None = None
    soak: SoakSettings | None = None
    matrix: MatrixSettings | None = None

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.targets]

    @property
    def speaks_for_all(self) -> bool:
        """Whether this process prints what the whole run found: the only
        world, or the controller of several (each world's is merged there)."""
        return self.world_of is None

    def run_settings(self) -> RunSettings:
        assert self.run is not None, self.command
        return self.run

    def soak_settings(self) -> SoakSettings:
        assert self.soak is not None, self.command
        return self.soak

    def matrix_settings(self) -> MatrixSettings:
        assert self.matrix is not None, self.command
        return self.matrix
