"""The commands behind ``python -m streamfuzz``: one module each (``run``, ``soak``,
``replay``, ``bench``, ``mutate``), over the grammar and the checks they share.
``streamfuzz.fuzz.cli`` parses and dispatches."""

from __future__ import annotations

import sys

from streamfuzz.fuzz.errors import BadInput


class UsageError(BadInput):
    """Bad usage or configuration: one line, exit status 2."""

def say_error(exc: BaseException) -> None:
    """Bad usage or configuration, as the one line on stderr that says it."""
    print(f"streamfuzz: error: {exc}", file=sys.stderr, flush=True)
