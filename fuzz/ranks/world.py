"""One world: a set of rank processes sharing a process group and a listener.

A world is started whole (forked from the zygote, else spawned), accepted
whole, and stopped or killed whole: a process group cannot take a new member.
It also says where a rank that gave no answer is stuck, and how one that died
ended. ``streamfuzz.fuzz.ranks`` keeps worlds and replaces them.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path

from streamfuzz.fuzz import ROOT, collectives, crash_text, host, messages
from streamfuzz.fuzz import env as variables
from streamfuzz.fuzz.errors import BadInput
from streamfuzz.fuzz.messages import Hello, RankInfo, Stop
from streamfuzz.fuzz.zygote import ForkedRank, Zygote, ZygoteError


class RankStartError(BadInput, RuntimeError):
    """The ranks could not be brought up (bad device, NCCL/gloo init failure)."""


@dataclass(frozen=True)
class WorldSpec:
    """What every world of a pool is started from.

    With ``listen``, the ranks are external (torchrun starts them and points
    them at this address): a world only accepts them, with ``authkey``.
    """

    world_size: int
    device: str
    env: dict[str, str]
    """Set in the ranks' environment beside the driver's own."""
    logdir: Path
    startup_timeout: float
    listen: tuple[str, int] | None = None
    authkey: bytes = b"streamfuzz"


class World:
    """One set of rank processes sharing a process group and a listener."""

    def __init__(self, spec: WorldSpec, generation: int,
                 forker: Callable[[], Zygote | None]) -> None:
        """``forker``: the zygote to fork the ranks from, asked once the logs
        exist; None, or a zygote that cannot fork, spawns them."""
        self.generation = generation
        self.procs: list[subprocess.Popen[bytes] | ForkedRank] = []
        self.conns: list[Connection] = []
        self.info: list[RankInfo] = []
        self.logs: list[Path] = []
        self.stacks: list[Path] = []
        if spec.listen is not None:
            # Ranks started by someone else (torchrun): listen where they were told.
            self.authkey = spec.authkey
            self.listener = _Listener(spec.listen, self.authkey)
            return
        self.authkey = secrets.token_bytes(16)
        self.listener = _Listener(("127.0.0.1", 0), self.authkey)
        envs = self._envs(spec, generation)
        zygote = forker()
        if zygote is not None:
            try:
                for env, log in zip(envs, self.logs):
                    self.procs.append(zygote.fork(
                        {**env, variables.PARENT: str(zygote.proc.pid)}, log,
                        spec.startup_timeout))
                return
            except BaseException as exc:
                for p in self.procs:  # spawn the whole world instead (or give up)
                    p.kill()
                    p.wait()
                self.procs = []
                if not isinstance(exc, ZygoteError):
                    self.listener.close()
                    raise
        for env, log in zip(envs, self.logs):
            with open(log, "wb") as fh:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "streamfuzz.fuzz.rank_main"], env=env, stdout=fh,
                    stderr=subprocess.STDOUT, start_new_session=True))

    def _envs(self, spec: WorldSpec, generation: int) -> list[dict[str, str]]:
        """Each rank's environment; its log and stacks files made empty."""
        base = dict(os.environ)
        base.update(spec.env)
        address, port = self.listener.address
        # The ranks meet through a file, not a port picked here and released:
        # another world (or any process) could bind that port before rank 0 does.
        store = spec.logdir / f"store.{generation}"
        store.unlink(missing_ok=True)
        base.update({
            host.STORE_ENV: str(store),
            "WORLD_SIZE": str(spec.world_size), variables.DEVICE: spec.device,
            variables.DRIVER: f"{address}:{port}",
            variables.AUTHKEY: self.authkey.hex(), "PYTHONUNBUFFERED": "1",
            variables.PARENT: str(os.getpid()),
            variables.SPAWNED_AT: repr(time.time()),
        })
        base["PYTHONPATH"] = os.pathsep.join(
            p for p in (ROOT, base.get("PYTHONPATH")) if p)
        if spec.device == "cpu":
            base.setdefault("GLOO_SOCKET_IFNAME", "lo")
        spec.logdir.mkdir(parents=True, exist_ok=True)  # a closed pool started again
        envs = []
        for rank in range(spec.world_size):
            log = spec.logdir / f"rank{rank}.{generation}.log"
            stacks = log.with_suffix(".stacks")
            envs.append(dict(base, RANK=str(rank), LOCAL_RANK=str(rank),
                             **{variables.STACKS: str(stacks)}))
            self.logs.append(log)
            self.stacks.append(stacks)
            log.write_bytes(b"")
        return envs

    def accept(self, world_size: int, timeout: float) -> None:
        """Take every rank's connection and hello; RankStartError where a rank
        ended, the ranks took longer than ``timeout``, or one joined a world of
        another size. The listener is closed either way."""
        deadline = time.monotonic() + timeout
        conns: dict[int, tuple[Connection, RankInfo]] = {}
        try:
            while len(conns) < world_size:
                for rank, p in enumerate(self.procs):
                    code = p.poll()
                    if code is not None:
                        how = crash_text.signal_name(code)
                        raise RankStartError(f"rank {rank} {how} while starting: {self.tail(rank)}")
                if time.monotonic() > deadline:
                    raise RankStartError(f"ranks did not start within {timeout:.0f}s: "
                                         f"{self.tail(0)}")
                try:
                    conn = self.listener.accept(0.5)
                except TimeoutError:
                    continue
                msg = conn.recv()
                try:
                    info = messages.handler(_JOIN, msg, "a joining rank")(msg)
                except messages.UnknownMessageError as exc:
                    raise RankStartError(str(exc)) from None
                if info.world_size != world_size:
                    raise RankStartError(f"a rank joined a world of {info.world_size} "
                                         f"ranks; this driver expects {world_size}")
                conns[info.rank] = (conn, info)
        finally:
            self.listener.close()
        self.conns = [conns[r][0] for r in range(world_size)]
        self.info = [conns[r][1] for r in range(world_size)]

    def stop(self) -> None:
        for c in self.conns:
            try:
                c.send(Stop())
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
                p.wait()
        for c in self.conns:
            c.close()
        self.listener.close()

    def where_stuck(self, rank: int, wait_s: float = 5.0) -> str:
        """Where a rank that gave no answer is: its main thread's Python stack,
        dumped by faulthandler on SIGUSR1 (``""`` for a rank we cannot signal)."""
        if rank >= len(self.stacks) or self.procs[rank].poll() is not None:
            return ""
        path = self.stacks[rank]
        before = path.stat().st_size if path.exists() else 0
        try:
            os.kill(self.procs[rank].pid, signal.SIGUSR1)
        except OSError:
            return ""
        # The dump is written from the signal handler: wait for it to appear
        # and stop growing (bounded, in case the process cannot run at all).
        deadline, size = time.monotonic() + wait_s, -1
        while time.monotonic() < deadline:
            now = path.stat().st_size if path.exists() else 0
            if now > before and now == size:
                break
            size = now
            time.sleep(0.05)
        with open(path, errors="replace") as fh:
            fh.seek(before)
            return crash_text.main_stack(fh.read())

    def waits_in(self, rank: int) -> str:
        """The collective a stuck rank waits in and the user's frames that called
        it (``streamfuzz.fuzz.collectives``); ``""`` where it noted none."""
        return collectives.waits_in(self.stacks[rank]) if rank < len(self.stacks) else ""

    def tail(self, rank: int, limit: int = 600) -> str:
        try:
            text = self.logs[rank].read_text(errors="replace")
        except (OSError, IndexError):
            return "(no output)"
        return crash_text.cause(text, limit)


class _Listener:
    """Where a world's ranks connect: the socket and handshake of
    ``multiprocessing.connection.Listener``, with an accept that gives up
    after a while (the stdlib's waits for ever)."""

    def __init__(self, address: tuple[str, int], authkey: bytes) -> None:
        self.authkey = authkey
        self.sock = socket.socket(socket.AF_INET)
        try:
            if os.name == "posix":
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(address)
            self.sock.listen(1)
        except OSError:
            self.sock.close()
            raise
        self.address: tuple[str, int] = self.sock.getsockname()

    def accept(self, timeout: float) -> Connection:
        """The next rank's connection, once it proved the key and took ours;
        TimeoutError where none came within ``timeout``."""
        self.sock.settimeout(timeout)
        sock, _ = self.sock.accept()
        conn = Connection(sock.detach())
        deliver_challenge(conn, self.authkey)
        answer_challenge(conn, self.authkey)
        return conn

    def close(self) -> None:
        self.sock.close()


def _hello(msg: Hello) -> RankInfo:
    return msg.info


_JOIN: dict[type, Callable[[Hello], RankInfo]] = {Hello: _hello}
