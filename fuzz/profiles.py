"""Our Hypothesis settings profiles, kept apart from the user's global ones."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = ("default", "ci")

_BASE: dict[str, Any] = dict(
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


_LOCK = threading.Lock()
_ACTIVE = 0
_REAL_POOL: Any = None
"""Hypothesis's private constants pool while ``seed_only`` has replaced it."""


@contextmanager
def seed_only() -> Iterator[None]:
    """While it is entered, examples depend on the seed and the strategies alone.

    Hypothesis also draws integers from a pool of constants that it reads out
    of every local module imported so far: ours, a user's target, whatever the
    command happened to import. The same seed then gave other examples under
    ``fuzz soak`` than under ``fuzz run``, with one more target listed, from
    another directory, or after any edit to the project's source. This empties
    that pool (Hypothesis's own constants stay). Reentrant and thread-safe:
    ``fuzz mutate`` fuzzes from several threads at once.
    """
    global _ACTIVE, _REAL_POOL
    try:
        from hypothesis.internal.conjecture import providers
        pool, empty, cache = (providers._get_local_constants, providers.Constants(),
                              providers.CONSTANTS_CACHE)
    except (ImportError, AttributeError):  # a Hypothesis without the pool
        yield
        return
    with _LOCK:
        if _ACTIVE == 0:
            _REAL_POOL = pool
            providers._get_local_constants = lambda: empty
        _ACTIVE += 1
    cache.cache.clear()  # per thread: filled from whichever pool was in force
    try:
        yield
    finally:
        cache.cache.clear()
        with _LOCK:
            _ACTIVE -= 1
            if _ACTIVE == 0:
                providers._get_local_constants = _REAL_POOL


_GC_USERS = 0
_GC_SAVED = (700, 10, 10)
YOUNG_THRESHOLD = 10_000


@contextmanager
def rare_collections() -> Iterator[None]:
    """While it is entered, the cyclic collector runs every ``YOUNG_THRESHOLD``
    allocations, not every 700.

    Hypothesis allocates thousands of short-lived objects per example (choice
    nodes, spans, its caches' entries): at the default threshold the collector
    ran about twice an example and scanned the older generations every few
    examples, time the driver spends per example on top of generating it
    (``bench/hypothesis_cost.py`` measures it). Reentrant and thread-safe like
    ``seed_only``; the last one out puts the thresholds back.
    """
    global _GC_USERS, _GC_SAVED
    with _LOCK:
        if _GC_USERS == 0:
            _GC_SAVED = gc.get_threshold()
            gc.set_threshold(max(_GC_SAVED[0], YOUNG_THRESHOLD), *_GC_SAVED[1:])
        _GC_USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _GC_USERS -= 1
            if _GC_USERS == 0:
                gc.set_threshold(*_GC_SAVED)
