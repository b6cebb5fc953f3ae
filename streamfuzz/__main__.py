"""``python -m streamfuzz`` and the ``streamfuzz`` command: the command line of
``streamfuzz.fuzz.__main__``, which keeps a crash of the tool itself apart
from findings."""

import sys

from streamfuzz.fuzz.__main__ import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
