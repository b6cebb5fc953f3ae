"""The ``weight-sync`` protocol: a trainer broadcasts packed parameters to workers.

The trainer-to-inference weight sync of RL post-training: group rank 0 (the
trainer) writes its parameters on its current stream (the optimizer step),
then packs them into byte buffers on side streams and broadcasts them; every
other rank (an inference worker) receives the buffers and unpacks them into
its own parameters through a post-unpack callback. Modelled on vLLM's packed
NCCL weight transfer (``packed_nccl_broadcast_producer`` / ``_consumer``).

Parts: ``scenario`` (what one example is), ``runner`` (the caller's side on a
rank), ``reference`` (the values every rank must end with), the strategies in
``fuzz/weight_sync/strategies.py`` and the built-in targets in
``fuzz/weight_sync/targets.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamfuzz.fuzz.messages import Observations
from streamfuzz.fuzz.protocol import Protocol, methods_of
from streamfuzz.fuzz.weight_sync.handler import WeightSyncConsumer, WeightSyncProducer

PRODUCER, CONSUMERS = "group rank 0", "the other ranks"
"""The handler's two roles, as reports name them."""

PROTOCOL = Protocol(
    name="weight-sync",
    scenario="streamfuzz.fuzz.weight_sync.scenario:WeightSyncScenario",
    strategy="streamfuzz.fuzz.weight_sync.strategies:weight_sync_scenarios",
    run="streamfuzz.fuzz.weight_sync.runner:run_on_rank",
    values="streamfuzz.fuzz.weight_sync.reference:check",
    behaviours="streamfuzz.fuzz.weight_sync.scenario:behaviours",
    smallest="streamfuzz.fuzz.weight_sync:smallest",
    versions={"weight-sync-unordered": "streamfuzz.fuzz.weight_sync.targets:unordered",
              "weight-sync-ordered": "streamfuzz.fuzz.weight_sync.targets:ordered"},
    mutants={name: "streamfuzz.fuzz.weight_sync.targets:"
                   + name.removeprefix("weight-sync-").replace("-", "_")
             for name in ("weight-sync-consumer-no-drain", "weight-sync-consumer-caller-alloc",
                          "weight-sync-consumer-load-on-caller")},
    correct="weight-sync-ordered",
    families=("vllm-weights",),
    upstream="streamfuzz.fuzz.weight_sync.vllm:FAMILY",
    receiver_side=frozenset({"weight-sync-consumer-no-drain", "weight-sync-consumer-caller-alloc",
                             "weight-sync-consumer-load-on-caller"}),
    handler_methods={PRODUCER: methods_of(WeightSyncProducer),
                     CONSUMERS: methods_of(WeightSyncConsumer)},
    alone=PRODUCER,
    callbacks={CONSUMERS: ("load",)},
)


def smallest(world_size: int) -> Any:
    """One one-element parameter, synced once through one one-byte buffer."""
    from streamfuzz.fuzz.weight_sync.scenario import WeightSyncScenario

    return WeightSyncScenario.from_dict({
        "world_size": world_size, "params": [{"shape": [1], "dtype": "float32"}],
        "buffer_bytes": 1, "num_buffers": 1, "syncs": [{"writes": [0]}]})


@dataclass(frozen=True)
class WeightSyncObservations(Observations):
    """One rank's weight-sync outputs, read after the final synchronize: the
    producer's packed bytes per sync (every parameter, in order), and a
    consumer's parameters' bytes after each sync."""

    sent: list[tuple[int, bytes]] = field(default_factory=list)
    received: list[tuple[int, list[bytes]]] = field(default_factory=list)
