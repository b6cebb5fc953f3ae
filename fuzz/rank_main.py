"""Entry point of one rank process: ``python -m streamfuzz.fuzz.rank_main``.

It joins ``torch.distributed`` through env:// (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK: what ``torchrun`` sets, or what the driver sets when
it spawns ranks itself), connects back to the driver at STREAMFUZZ_DRIVER, and
then serves examples until told to stop. One process lives for thousands of
examples; a CUDA error makes it exit, because its context is then unusable.
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import queue
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Connection,
    answer_challenge,
    deliver_challenge,
)
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from streamfuzz.fuzz import collectives, dispatch_mode, messages, stages, targets
from streamfuzz.fuzz import env as variables
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.draft.context import TargetContext
from streamfuzz.fuzz.draft.runner import run_scenario
from streamfuzz.fuzz.draft.scenario import CHURN_DTYPES, Scenario
from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.gates import Gates, GateUnavailable
from streamfuzz.fuzz.host import EARLY_START_ENV, STORE_ENV, die_with_parent, rss_bytes
from streamfuzz.fuzz.messages import (
    Done,
    Hello,
    Memory,
    Raised,
    RankInfo,
    Run,
    Stats,
    StatsReply,
    Stop,
)
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.protocol import RankEnv
from streamfuzz.fuzz.sim import gloo_threads
from streamfuzz.fuzz.sites import display_path
from streamfuzz.fuzz.streams import CudaStreams, SimStreams


def _setup(device_kind: str) -> tuple[torch.device, Any, RankInfo]:
    # Where a cold start goes (seconds per phase), for the benchmark's report;
    # "spawn" (from the world's making to here: interpreter and imports, or the
    # fork after the zygote's imports) only where the driver started this rank.
    phases: dict[str, float] = {}
    spawned = variables.text(variables.SPAWNED_AT)
    if spawned:
        phases["spawn"] = time.time() - float(spawned)
    early = variables.text(EARLY_START_ENV)
    if early:  # an early rank: what it started beside its imports
        phases.update(json.loads(early))
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    store = variables.text(STORE_ENV)
    # A world the driver started meets through its file; ranks started by someone
    # else (torchrun) through MASTER_ADDR and MASTER_PORT.
    meet: dict[str, Any] = ({"init_method": f"file://{store}", "rank": rank,
                             "world_size": int(os.environ["WORLD_SIZE"])}
                            if store else {"init_method": "env://"})
    if device_kind == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **meet)
        group = dist.new_group(backend="nccl")
        name = torch.cuda.get_device_name(device)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", **meet)
        group = dist.new_group(backend="gloo")
        name = "cpu"
    phase("process_group")
    # Whatever the first dispatch-mode entry costs, paid before the hello, so
    # that a spare world is ready at once.
    dispatch_mode.warm(device)
    phase("dispatch_mode")

    warm = torch.zeros(1, device=device)
    dist.broadcast(warm, src=dist.get_world_size() - 1, group=group)
    if device_kind == "cuda":
        torch.cuda.synchronize(device)
    phase("first_collective")
    gates, kernels = "none", None
    if device_kind == "cuda":
        # Not beside NCCL's start: a gate held by the self-test while another
        # thread's CUDA call waits for every running kernel (a module load, a
        # synchronizing free) times out, and the rank is left with spins.
        global _GATES
        try:
            _GATES = Gates.create(device)
            gates = _GATES.kind
        except GateUnavailable as exc:
            gates = f"unavailable ({exc}); spins instead"
        phase("gates")
        try:
            _warm_kernels(device, group)
        except Exception as exc:  # a warm-up is an optimisation; say why it failed
            kernels = f"not warmed ({type(exc).__name__}: {str(exc)[:200]})"
        phase("kernels")
    # str(): torch's own version type would make the driver import torch to unpickle it.
    info = RankInfo(rank=rank, world_size=dist.get_world_size(), pid=os.getpid(),
                    node=socket.gethostname(), torch=str(torch.__version__), device_name=name,
                    backend=dist.get_backend(group), gates=gates, mem=memory(device),
                    setup_s={k: round(v, 3) for k, v in phases.items()}, kernels=kernels)
    return device, group, info


def _warm_kernels(device: torch.device, group: Any) -> None:
    """Launch once the kernels that the harness and the built-in versions use.

    Under CUDA's lazy module loading, a kernel's first launch in a process
    loads its module and waits for every running kernel, a gate included: the
    gate then holds until its bound and the interleaving it was to force is
    lost. Examples that hit a first launch anyway (a user's target) are re-run
    by the driver when a gate timed out and nothing was found.
    """
    scn = _WARM_SCENARIO
    for target in _WARM_TARGETS:
        ctx = TargetContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                            last_rank=dist.get_world_size() - 1, device=device, group=group,
                            max_num_reqs=scn.max_num_reqs, num_spec_steps=scn.num_spec_steps,
                            streams=CudaStreams(device, None))
        run_scenario(scn, targets.load(target), ctx, _WARM_OPTIONS)
    for dtype in (torch.int32, torch.int64, torch.float32, torch.uint8):
        torch.empty(4, dtype=dtype, device=device).fill_(1).clone()
    torch.cuda.synchronize(device)


_WARM_TARGETS = ("pr-fix", "main-gather", "main-gather-synced")
"""Not pre-fix: it launches pr-fix's kernels, and its own bug (idx_mapping's block
reused while the side stream gathers with it) can hand the gather garbage indices,
a device-side assert that kills the rank before it serves one example."""

_WARM_OPTIONS = RunOptions(oracles=frozenset({Oracle.VALUE, Oracle.REUSE}), hold=Hold.SPIN)
"""The kernels the reuse watch launches, without the lifetime oracle's dispatch mode."""

_WARM_SCENARIO = Scenario.from_dict({
    "world_size": 1, "max_num_reqs": 4, "num_spec_steps": 2, "pipeline_depth": 1,
    "steps": [{"idx_mapping": list(ix), "idx_dtype": dt, "final": [True, False],
               "num_sampled": [1, 0], "num_rejected": [0, 1],
               "churn": [{"stream": st, "numel": 8, "dtype": d, "fill": 1, "keep": True}
                         for st in ("main", "side") for d in CHURN_DTYPES],
               "delays": [{"point": "pre_call", "stream": "side", "cycles": 1000}]}
              for ix, dt in (((1, 0), "int64"), ((0, 1), "int32"))]})

_GATES: Gates | None = None
"""The rank's gate pool, made once (the kernel loaded and proved) before the first example."""


def memory(device: torch.device) -> Memory:
    """This process's resident set and, on CUDA, the caching allocator's bytes.

    Cheap (one small /proc read), so the driver may ask as often as it likes.
    """
    if device.type == "cuda":
        return Memory(rss_bytes(), torch.cuda.memory_allocated(device),
                      torch.cuda.memory_reserved(device))
    return Memory(rss_bytes())


# Frames that are never the user's: the harness (fuzz/*.py, the zygote's that
# forked the rank, the seam's, the simulation's and each protocol's own modules,
# not the targets' folders), torch and the standard library.
_FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
_HARNESS_DIRS = tuple(os.path.join(_FUZZ_DIR, *sub) + os.sep for sub in
                      ((), ("zygote",), ("protocol",), ("sim",), ("draft",), ("weight_sync",)))
_NOT_USER = (os.path.dirname(torch.__file__) + os.sep,
             os.path.dirname(os.__file__) + os.sep)


def _user_frames(exc: BaseException, limit: int = 8) -> str:
    """Where a target raised, in the user's code only, innermost first:
    ``path:line function: source`` lines. Empty when no frame is the user's."""
    frames = reversed(traceback.extract_tb(exc.__traceback__))
    return "\n".join(_user_lines(frames, source=True)[:limit])


def _user_lines(frames: Iterable[traceback.FrameSummary], source: bool = False) -> list[str]:
    """The user's frames among ``frames``, as ``path:line function`` (and its
    source line), paths shortened (``sites.display_path``): never absolute,
    since they go into corpus entries."""
    lines = []
    for f in frames:
        path = os.path.abspath(f.filename)
        if (os.path.dirname(path) + os.sep in _HARNESS_DIRS or path.startswith(_NOT_USER)
                or f.filename.startswith("<")):
            continue
        line = f"{display_path(path)}:{f.lineno} {f.name}"
        lines.append(f"{line}: {(f.line or '').strip()}" if source else line)
    return lines


def _dump_stacks_on_signal() -> None:
    """SIGUSR1 writes every thread's Python stack to STREAMFUZZ_STACKS, from the
    signal handler itself: a rank stuck in a C call or a sleep still answers,
    so the driver can say where a hung rank is."""
    path = variables.text(variables.STACKS)
    global _STACKS
    _STACKS = open(path, "w") if path else sys.stderr  # open as long as the rank lives
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)


_STACKS: Any = None


def _connect(address: str, authkey: bytes) -> Connection:
    """Connect to the driver. Under torchrun the ranks may start (or be
    restarted) before the driver listens, so they retry for a while; a rank the
    driver spawned does not (its driver listened before spawning it)."""
    host, _, port = address.rpartition(":")
    spawned = variables.flag(variables.PARENT)
    patience = 0.0 if spawned else variables.number(variables.CONNECT_TIMEOUT, 600.0)
    deadline = time.monotonic() + patience
    while True:
        try:
            sock = socket.create_connection((host, int(port)))
            if sock.getsockname() == sock.getpeername():
                # A connect to a free port of this host's own range can meet
                # itself (TCP simultaneous open): nobody listens there yet.
                sock.close()
                raise ConnectionRefusedError(f"{address}: nobody listens there yet")
        except (ConnectionRefusedError, FileNotFoundError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
            continue
        # A spare world's ranks wait in the handshake until the driver takes
        # that world into service, however long; they die with their driver.
        return _handshake(sock, authkey, address, None if spawned else
                          variables.number(variables.HANDSHAKE_TIMEOUT, float(HANDSHAKE_S)))


HANDSHAKE_S = 60.0
"""The most an external rank waits, once connected, for the driver's half of
the handshake. A driver answers at once; a listener that is not a streamfuzz
driver (a wrong STREAMFUZZ_DRIVER) may never answer at all."""


class HandshakeError(FuzzError, RuntimeError):
    """The listener at STREAMFUZZ_DRIVER is not a driver this rank can serve."""


def _handshake(sock: socket.socket, authkey: bytes, address: str,
               seconds: float | None) -> Connection:
    """``multiprocessing.connection.Client``'s handshake, bounded by ``seconds``.

    The bound is the socket's own receive and send timeouts (SO_RCVTIMEO,
    SO_SNDTIMEO): the connection reads and writes the raw descriptor, which
    Python's socket timeouts do not reach. Cleared once the driver answered.
    """
    if seconds is not None:
        _io_timeouts(sock, seconds)
    conn = Connection(sock.detach())
    try:
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)
    except AuthenticationError:
        conn.close()
        raise HandshakeError(f"the driver at {address} refused this rank's key: "
                             f"{variables.AUTHKEY} must be the driver's") from None
    except (BlockingIOError, TimeoutError):
        conn.close()
        raise HandshakeError(f"{address} took the connection but gave no streamfuzz "
                             f"handshake within {seconds:g}s: is {variables.DRIVER} the "
                             "address of `python -m streamfuzz soak --listen`?") from None
    except (AssertionError, EOFError, OSError) as exc:
        conn.close()
        raise HandshakeError(f"{address} is not a streamfuzz driver (the handshake "
                             f"failed: {type(exc).__name__})") from None
    if seconds is not None:
        with socket.socket(fileno=os.dup(conn.fileno())) as view:
            _io_timeouts(view, 0.0)
    return conn


def _io_timeouts(sock: socket.socket, seconds: float) -> None:
    """Kernel-level receive and send timeouts on ``sock`` (0: none)."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    for opt in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, opt, value)


def _env(device: torch.device, group: Any) -> RankEnv:
    streams = CudaStreams(device, _GATES) if device.type == "cuda" else SimStreams()
    return RankEnv(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device,
                   group=group, streams=streams)


_DRIVER_GONE = 4
"""Exit status of a rank whose driver went away without saying stop."""

LEAVE_S = 20.0
"""The most a rank told to stop may take to end. Past it the rank writes every
thread's stack where SIGUSR1's go and exits with status 1: a teardown that blocks
(a collective whose peer is gone, the process group's shutdown) must not keep a
launcher such as torchrun waiting forever."""


class _DriverLink:
    """Reads the driver's messages on a thread of its own, in order, whatever
    the main thread is doing (an example stuck in a collective, a teardown).

    A driver that closes the connection without saying stop (it declared a
    hang, or it died) ends an external rank at once: the driver cannot kill a
    rank that torchrun started, and torchrun then sees a failed worker (and
    restarts the group with --max-restarts). A stop arms the ``LEAVE_S`` bound
    before the main thread even reads it. Seeing messages in order is what
    tells a stop followed by the driver's close from a driver that left.
    """

    def __init__(self, conn: Connection, external: bool) -> None:
        self.conn, self.external = conn, external
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stopping = False
        threading.Thread(target=self._read, daemon=True, name="driver-link").start()

    def _read(self) -> None:
        try:
            self._read_all()
        except BaseException as exc:  # the main thread waits on this thread: never die quietly
            print(f"streamfuzz rank {os.environ.get('RANK', '?')}: a message from the driver "
                  f"could not be read ({type(exc).__name__}: {str(exc)[:200]}); the driver and "
                  "its ranks must run the same streamfuzz", file=sys.stderr, flush=True)
            os._exit(2)

    def _read_all(self) -> None:
        while True:
            try:
                msg = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                if self.external and not self.stopping:
                    os._exit(_DRIVER_GONE)
                self.inbox.put(None)
                return
            if isinstance(msg, Stop):
                self.stopping = True
                _end_within(LEAVE_S)
            self.inbox.put(msg)

    def next(self) -> Any:
        """The next message; None once the driver has closed the connection."""
        return self.inbox.get()


def _end_within(seconds: float) -> None:
    """faulthandler's watchdog is a C thread: it fires while the main thread
    holds the GIL in a blocking call, and during the interpreter's own exit.
    Its stacks go where SIGUSR1's go (STREAMFUZZ_STACKS, else stderr)."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=_STACKS or sys.stderr)


def _leave(conn: Connection, status: int, destroy: bool) -> NoReturn:
    """End the process within ``LEAVE_S``, without the interpreter's exit (its
    destructors, the process group's among them, can block on a peer)."""
    _end_within(LEAVE_S)
    conn.close()
    if destroy:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _Serving:
    """The rank's side of the conversation: one handler per driver message.
    A handler returns False when the rank is to leave."""

    def __init__(self, conn: Connection, device: torch.device, group: Any,
                 info: RankInfo) -> None:
        self.conn, self.device, self.group, self.rank = conn, device, group, info.rank
        self.factories: dict[str, Any] = {}

    def on_run(self, msg: Run) -> bool:
        target = msg.target.name
        env: RankEnv | None = None
        collectives.new_example()
        stages.enter(stages.RUNNER)
        try:
            if target not in self.factories:
                self.factories[target] = targets.load(target)
            protocol = protocols.get(msg.target.protocol)  # decided once, in the driver
            env = _env(self.device, self.group)
            obs = protocol.part("run")(msg.scenario, self.factories[target], env, msg.options)
            stages.restart(stages.MESSAGES)
            self.conn.send(Done(msg.eid, self.rank, obs, dict(env.calls)))
        except (targets.TargetError, protocols.ProtocolError) as exc:  # set up wrong
            if not isinstance(exc, targets.TargetError):
                exc = targets.misused(target, exc)
            self.conn.send(Raised(msg.eid, self.rank, str(exc), "", False, usage=True))
        except Exception as raised:  # the target's failure is the finding
            setup = isinstance(raised, protocols.FactoryRaised)
            err: BaseException = (raised.__cause__ or raised) if setup else raised
            text = "".join(traceback.format_exception_only(type(err), err)).strip()
            fatal = self.device.type == "cuda"
            self.conn.send(Raised(msg.eid, self.rank, text, _user_frames(err), fatal,
                                  setup=setup, calls=dict(env.calls) if env else {}))
            if fatal:
                self.conn.close()
                os._exit(3)
        return True

    def on_stats(self, msg: Stats) -> bool:
        self.conn.send(StatsReply(self.rank, memory(self.device), stages.totals()))
        return True

    def on_stop(self, msg: Stop) -> bool:
        return False


_HANDLERS: dict[type, Callable[[_Serving, Any], bool]] = {
    Run: _Serving.on_run, Stats: _Serving.on_stats, Stop: _Serving.on_stop}


def serve(device_kind: str, address: str, authkey: bytes) -> NoReturn:
    device, group, info = _setup(device_kind)
    gloo_threads.no_wakeup_preemption()
    try:
        conn = _connect(address, authkey)
    except HandshakeError as exc:
        print(f"streamfuzz rank {info.rank}: {exc}", file=sys.stderr, flush=True)
        os._exit(2)  # not the interpreter's exit: the process group's teardown can block
    conn.send(Hello(info))
    external = not variables.flag(variables.PARENT)
    link = _DriverLink(conn, external)
    serving = _Serving(conn, device, group, info)
    try:
        while True:
            stages.restart(stages.IDLE)
            msg = link.next()
            if msg is None:
                # Under torchrun a failed worker is what makes --max-restarts restart the group.
                _leave(conn, _DRIVER_GONE if external else 0, destroy=False)
            if not messages.handler(_HANDLERS, msg, "the driver")(serving, msg):
                _leave(conn, 0, destroy=True)
    except BaseException:  # a rank's own bug: say where, then end as surely as above
        traceback.print_exc()
        _leave(conn, 1, destroy=False)


def main() -> int:
    address = variables.text(variables.DRIVER)
    if not address:
        print(f"streamfuzz rank: {variables.DRIVER}=host:port is not set; start ranks through "
              "`python -m streamfuzz run` or pass it to torchrun's environment", file=sys.stderr)
        return 2
    die_with_parent()
    _dump_stacks_on_signal()
    collectives.install(variables.text(variables.STACKS) or None, _user_lines)
    stages.from_env()
    authkey = variables.authkey() or b"streamfuzz"
    return serve(variables.text(variables.DEVICE, "cpu"), address, authkey)


if __name__ == "__main__":
    sys.exit(main())
