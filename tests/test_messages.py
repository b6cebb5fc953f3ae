"""The typed messages between driver and ranks: they cross a real connection
unchanged, and a message a side does not know is one clear error."""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from multiprocessing.connection import Client

import pytest

from streamfuzz.fuzz import messages
from streamfuzz.fuzz.draft import DraftObservations
from streamfuzz.fuzz.draft.reference import expected_applied
from streamfuzz.fuzz.draft.scenario import Scenario, Step
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
    Target,
    UnknownMessageError,
)
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.ranks import RankPool, RankStartError
from streamfuzz.fuzz.verdict import Failure
from streamfuzz.fuzz.weight_sync import WeightSyncObservations

_SCN = Scenario(world_size=2, max_num_reqs=2, num_spec_steps=2, steps=(
    Step(idx_mapping=(1, 0), final=(True, False), num_sampled=(1, 0), num_rejected=(0, 1)),))
_INFO = RankInfo(rank=1, world_size=2, pid=123, node="n", torch="2.x", device_name="cpu",
                 backend="gloo", gates="none", mem=Memory(rss=1 << 20),
                 setup_s={"process_group": 0.5}, kernels=None)
_FINDING = Failure("lifetime", "idx_mapping was freed while stream side may still use it", 1, 0)

_ALL = [
    Run(7, Target("pre-fix", "draft-broadcast",
                  spec="streamfuzz.fuzz.draft.targets.pp_draft:pre_fix"), _SCN,
        RunOptions(oracles={Oracle.VALUE, Oracle.LIFETIME}, hold=Hold.GATE)),
    Stats(), Stop(), Hello(_INFO),
    StatsReply(1, Memory(rss=5, gpu_alloc=6, gpu_reserved=7)),
    Done(7, 0, DraftObservations(rank=0, held=("spin",), oracles=("lifetime", "value"),
                                 findings=(_FINDING,), applied=expected_applied(_SCN),
                                 applies_non_final=False)),
    Done(7, 1, DraftObservations(rank=1, held=(), oracles=("value",), findings=(),
                                 sent=[(0, [[200016, 200017], [200000, 200001]])])),
    Done(8, 0, WeightSyncObservations(rank=0, held=("gate",), oracles=("value",), findings=(),
                                      sent=[(0, b"\x00\x01"), (1, b"\x02\x03")])),
    Raised(7, 1, "RuntimeError: boom", "user.py:3 f: raise RuntimeError('boom')", False),
    Done(9, 1, WeightSyncObservations(rank=1, held=(), oracles=(), findings=()),
         calls={"receive": 2, "load": 5}),
    Raised(9, 0, "ValueError: no", "", False, setup=True, calls={"broadcast_drafts": 1}),
]


@pytest.mark.parametrize("msg", _ALL, ids=lambda m: type(m).__name__)
def test_every_message_crosses_a_connection_unchanged(msg):
    a, b = Pipe()
    a.send(msg)
    got = b.recv()
    assert type(got) is type(msg) and got == msg
    if isinstance(got, Done):
        assert all(isinstance(f, Failure) for f in got.observations.findings)


def test_memory_keeps_only_the_fields_that_apply_in_soak_samples():
    assert Memory(rss=5).to_dict() == {"rss": 5}
    assert Memory(5, 6, 7).to_dict() == {"rss": 5, "gpu_alloc": 6, "gpu_reserved": 7}


def test_an_unknown_message_names_sender_type_and_what_was_expected():
    handlers = {Run: "run", Stats: "stats", Stop: "stop"}
    assert messages.handler(handlers, Stats(), "the driver") == "stats"
    with pytest.raises(UnknownMessageError) as err:
        messages.handler(handlers, ("run", 1, "pre-fix"), "the driver")
    text = str(err.value)
    assert text.startswith("the driver sent a builtins.tuple (('run', 1, 'pre-fix'))")
    assert "none of the messages expected here (Run, Stats, Stop)" in text
    # A message of the other direction is as unknown as a tuple.
    with pytest.raises(UnknownMessageError, match="sent a streamfuzz.fuzz.messages.Hello"):
        messages.handler(handlers, Hello(_INFO), "the driver")


def test_a_joining_rank_that_does_not_say_hello_is_refused_with_the_reason():
    pool = RankPool(1, "cpu", startup_timeout=30.0, listen=("127.0.0.1", 0), authkey=b"k")
    # Listen on a free port chosen by the pool's own listener, then join it.
    world = pool._new_world()
    address = world.listener.address

    def join() -> None:
        with Client(address, authkey=b"k") as conn:
            conn.send(("hello", {"rank": 0}))  # what ranks sent before messages were typed

    joiner = threading.Thread(target=join)
    joiner.start()
    try:
        with pytest.raises(RankStartError, match=r"a joining rank sent a builtins.tuple .*"
                                                 r"\(Hello\)"):
            world.accept(1, 30.0)
    finally:
        world.kill()
        joiner.join(10)
        pool.close()


def test_a_rank_told_something_it_does_not_know_exits_saying_what(cpu_pool):
    cpu_pool._conns[0].send(("run", 1, "pre-fix", _SCN.to_dict(), {}))
    outcome = cpu_pool.run("main-gather", _SCN)
    assert outcome.failure is not None and outcome.failure.kind == "crash"
    assert "UnknownMessageError" in outcome.failure.message
    assert "the driver sent a builtins.tuple" in outcome.failure.message
    # The pool replaced the world: the next example runs.
    assert cpu_pool.run("main-gather", _SCN).failure is None
