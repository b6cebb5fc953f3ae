"""streamfuzz: property-based fuzzing of cross-stream tensor lifetimes.

Data flows strategies -> scenario -> driver -> ranks -> target -> oracles ->
verdict -> corpus; each step is one module of this package.

Imported as ``streamfuzz.fuzz`` only (``python -m streamfuzz``): the folder is
``fuzz/`` in the repository and ``streamfuzz/fuzz/`` in the wheel. Imported
under a second name, the same file would make second classes, and messages
pickled between the driver and its ranks would stop matching.
"""

import os
import sys

if __name__ != "streamfuzz.fuzz":
    raise ImportError(f"streamfuzz's engine is imported as streamfuzz.fuzz, not {__name__}: "
                      "run `python -m streamfuzz`, import `streamfuzz.fuzz...`", name=__name__)

__version__ = "0.1.0"

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(str(sys.modules["streamfuzz"].__file__))))
"""The folder the ``streamfuzz`` package is imported from (a checkout, or
site-packages): put on a spawned rank's path, and cut from the paths a
finding names."""
