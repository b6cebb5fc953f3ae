"""Entry point of one rank process: ``python -m fuzz.rank_main``.

It joins ``torch.distributed`` through env:// (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK: what ``torchrun`` sets, or what the driver sets when
it spawns ranks itself), connects back to the driver at STREAMFUZZ_DRIVER, and
then serves examples until told to stop. One process lives for thousands of
examples; a CUDA error makes it exit, because its context is then unusable.
"""

from __future__ import annotations

import os
import sys
import traceback
from multiprocessing.connection import Client
from typing import Any

import torch
import torch.distributed as dist

from fuzz import targets
from fuzz.gates import Gates, GateUnavailable
from fuzz.runner import run_scenario
from fuzz.scenario import Scenario
from fuzz.streams import CudaStreams, SimStreams
from fuzz.targets import TargetContext


def _setup(device_kind: str) -> tuple[torch.device, Any, dict[str, Any]]:
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device_kind == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method="env://", device_id=device)
        group = dist.new_group(backend="nccl")
        name = torch.cuda.get_device_name(device)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method="env://")
        group = dist.new_group(backend="gloo")
        name = "cpu"
    warm = torch.zeros(1, device=device)
    dist.broadcast(warm, src=dist.get_world_size() - 1, group=group)
    if device_kind == "cuda":
        torch.cuda.synchronize(device)
    info = {"rank": rank, "pid": os.getpid(), "torch": torch.__version__, "device_name": name,
            "backend": dist.get_backend(group), "gates": "none"}
    if device_kind == "cuda":
        global _GATES
        try:
            _GATES = Gates.create(device)
            info["gates"] = _GATES.kind
        except GateUnavailable as exc:
            info["gates"] = f"unavailable ({exc}); spins instead"
    return device, group, info


_GATES: Gates | None = None
"""The rank's gate pool, made once (compiling the kernel) before the first example."""


def _context(device: torch.device, group: Any, scenario: Scenario) -> TargetContext:
    streams = CudaStreams(device, _GATES) if device.type == "cuda" else SimStreams()
    world = dist.get_world_size()
    return TargetContext(rank=dist.get_rank(), world_size=world, last_rank=world - 1,
                         device=device, group=group, max_num_reqs=scenario.max_num_reqs,
                         num_spec_steps=scenario.num_spec_steps, streams=streams)


def serve(device_kind: str, address: str, authkey: bytes) -> int:
    device, group, info = _setup(device_kind)
    host, _, port = address.rpartition(":")
    conn = Client((host, int(port)), authkey=authkey)
    conn.send(("hello", info))
    factories: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return 0
        if msg[0] == "stop":
            break
        _, eid, target, scenario, options = msg
        try:
            if not isinstance(scenario, Scenario):  # plain values from another client
                scenario = Scenario.from_dict(scenario)
            if target not in factories:
                factories[target] = targets.load(target)
            ctx = _context(device, group, scenario)
            obs = run_scenario(scenario, factories[target], ctx, options)
            conn.send(("ok", eid, info["rank"], obs))
        except Exception as exc:  # the target's failure is the finding
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            fatal = device.type == "cuda"
            conn.send(("error", eid, info["rank"], text, traceback.format_exc(), fatal))
            if fatal:
                conn.close()
                os._exit(3)
    conn.close()
    dist.destroy_process_group()
    return 0


def main() -> int:
    address = os.environ.get("STREAMFUZZ_DRIVER")
    if not address:
        print("streamfuzz rank: STREAMFUZZ_DRIVER=host:port is not set; start ranks through "
              "`python -m fuzz run` or pass it to torchrun's environment", file=sys.stderr)
        return 2
    authkey = bytes.fromhex(os.environ.get("STREAMFUZZ_AUTHKEY", "")) or b"streamfuzz"
    return serve(os.environ.get("STREAMFUZZ_DEVICE", "cpu"), address, authkey)


if __name__ == "__main__":
    sys.exit(main())
