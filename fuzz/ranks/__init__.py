"""The controller side of the rank processes: start, dispatch, replace.

The driver never touches a device: it only talks to ranks over local sockets.
Ranks are started once and reused; a rank that dies or hangs costs one restart
of the whole world (a process group cannot take a new member, ``streamfuzz.fuzz.ranks.world``),
and the example that did it becomes a ``crash`` or ``hang`` finding.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import crash_text, messages, stages, zygote
from streamfuzz.fuzz.messages import (
    Done,
    Memory,
    Observations,
    Raised,
    RankInfo,
    Run,
    Stats,
    StatsReply,
    Target,
)
from streamfuzz.fuzz.options import DEFAULT, RunOptions
from streamfuzz.fuzz.ranks.world import RankStartError, World, WorldSpec
from streamfuzz.fuzz.verdict import Failure
from streamfuzz.fuzz.zygote import ForkedRank, Zygote


@dataclass
class Outcome:
    """One example on every rank: observations, or how the ranks failed."""

    observations: list[Observations] = field(default_factory=list)
    failure: Failure | None = None
    usage: str | None = None
    """A rank found the target set up wrong (``Raised.usage``): what it said."""
    setup: bool = False
    """The failure is the target's factory raising (``Raised.setup``)."""
    calls: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per rank that answered, what its runner called (``Done.calls``)."""


class RankPool:
    """``world_size`` rank processes on ``device`` ('cpu' or 'cuda').

    After the first replacement a spare world is kept starting in the
    background, so that shrinking a crash does not pay a full start per example.
    """

    def __init__(self, world_size: int, device: str, timeout: float = 60.0,
                 startup_timeout: float = 180.0, env: dict[str, str] | None = None,
                 listen: tuple[str, int] | None = None,
                 authkey: bytes | None = None) -> None:
        """With ``listen``, the ranks are external (torchrun starts them and points
        them at this address): the pool only accepts them, and a world that dies
        or hangs is not replaced but marks the pool ``lost``."""
        self.listen = listen
        self.authkey = authkey or b"streamfuzz"
        self.lost: str | None = None
        self.world_size = world_size
        self.device = device
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        self.extra_env = dict(env or {})
        self.restarts = 0
        self.recycles = 0
        self.logdir = Path(tempfile.mkdtemp(prefix="streamfuzz-ranks-"))
        self._spec = WorldSpec(world_size, device, self.extra_env, self.logdir,
                               startup_timeout, listen, self.authkey)
        self._generation = 0
        self._world: World | None = None
        self._spare: World | None = None
        self._zygote: Zygote | None = None
        self._eid = 0
        self._open: dict[int, _Example] = {}
        self._settled: dict[int, Outcome] = {}
        self._dropped: set[int] = set()
        """Examples sent whose outcomes nobody will collect (``discard``)."""

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self) -> RankPool:
        try:
            self.start()
        except BaseException:  # __exit__ will not run: remove the logs here
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _new_world(self) -> World:
        self._generation += 1
        return World(self._spec, self._generation, self._zygote_for_world)

    def _zygote_for_world(self) -> Zygote | None:
        """The zygote this pool forks ranks from (started on first use, or
        the one ``python -m streamfuzz run`` started early); None: spawn them."""
        if self.external or not zygote.enabled():
            return None
        if self._zygote is None:
            env = dict(os.environ, **self.extra_env)
            self._zygote = zygote.adopt(env) or Zygote(env, self.logdir / "zygote.log")
        if self._zygote.broken or not self._zygote.alive or not self._zygote.forks:
            return None
        return self._zygote

    def start(self) -> None:
        world = self._spare or self._new_world()
        self._spare = None
        try:
            world.accept(self.world_size, self.startup_timeout)
        except BaseException:
            world.kill()
            raise
        self._world = world

    @property
    def external(self) -> bool:
        return self.listen is not None

    def restart(self) -> None:
        """Replace broken ranks (killed, not asked): counted in ``restarts``."""
        self._replace(graceful=False)

    def recycle(self) -> None:
        """Replace healthy ranks by fresh ones (the spare, when one is ready).

        A leak in a library the ranks call (torch 2.11's NCCL broadcast keeps
        ~1 KB a call) then grows no further than one world accumulates. Counted
        in ``recycles``, apart from the ``restarts`` that crashes and hangs cost.
        """
        self._replace(graceful=True)

    def _replace(self, graceful: bool) -> None:
        if self.external:
            raise RankStartError("external ranks cannot be replaced by the driver")
        if graceful:
            self._settle_open()
        self._open.clear()
        self._dropped.clear()
        if self._world is not None:
            self._world.stop() if graceful else self._world.kill()
            self._world = None
        if graceful:
            self.recycles += 1
        else:
            self.restarts += 1
        self.start()
        self._spare = self._new_world()

    @property
    def generation(self) -> int:
        """Which world serves now: changes at every restart and recycle."""
        return self._world.generation if self._world else 0

    def close(self) -> None:
        """Stop the ranks and remove their logs (a finding quotes what it needs)."""
        self._open.clear()
        self._settled.clear()
        self._dropped.clear()
        for w in (self._world, self._spare):
            if w is not None:
                w.stop() if w.conns else w.kill()
        self._world = self._spare = None
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None
        shutil.rmtree(self.logdir, ignore_errors=True)

    @property
    def info(self) -> list[RankInfo]:
        return self._world.info if self._world else []

    def _tail(self, rank: int) -> str:
        return self._world.tail(rank) if self._world else "(no output)"

    @property
    def _conns(self) -> list[Connection]:
        return self._world.conns if self._world else []

    @property
    def _procs(self) -> list[subprocess.Popen[bytes] | ForkedRank]:
        return self._world.procs if self._world else []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- between examples ----------------------------------------------------
    def stats(self, timeout: float = 10.0) -> list[Memory | None]:
        """Each rank's memory now (``None`` for a rank that did not answer)."""
        return [r.mem if r else None for r in self._stats(timeout)]

    def stage_totals(self, timeout: float = 10.0) -> list[dict[str, float] | None]:
        """Each rank's seconds per stage so far (``streamfuzz.fuzz.stages``: empty unless the
        ranks were started with its ``ENV`` set; ``None`` for a rank that did not answer)."""
        return [r.stages if r else None for r in self._stats(timeout)]

    def _stats(self, timeout: float) -> list[StatsReply | None]:
        self._settle_open()
        out: list[StatsReply | None] = [None] * len(self._conns)
        waiting: dict[Connection, int] = {}
        for rank, c in enumerate(self._conns):
            try:
                c.send(Stats())
                waiting[c] = rank
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while waiting:
            ready = _wait(list(waiting), max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for c in ready:
                rank = waiting.pop(c)
                try:
                    reply = c.recv()
                except (EOFError, OSError):
                    continue
                if isinstance(reply, StatsReply):
                    out[rank] = reply
        return out

    # -- one example -------------------------------------------------------
    def run(self, target: Target | str, scenario: Any,
            options: RunOptions = DEFAULT) -> Outcome:
        """Run one example on every rank; replaces the ranks if they broke."""
        outcome = self.collect(self.submit(target, scenario, options))
        assert outcome is not None  # no patience: collect waits or declares
        return outcome

    def submit(self, target: Target | str, scenario: Any,
               options: RunOptions = DEFAULT) -> Ticket:
        """Send one example to every rank without waiting for it.

        Ranks take examples in order, so the driver can draw the next scenario
        while this one runs; ``collect`` gets its outcome. A ticket whose world
        was replaced before it ran is run again on the new one by ``collect``.
        """
        if self.lost is not None:
            raise RankStartError(f"the ranks are gone: {self.lost}")
        if isinstance(target, str):  # a name: resolved here, the ranks decide nothing
            from streamfuzz.fuzz.targets import resolve_target

            target = resolve_target(target)
        self._eid += 1
        eid = self._eid
        # Pickled once for every rank; the Scenario object itself travels (a
        # dict round trip through asdict and validation cost ~1 ms an example).
        stages.enter(stages.MESSAGES)
        data = pickle.dumps(Run(eid, target, scenario, options),
                            protocol=pickle.HIGHEST_PROTOCOL)
        for c in self._conns:
            try:
                c.send_bytes(data)
            except OSError:
                pass
        stages.leave()
        self._open[eid] = _Example(eid)
        return Ticket(eid, target, scenario, options)

    def collect(self, ticket: Ticket, patience: float | None = None) -> Outcome | None:
        """The outcome of a submitted example, waiting for it (and for every
        example sent before it) as long as ``timeout`` allows.

        With ``patience``, give up after that many seconds instead and return
        None, declaring nothing (a Ctrl-C asking whether a finding is already
        in); the example stays open.
        """
        if ticket.eid in self._open and not self._settle_through(ticket.eid, patience):
            return None
        if ticket.eid in self._settled:
            return self._settled.pop(ticket.eid)
        if patience is not None:
            return None
        # Its world was replaced before it ran (a restart, or an earlier
        # example that broke it): run it on this one.
        return self.run(ticket.target, ticket.scenario, ticket.options)

    def discard(self, ticket: Ticket) -> None:
        """Nobody will collect this example: its replies are still read in
        turn (ranks answer in order), and its outcome dropped. One sent to a
        world since replaced is gone already."""
        if ticket.eid in self._open:
            self._dropped.add(ticket.eid)
        self._settled.pop(ticket.eid, None)

    def _settle_open(self) -> None:
        """Wait for every example sent, keeping outcomes for ``collect``: the
        replies must be read before another question or a new world."""
        self._settle_through(self._eid)

    def _settle_through(self, last: int, patience: float | None = None) -> bool:
        """Wait, in order, for the examples sent up to ``last`` (ranks answer
        in order), keeping their outcomes for ``collect``; False when
        ``patience`` ran out first."""
        for eid in sorted(self._open):
            ex = self._open.get(eid)
            if eid > last or ex is None:  # None: a world broken by an earlier one
                break
            outcome = self._await(ex, patience)
            if outcome is None:
                return False
            self._open.pop(eid, None)
            if eid in self._dropped:
                self._dropped.discard(eid)
            else:
                self._settled[eid] = outcome
        return True

    def _await(self, ex: _Example, patience: float | None) -> Outcome | None:
        death: Failure | None = None
        deadline = time.monotonic() + (self.timeout if patience is None else patience)
        waiting = {c: r for r, c in enumerate(self._conns) if r not in ex.answered}
        while waiting:
            stages.enter(stages.WAITING)
            ready = _wait(list(waiting), max(0.0, deadline - time.monotonic()))
            stages.leave()
            if not ready and patience is not None and death is None and ex.failure is None:
                return None
            if not ready:
                if ex.failure is None and death is None:
                    ex.failure = self._hang(sorted(waiting.values()))
                ex.broken = True
                break
            for c in ready:
                rank = waiting.pop(c)
                try:
                    stages.enter(stages.MESSAGES)
                    reply = c.recv()
                except (EOFError, OSError):
                    code = None
                    if rank < len(self._procs):
                        proc = self._procs[rank]
                        try:
                            proc.wait(5)
                        except subprocess.TimeoutExpired:
                            pass
                        code = proc.poll()
                    how = (crash_text.signal_name(code) if code is not None
                           else "closed its connection")
                    # A death is the cause; a peer's collective error (often seen
                    # first) is its consequence.
                    death = death or Failure("crash", f"rank {rank} {how}: {self._tail(rank)}",
                                             rank)
                    ex.broken = True
                    deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
                    continue
                finally:
                    stages.leave()
                answered = messages.handler(_REPLIES, reply, f"rank {rank}")(ex, reply)
                if not answered:
                    waiting[c] = rank  # a late answer to an earlier question
                else:
                    ex.answered.add(rank)
                    if ex.failure is not None:
                        # Peers are likely blocked in a collective: give them a moment only.
                        deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
        failure = death or ex.failure
        # A rank that raised mid-example skipped collectives its peers made: a
        # peer may still answer, yet the next example's collectives pair with
        # the ones left over and hang for the whole --timeout. Only a world
        # made new is in step again; external ranks, which the driver cannot
        # replace, go on as they are.
        broken = ex.broken or (ex.raised and not self.external)
        if broken:
            self._open.clear()  # what was sent after it goes to a world that is gone
            self._dropped.intersection_update((ex.eid,))
            if self.external:
                self.lost = failure.message if failure else "broken"
                if self._world is not None:
                    self._world.kill()
            else:
                self.restart()
        if failure is not None:
            return Outcome(failure=failure, usage=ex.usage,
                           setup=ex.setup and failure is ex.failure, calls=ex.calls)
        return Outcome(observations=[ex.done[r] for r in range(self.world_size)],
                       calls=ex.calls)

    def _hang(self, ranks: list[int]) -> Failure:
        """The hang of the ranks that gave no answer, with where each is stuck.
        Asked only where nothing else failed: each rank's stack takes up to
        seconds to come, and a crash's peers blocked in their collective would
        cost every crashing example that wait (docs/architecture.md)."""
        where = [(r, self._world.where_stuck(r), self._world.waits_in(r))
                 for r in ranks] if self._world else []
        return Failure("hang", f"rank(s) {ranks} gave no answer within {self.timeout:.0f}s"
                       + "".join((f"\n    rank {r} {c}" if c else "")
                                 + (f"\n    rank {r} is stuck at: {w}" if w else "")
                                 for r, w, c in where), ranks[0])


PEER_GRACE_S = 0.2
"""How long the ranks still out get once one rank raised or died: one blocked
in a collective with it never answers, and its world is replaced. A rank that
died before a peer's collective error is already readable as closed. At 2 s,
every crashing step of a shrink cost 2 s more than its restart (a 30-second
shrink ran 10 of them); a peer that would have finished later is replaced
with its world, the example's verdict the same."""


def _wait(conns: Sequence[Connection], timeout: float) -> list[Connection]:
    """Those of ``conns`` with something to read, waiting up to ``timeout``."""
    return [c for c in wait(conns, timeout=timeout) if isinstance(c, Connection)]


@dataclass(frozen=True)
class Ticket:
    """An example sent to a world (``RankPool.submit``), to be collected."""

    eid: int
    target: Target
    scenario: Any
    options: RunOptions


class _Example:
    """One example's replies as they come, one handler per message. A handler
    says whether the message answers this example (else it is a late one)."""

    def __init__(self, eid: int) -> None:
        self.eid = eid
        self.done: dict[int, Observations] = {}
        self.answered: set[int] = set()
        self.failure: Failure | None = None
        self.usage: str | None = None
        self.setup = False
        self.calls: dict[int, dict[str, int]] = {}
        self.broken = False
        self.raised = False
        """A rank raised mid-example (``Raised``, neither usage nor setup)."""

    def on_done(self, msg: Done) -> bool:
        if msg.eid != self.eid:
            return False
        self.done[msg.rank] = msg.observations
        self.calls[msg.rank] = msg.calls
        return True

    def on_raised(self, msg: Raised) -> bool:
        if msg.eid != self.eid:
            return False
        if msg.usage:
            self.usage = self.usage or msg.error
        self.calls[msg.rank] = msg.calls
        self.setup = self.setup or (msg.setup and self.failure is None)
        at = "".join(f"\n    {line}" for line in msg.frames.splitlines())
        self.failure = self.failure or Failure("crash", f"rank {msg.rank} raised {msg.error}{at}",
                                               msg.rank)
        self.broken = self.broken or msg.fatal
        # A factory that raised, or a usage error, called no collective.
        self.raised = self.raised or not (msg.usage or msg.setup)
        return True

    def on_stats(self, msg: StatsReply) -> bool:
        return False


_REPLIES: dict[type, Callable[[_Example, Any], bool]] = {
    Done: _Example.on_done, Raised: _Example.on_raised, StatsReply: _Example.on_stats}

