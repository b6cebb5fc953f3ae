"""A world's start survives its process-group port being taken between the
moment the driver chooses it and the moment rank 0 binds it."""

import socket

import pytest

from streamfuzz.fuzz import driver, host
from streamfuzz.fuzz.ranks import RankPool, RankStartError
from tests.test_zygote import _SCN


@pytest.fixture
def taken_port():
    """A port some other process's socket holds (a listener here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_port_taken_before_rank_0_binds_it_costs_one_more_world(monkeypatch, taken_port):
    real, chosen = host.free_port, []

    def free_port():  # the first world gets the taken port, as a race would give it
        chosen.append(taken_port if not chosen else real())
        return chosen[-1]

    monkeypatch.setattr(host, "free_port", free_port)
    with RankPool(2, "cpu", timeout=60.0) as pool:
        assert chosen[0] == taken_port and len(chosen) == 2
        assert driver.evaluate(pool, "main-gather", _SCN).ok


def test_a_port_that_stays_taken_is_one_clear_error(monkeypatch, taken_port):
    monkeypatch.setattr(host, "free_port", lambda: taken_port)
    pool = RankPool(2, "cpu", timeout=60.0)
    try:
        with pytest.raises(RankStartError, match="EADDRINUSE|address already in use"):
            pool.start()
    finally:
        pool.close()
