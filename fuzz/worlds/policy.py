"""How many worlds: asked for, or what the node holds; decided once, by
``how_many``, before the command line's parse and after it."""

from __future__ import annotations

from dataclasses import dataclass

from streamfuzz.fuzz import env, host

GPU_WORLDS_CAP = 16
"""Worlds on one set of GPUs at most, by default: at 16 the GPU is most of the
time busy (bench/README.md has the curve and the soak)."""


ENV_WORLDS = env.WORLDS
"""The number of worlds where ``--worlds`` is not given: a machine's or a test
suite's own default (a CI runner whose jobs share its cores), never above what
``--worlds`` itself may ask."""


CUDA_WORLD_MIB = 3500
"""GPU memory a world's rank is budgeted on its device, context and NCCL
included (16 worlds peaked at 51 GiB on one H100; bench/README.md)."""


def default_worlds(device: str, world_size: int) -> tuple[int, str]:
    """How many worlds this node holds by default, and why. On CPU a world keeps
    its driver and each of its gloo ranks busy, so a core each. On a GPU node a
    rank spends much of an example waiting for the GPU and a driver less than
    half a core (bench/README.md): a core per rank, as many as the GPUs' free
    memory holds, and at most ``GPU_WORLDS_CAP``."""
    cores = host.cores()
    if device == "cuda":
        n, why = max(1, cores // world_size), f"{cores} cores at one a rank"
        free = host.gpu_free_mib()
        if free is not None and free // CUDA_WORLD_MIB < n:
            n = max(1, int(free // CUDA_WORLD_MIB))
            why = f"{free / 1024:.0f} GiB free on a GPU at {CUDA_WORLD_MIB} MiB a world"
        if n > GPU_WORLDS_CAP:
            n, why = GPU_WORLDS_CAP, why + f", at most {GPU_WORLDS_CAP} on one set of GPUs"
        return n, why
    by_cores = max(1, cores // (world_size + 1))
    limit, why = host.cpu_world_limit()
    n = max(1, min(by_cores, limit // world_size))
    return n, f"{cores} cores at {world_size + 1} processes a world ({why})"


@dataclass(frozen=True)
class Count:
    """How many worlds, and whether the user asked (``--worlds`` or
    ``$STREAMFUZZ_WORLDS``, named by ``why``) or the node's size decided."""

    worlds: int
    why: str
    asked: bool


def how_many(asked: int | None, device: str, world_size: int) -> Count:
    """The worlds of a campaign: ``asked`` (``--worlds``), else
    ``$STREAMFUZZ_WORLDS``, else ``default_worlds``. Decided before the command
    line's parse (``at_start``), so that only a world's driver starts a zygote,
    and after it on the device found; ValueError for a bad variable."""
    if asked is not None:
        return Count(asked, f"--worlds {asked}", True)
    text = env.text(ENV_WORLDS)
    if text.strip():
        if not text.strip().isdigit() or int(text) < 1:
            raise ValueError(f"{ENV_WORLDS}={text!r}: not a number of worlds (an integer "
                             f">= 1); unset it to run as many worlds as the node holds")
        return Count(int(text), f"{ENV_WORLDS}={int(text)}", True)
    return Count(*default_worlds(device, world_size), False)


def at_start(argv: list[str]) -> int:
    """The worlds a raw command line will run, by ``how_many`` on the device and
    world size it will likely get (guessed without torch or CUDA, as the
    zygote's early ranks are): 1 in a world, and where the line cannot tell."""
    from streamfuzz.fuzz import zygote

    if (not argv or argv[0] not in ("run", "soak") or zygote.flag(argv, "--world-of", "")
            or zygote.flag(argv, "--ranks-external", "")):
        return 1
    device = zygote.flag(argv, "--device", "auto")
    if device == "auto":
        device = "cuda" if zygote.listed_gpus() else "cpu"
    try:
        asked = zygote.flag(argv, "--worlds", "")
        size = int(zygote.flag(argv, "--world-size", "0")) or (
            2 if device == "cpu" else max(1, zygote.listed_gpus()))
        return how_many(int(asked) if asked else None, device, size).worlds
    except ValueError:  # refused once parsed, before any work
        return 1
