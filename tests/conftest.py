from __future__ import annotations

import pytest

from fuzz import profiles
from fuzz.ranks import RankPool


@pytest.fixture(scope="session")
def cpu_pool():
    """Two gloo ranks on CPU, started once per test process and reused."""
    with RankPool(2, "cpu", timeout=20.0) as pool:
        yield pool


@pytest.fixture(scope="session")
def ci_settings():
    return profiles.get("ci")
