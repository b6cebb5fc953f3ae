from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess

import pytest

from streamfuzz.fuzz import profiles
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.worlds import ENV_WORLDS

# One world for every command a test starts, unless it asks for more with --worlds:
# what a test prints and how long it runs must not depend on the cores of the
# machine (16 on a GPU node, where pytest-xdist already runs 8 tests at once).
os.environ[ENV_WORLDS] = "1"

# The fast tier (``make test-fast``): modules whose tests start no process, neither
# ranks nor ``python -m streamfuzz`` nor pytest; in them, a test that asks for ``cpu_pool``
# is left out. The guard below holds the tier to it, so a test that starts one fails.
FAST_MODULES = frozenset({
    "test_cuda_on_cpu",
    "test_errors",
    "test_gates",
    "test_gloo_threads",
    "test_host_party",
    "test_lifetime_cuda",
    "test_lifetime_model",
    "test_messages",
    "test_pending_polls",
    "test_plan",
    "test_precision",
    "test_rank_output",
    "test_readme",
    "test_reuse_shared_mode",
    "test_runner",
    "test_scenario",
    "test_sim_collectives",
    "test_sim_fidelity",
    "test_spans",
    "test_stages",
    "test_strategies",
    "test_threads",
    "test_value_oracle",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in FAST_MODULES \
                and "cpu_pool" not in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fast)


class _StartedAProcess(AssertionError):
    pass


def _refuse(*_args, **_kwargs):
    raise _StartedAProcess("a test of the fast tier started a process: move it out of "
                           "FAST_MODULES (tests/conftest.py)")


@pytest.fixture(autouse=True)
def _fast_starts_no_process(request, monkeypatch):
    """A fast test that starts a process fails, in every tier, so the fast tier
    cannot grow slow unseen."""
    if request.node.get_closest_marker("fast") is not None:
        monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse)
        monkeypatch.setattr(os, "fork", _refuse)
        monkeypatch.setattr(os, "posix_spawn", _refuse)
        monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse)
    yield


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
    from streamfuzz.fuzz.options import DEFAULT

    seen: list[tuple[str, frozenset[str]]] = []
    sent: dict[int, str] = {}
    real_submit, real_await = RankPool.submit, RankPool._await

    def submit(self, target, scenario, options=DEFAULT):
        ticket = real_submit(self, target, scenario, options)
        sent[ticket.eid] = ticket.target.name
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
