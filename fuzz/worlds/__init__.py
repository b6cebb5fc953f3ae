"""Parallel worlds: one campaign run by N independent worlds side by side.

A world is a driver and its ranks, what one ``fuzz run`` or ``fuzz soak``
has. N worlds are N child processes of the same command, each handed its
plan as data (``child.write_plan``: nothing resolved, checked or decided
again) with its own seed, sharing the example database and the corpus, as
libFuzzer's ``-jobs`` and HypoFuzz's workers do. Worlds of one GPU take turns
on it, so they scale as far as each world leaves it idle: a gate holds its
stream in the GPU's front end and runs nothing (``streamfuzz.fuzz._gate_wait``).

Each target's finding is claimed once (``Claims``): the world that claims it
shrinks and saves it, the others stop that target and go on to the next, so
one bug found by every world at its first example is shrunk and saved once.
The controller prefixes each world's lines with ``[wN]``, forwards Ctrl-C and
SIGTERM to every world (each saves what it found and writes its report), and
merges the reports (``streamfuzz.fuzz.worlds_report``).

One file per role: ``policy`` (how many worlds), ``controller`` (starting
and watching them) and ``child`` (what runs inside one).
"""

from streamfuzz.fuzz.plan import WorldOf
from streamfuzz.fuzz.worlds.child import Claims, end_with_parent, plan_of, write_plan
from streamfuzz.fuzz.worlds.controller import Controller, World, run_worlds, soak_worlds
from streamfuzz.fuzz.worlds.policy import (
    CUDA_WORLD_MIB,
    ENV_WORLDS,
    GPU_WORLDS_CAP,
    Count,
    at_start,
    default_worlds,
    how_many,
)

__all__ = ["CUDA_WORLD_MIB", "ENV_WORLDS", "GPU_WORLDS_CAP", "Claims", "Controller", "Count",
           "World", "WorldOf", "at_start", "default_worlds", "end_with_parent", "how_many",
           "plan_of", "run_worlds", "soak_worlds", "write_plan"]
