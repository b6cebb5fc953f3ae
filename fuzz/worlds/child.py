"""What runs inside a world: its claims on the findings it shares with the
other worlds, its plan, and its end with the controller."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import time
from collections.abc import Callable
from pathlib import Path

from streamfuzz.fuzz import host
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.plan import Plan, WorldOf


class Claims:
    """First come, first served, across processes: one file per key, made
    with ``O_EXCL`` (atomic on every local file system)."""

    def __init__(self, shared: Path) -> None:
        self._dir = shared / "claims"
        self._dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self._dir / hashlib.blake2b(key.encode(), digest_size=8).hexdigest()

    def take(self, key: str) -> bool:
        """Whether this process is the first to claim ``key``."""
        try:
            os.close(os.open(self._path(key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def taken(self, key: str) -> bool:
        return self._path(key).exists()

    def hold(self, key: str, give_up: Callable[[], bool]) -> None:
        """Wait until no other process holds ``key``, then hold it until
        ``release``: a soak's worlds shrink and save one target's failures one
        world at a time, so that no world removes a first sight another saved.
        A holder that died (its pid is gone) holds nothing."""
        path = self._path(key)
        while True:
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if give_up() or not _alive(path):
                    path.unlink(missing_ok=True)
                    continue
                time.sleep(0.05)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return

    def release(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def pair(self, key: str) -> tuple[Callable[[], bool], Callable[[], bool]]:
        """``claim`` and ``stop`` for ``driver.fuzz``: stop once another
        process claimed ``key`` (never once this one did)."""
        won: list[bool] = []

        def claim() -> bool:
            won.append(self.take(key))
            return won[-1]

        def stop() -> bool:
            return not any(won) and self.taken(key)

        return claim, stop


def _alive(path: Path) -> bool:
    """Whether the process that wrote its pid into ``path`` still runs (a
    file too new to hold its pid yet counts as alive)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return True
    if not text:
        return True
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def end_with_parent() -> None:
    """In a world: SIGTERM once the controller dies (Linux), so that a killed
    controller leaves no world running; the world saves what it found and stops."""
    if not host.signal_at_parent_death(signal.SIGTERM):
        return
    if os.getppid() == 1:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def write_plan(plan: Plan) -> None:
    """Hand world ``plan.world_of`` its plan as data, in the folder the worlds
    share (private to this user): a world resolves, checks and decides
    nothing again, where it rebuilt all of it from a command line."""
    assert plan.world_of is not None
    _plan_path(plan.world_of).write_bytes(pickle.dumps(plan))


def plan_of(world_of: WorldOf) -> Plan:
    """This world's plan, as its controller wrote it. From here on the world
    ends with its controller (``end_with_parent``)."""
    end_with_parent()
    try:
        plan = pickle.loads(_plan_path(world_of).read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise BadInput(f"--world-of {world_of}: no plan from the controller ({exc})") from None
    if not isinstance(plan, Plan) or plan.world_of != world_of:
        raise BadInput(f"--world-of {world_of}: the plan there is another world's")
    return plan


def _plan_path(world_of: WorldOf) -> Path:
    return world_of.shared / f"world-{world_of.index}.plan"
