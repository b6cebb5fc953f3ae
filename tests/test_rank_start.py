"""A world's ranks meet through a file the driver made for that start of the
world, so no port chosen by the driver can be taken before rank 0 binds it,
whatever else (another world, any connection) holds ports meanwhile."""

import socket
import threading

import pytest

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.ranks import RankPool
from tests.test_zygote import _SCN


def test_ranks_meet_through_a_fresh_file_of_their_world():
    with RankPool(2, "cpu", timeout=60.0) as pool:
        assert sorted(p.name for p in pool.logdir.glob("store.*")) == ["store.1"]
        assert driver.evaluate(pool, "main-gather", _SCN).ok
        pool.restart()  # a new start of the world meets through a new file
        assert "store.2" in {p.name for p in pool.logdir.glob("store.*")}
        assert driver.evaluate(pool, "main-gather", _SCN).ok


@pytest.fixture
def many_ports_held():
    """Listeners on many ports at once, as a busy node has them."""
    socks = []
    for _ in range(64):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        socks.append(s)
    yield
    for s in socks:
        s.close()


def test_worlds_started_side_by_side_all_start(many_ports_held):
    errors: list[BaseException] = []

    def world() -> None:
        try:
            with RankPool(2, "cpu", timeout=90.0) as pool:
                assert driver.evaluate(pool, "main-gather", _SCN).ok
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=world) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
