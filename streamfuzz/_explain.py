"""Keep streamfuzz's own lines out of Hypothesis's explanation of a failure.

Hypothesis lists the lines "always and only run by failing test cases"; in a
checked test, the checker's lines that build the finding are among them, and
they point the reader at streamfuzz instead of their own code. Hypothesis
offers no setting for it: its file filter is wrapped, where it exists.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path


def _folders() -> tuple[str, ...]:
    """This package's folder and those of ``streamfuzz.fuzz`` and
    ``streamfuzz.strategies``, wherever they were found (inside it when
    installed, beside it in a checkout)."""
    found = [Path(__file__).resolve().parent]
    for name in ("streamfuzz.fuzz", "streamfuzz.strategies"):
        spec = importlib.util.find_spec(name)
        found += [Path(d).resolve() for d in (spec and spec.submodule_search_locations or ())]
    return tuple(str(p) + "/" for p in found)


_OURS = _folders()


def hide_own_lines() -> None:
    try:
        from hypothesis.internal import scrutineer
    except ImportError:
        return
    original = getattr(scrutineer, "should_trace_file", None)
    if original is None or getattr(original, "streamfuzz_hides", False):
        return

    @functools.cache
    def should_trace_file(fname: str) -> bool:
        return not fname.startswith(_OURS) and original(fname)

    should_trace_file.streamfuzz_hides = True  # type: ignore[attr-defined]
    scrutineer.should_trace_file = should_trace_file
