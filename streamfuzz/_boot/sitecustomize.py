"""Run at the start of every Python process a checked program starts.

``streamfuzz check`` and ``pytest --streamfuzz`` put this folder first on
``PYTHONPATH`` and set ``STREAMFUZZ_CHECK_DIR``: the process then runs as one
checked region and writes its findings there at its exit
(``streamfuzz._subprocesses``). A ``sitecustomize`` this one hides is run after it.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _start() -> None:
    # Spelled here, not imported from ``streamfuzz.fuzz.env``: this runs first in
    # every process, and an unchecked one must import nothing of streamfuzz.
    if not os.environ.get("STREAMFUZZ_CHECK_DIR"):
        return
    try:
        from streamfuzz._subprocesses import check_this_process

        check_this_process()
    except Exception as exc:  # the program runs on, unchecked, and says so
        print(f"streamfuzz: process {os.getpid()} runs unchecked: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_start()
_chain()
