"""Our Hypothesis settings profiles, kept apart from the user's global ones."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = ("default", "ci")

_BASE = dict(
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    verbosity=Verbosity.quiet,
    print_blob=False,
)


def get(name: str, database_dir: Path | None = None) -> settings:
    """``default`` keeps an example database (replays past failures first);
    ``ci`` has none, so runs depend on the seed alone."""
    if name == "ci":
        return settings(database=None, **_BASE)
    if name == "default":
        db = DirectoryBasedExampleDatabase(str(database_dir or Path(".hypothesis") / "streamfuzz"))
        return settings(database=db, **_BASE)
    raise ValueError(f"unknown profile {name!r}: use one of {', '.join(PROFILES)}")
