"""What one run asks of every example: which oracles judge it, how streams are held.

One frozen object, built and validated here, so that every command, every rank
and every replay agrees on what ran. It travels to the ranks as itself
(pickled), and into corpus entries as plain values (``to_dict``), so that
``fuzz replay`` judges an entry with the oracles that found it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from streamfuzz.fuzz.errors import BadInput


class Oracle(str, Enum):
    """A judge of one example. ``value`` runs in the driver; ``lifetime`` and
    ``reuse`` on the ranks (``reuse`` watches the CUDA caching allocator and
    has nothing to watch on CPU, where it is a no-op)."""

    VALUE = "value"
    LIFETIME = "lifetime"
    REUSE = "reuse"


class Hold(str, Enum):
    """How a delay that names a point holds a stream: a gate kernel opened at
    that point (spins where gates are unavailable), or a plain spin."""

    GATE = "gate"
    SPIN = "spin"


ALL = "all"
ORACLE_CHOICES = (ALL, *(o.value for o in Oracle))
"""What ``--oracle`` accepts; ``all`` is every member of ``Oracle``."""

_BLIND: dict[Oracle, dict[str, str]] = {
    Oracle.REUSE: {"cpu": "it watches the CUDA caching allocator, which a CPU run never uses"},
}
"""Per oracle, the devices it can see nothing on, and why."""

_LEGACY_ORACLES = frozenset({Oracle.VALUE})
"""What judged a corpus entry that does not say: entries written before the
oracles were recorded were all found by the value oracle."""


class OptionsError(BadInput, ValueError):
    """An option that names no oracle or hold; the message lists the choices."""


def parse_oracles(names: str | Iterable[str]) -> frozenset[Oracle]:
    """``"all"``, one name, a comma-separated list, or an iterable of those."""
    parts = [names] if isinstance(names, str) else list(names)
    chosen: set[Oracle] = set()
    for part in parts:
        for name in str(part.value if isinstance(part, Oracle) else part).split(","):
            name = name.strip()
            if name == ALL:
                chosen.update(Oracle)
            elif name in Oracle._value2member_map_:
                chosen.add(Oracle(name))
            elif name:
                raise OptionsError(f"unknown oracle {name!r}: use {', '.join(ORACLE_CHOICES)}")
    return frozenset(chosen)


def _hold(value: Hold | str) -> Hold:
    try:
        return Hold(value)
    except ValueError:
        raise OptionsError(f"unknown hold {value!r}: use "
                           f"{', '.join(h.value for h in Hold)}") from None


@dataclass(frozen=True)
class RunOptions:
    """Options every rank gets unchanged with every example.

    Defaults: every oracle, gates. Names are accepted wherever members are,
    and validated here. An empty oracle set can be built (the benchmark
    measures the harness alone that way), but a run that is to judge asks
    ``judging`` first, which refuses it.
    """

    oracles: frozenset[Oracle] = field(default_factory=lambda: frozenset(Oracle))
    hold: Hold = Hold.GATE

    def __post_init__(self) -> None:
        object.__setattr__(self, "oracles", parse_oracles(self.oracles))
        object.__setattr__(self, "hold", _hold(self.hold))

    @property
    def values(self) -> bool:
        """Whether the driver runs the value oracle."""
        return Oracle.VALUE in self.oracles

    def runs(self, oracle: Oracle) -> bool:
        return oracle in self.oracles

    def oracle_names(self) -> list[str]:
        """Sorted names, for reports, corpus entries and messages."""
        return sorted(o.value for o in self.oracles)

    def judging(self, device: str) -> list[str]:
        """Whether these oracles can judge a run on ``device`` ('cpu' or 'cuda'):
        the one-line notes to print beside the run (an oracle here that sees
        nothing on it), or OptionsError where none of them can see anything
        there, since the run would call any target clean. ``all`` is every
        oracle that applies, so it gets no note."""
        if not self.oracles:
            raise OptionsError("no oracle given, so nothing would judge the examples and any "
                               f"target would be clean: name at least one of "
                               f"{', '.join(ORACLE_CHOICES)}")
        blind = {o: why for o in sorted(self.oracles, key=lambda o: o.value)
                 if (why := _BLIND.get(o, {}).get(device))}
        if len(blind) == len(self.oracles):
            names = ", ".join(o.value for o in blind)
            raise OptionsError(f"oracle {names} sees nothing on {device}: "
                               f"{'; '.join(blind.values())}; add lifetime or value, "
                               f"or run it on cuda")
        if self.oracles == frozenset(Oracle):
            return []
        return [f"note: the {o.value} oracle sees nothing on {device} ({why}); "
                f"{', '.join(n for n in self.oracle_names() if Oracle(n) not in blind)} "
                "judge alone" for o, why in blind.items()]

    def running_on(self, device: str) -> list[str]:
        """The oracles of these that run on ``device`` ('cpu' or 'cuda'), sorted:
        the reuse watch needs CUDA's allocator. What the ranks report ran, and
        what a corpus entry records."""
        return sorted(o.value for o in self.oracles if device == "cuda" or o is not Oracle.REUSE)

    def to_dict(self) -> dict[str, Any]:
        return {"oracles": self.oracle_names(), "hold": self.hold.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunOptions:
        """From ``to_dict``'s form, as a corpus entry's ``found_on`` keeps it;
        an entry without ``oracles`` predates recording them (value only)."""
        oracles = data.get("oracles")
        return cls(oracles=_LEGACY_ORACLES if oracles is None else parse_oracles(oracles),
                   hold=data.get("hold", cls.hold))


DEFAULT = RunOptions()

MUTATE = RunOptions(oracles=frozenset({Oracle.LIFETIME}))
"""``fuzz mutate``'s default: a removed sync is a hazard whether or not a value
goes wrong, and only the lifetime oracle sees that on CPU."""
