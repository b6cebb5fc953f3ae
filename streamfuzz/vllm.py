"""vLLM's own code as a target, from its wheel: ``python -m streamfuzz.vllm fetch VERSION...``
downloads each version's wheel (``pip download vllm==VERSION --no-deps``) into the
cache that ``--target vllm-pp@VERSION`` reads, and prints what it found (``docs/vllm.md``).
"""

import sys

from streamfuzz.fuzz.upstream import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
