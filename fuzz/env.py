"""Every ``STREAMFUZZ_*`` environment variable: its name, once, and its typed reader.

The environment is how a process tells what it knows to the processes it does
not call but starts (ranks, worlds, a checked program's children) or that
start it (ranks under torchrun). Each name is spelled here and nowhere else,
so a reader finds every channel in one file. ``streamfuzz/_boot/sitecustomize.py``
alone spells ``CHECK_DIR`` itself: it runs first in every process a checked
program starts and imports nothing of the engine until that variable is set.
"""

from __future__ import annotations

import os

PREFIX = "STREAMFUZZ_"
"""Every name below starts so; a zygote's key leaves them out (``streamfuzz.fuzz.zygote``)."""

# -- driver to its ranks (``streamfuzz.fuzz.ranks.world``, read by ``streamfuzz.fuzz.rank_main``)
DRIVER = "STREAMFUZZ_DRIVER"
"""``host:port`` a rank connects back to."""
AUTHKEY = "STREAMFUZZ_AUTHKEY"
"""The connection's key, hex (``soak --ranks-external`` reads the driver's from it too)."""
DEVICE = "STREAMFUZZ_DEVICE"
"""``cpu`` or ``cuda``: where the rank runs."""
PARENT = "STREAMFUZZ_PARENT"
"""The pid a spawned or forked process must not outlive; unset under torchrun."""
SPAWNED_AT = "STREAMFUZZ_SPAWNED_AT"
"""``time.time()`` when the driver spawned the rank: the rank's start is timed from it."""
STACKS = "STREAMFUZZ_STACKS"
"""The file a rank writes every thread's stack to (SIGUSR1, a hang)."""
CONNECT_TIMEOUT = "STREAMFUZZ_CONNECT_TIMEOUT"
"""Seconds an external rank keeps trying to reach its driver."""
HANDSHAKE_TIMEOUT = "STREAMFUZZ_HANDSHAKE_TIMEOUT"
"""Seconds a rank waits for the driver's handshake."""
EARLY_START = "STREAMFUZZ_EARLY_START"
"""An early CUDA rank's start (``streamfuzz.fuzz.host``)."""
STORE = "STREAMFUZZ_STORE"
"""The file a world's ranks meet through."""
ZYGOTE = "STREAMFUZZ_ZYGOTE"
"""``0``: spawn every rank, no zygote."""
EARLY_CUDA = "STREAMFUZZ_EARLY_CUDA"
"""``0``: fork CUDA ranks after the imports, not beside them."""
STAGES = "STREAMFUZZ_STAGES"
"""``1``: count the seconds per stage (``streamfuzz.fuzz.stages``)."""
GATES = "STREAMFUZZ_GATES"
"""The gate kinds to try, in order (``streamfuzz.fuzz.gates``)."""
MUTANT_HITS = "STREAMFUZZ_MUTANT_HITS"
"""The folder a mutant's first reached site is noted in."""

# -- what a run is given ---------------------------------------------------------
WORLDS = "STREAMFUZZ_WORLDS"
"""How many worlds, where ``--worlds`` is not given."""
PROTOCOLS = "STREAMFUZZ_PROTOCOLS"
"""More protocols' import specs, comma-separated (``streamfuzz.fuzz.protocol``)."""
UPSTREAM = "STREAMFUZZ_UPSTREAM"
"""Paths to look vLLM versions up in, ``os.pathsep``-separated."""
VLLM_CACHE = "STREAMFUZZ_VLLM_CACHE"
"""Where fetched vLLM wheels live."""
SOURCE = "STREAMFUZZ_SOURCE"
"""A generated harness's source under test (``streamfuzz.fuzz.scan.harness``)."""

# -- a checked program's children (``streamfuzz._subprocesses``, ``streamfuzz._record``) --
CHECK_DIR = "STREAMFUZZ_CHECK_DIR"
"""The folder children write their findings to; set, it turns the checking of children on."""
CHECK_DEVICE = "STREAMFUZZ_CHECK_DEVICE"
CHECK_ORACLES = "STREAMFUZZ_CHECK_ORACLES"
CHECK_RECORD = "STREAMFUZZ_CHECK_RECORD"


def text(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def flag(name: str) -> bool:
    """Set to anything but the empty string."""
    return bool(os.environ.get(name))


def number(name: str, default: float) -> float:
    """A number of seconds; ``default`` where unset (ValueError where not a number)."""
    value = os.environ.get(name)
    return default if value is None else float(value)


def integer(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def items(name: str, sep: str = ",") -> list[str]:
    """A list, empty parts and spaces around each left out."""
    return [s.strip() for s in os.environ.get(name, "").split(sep) if s.strip()]


def authkey() -> bytes | None:
    """``AUTHKEY`` decoded; None where unset (ValueError where not hex)."""
    key = os.environ.get(AUTHKEY, "")
    return bytes.fromhex(key) if key else None
