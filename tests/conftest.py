from __future__ import annotations

import signal

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


@pytest.fixture
def rank_oracles(monkeypatch):
    """What the ranks ran, example by example: ``(target, {oracle names})`` per
    rank reply, as each rank reports the options it received."""
    from fuzz.options import DEFAULT

    seen: list[tuple[str, frozenset[str]]] = []
    sent: dict[int, str] = {}
    real_submit, real_await = RankPool.submit, RankPool._await

    def submit(self, target, scenario, options=DEFAULT):
        ticket = real_submit(self, target, scenario, options)
        sent[ticket.eid] = target
        return ticket

    def await_(self, ex, patience):  # every example's outcome passes here once
        outcome = real_await(self, ex, patience)
        if outcome is not None:
            seen.extend((sent[ex.eid], frozenset(obs.oracles)) for obs in outcome.observations)
        return outcome

    monkeypatch.setattr(RankPool, "submit", submit)
    monkeypatch.setattr(RankPool, "_await", await_)
    return seen


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this process, as at a terminal. A test
    started from a job that ignores SIGINT (a shell's background job, some CI
    runners) inherits SIG_IGN, and Python then installs no handler of its own."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
