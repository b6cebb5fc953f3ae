"""A rank started by another launcher: ``torchrun ... -m streamfuzz.rank``.

For ``soak --ranks-external N``: each rank connects to the driver named by
``STREAMFUZZ_DRIVER`` (``docs/soak.md``). The ranks streamfuzz starts itself
run the same entry point.
"""

import sys

from streamfuzz.fuzz.rank_main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
