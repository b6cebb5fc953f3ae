"""The lifetime oracle's findings as the user reads them.

Each message names the storage, the streams and the ops, says why the use is
unsafe and how to order it, then gives each site's frames, innermost first,
with the innermost line's text.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.frames import Frames
from streamfuzz.fuzz.oracles.access import Access, StorageInfo
from streamfuzz.fuzz.sites import display_path, source_line
from streamfuzz.fuzz.verdict import Failure

MAX_FINDINGS = 8
"""The most findings one example reports; the last one says how many more there were."""


def what(info: StorageInfo) -> str:
    """The storage as a report names it: the user's name for it, else its type and maker."""
    shape = "[" + ", ".join(map(str, info.shape)) + "]"
    kind = f"{info.dtype}{shape}"
    if info.name:
        return f"{info.name} ({kind})"
    return f"a tensor {kind} made by {info.alloc_op}"


def freed_in_use(name_of: Callable[[Any], str], info: StorageInfo, use: Access,
                 free_frames: Frames, backend: bool) -> str:
    """The lifetime rule broken: ``info`` freed while ``use`` may not be done.
    ``backend``: the use ran on a collective backend's own stream."""
    alloc = name_of(info.stream)
    user = name_of(use.stream)
    verb = "writes" if use.write else "reads"
    # A backend's stream is not the program's to record: the stream that
    # waited for the collective's handle is.
    cover = (f"record_stream of a stream that waited for {user}'s work"
             if backend else f"record_stream({user})")
    return (f"{what(info)} was freed while stream {user} may still use it: "
            f"{user} {verb} it ({_at(use)}) and that use is neither ordered "
            f"before {alloc}'s current point nor covered by {cover}; "
            f"the block can be handed to the next allocation on {alloc} "
            f"(allocated on {alloc} by {info.alloc_op})"
            f"\n    freed (seen at):  {fmt(free_frames)}"
            f"\n    used on {user}:   {fmt(use.frames)}"
            f"\n    allocated:        {fmt(info.alloc_frames)}")


def race(name_of: Callable[[Any], str], info: StorageInfo, prev: Access, now: Access,
         freed: tuple[StorageInfo, Frames] | None) -> str:
    """The race rule broken: ``now`` unordered with ``prev`` on another stream.
    ``freed``: what ``prev``'s stream last freed, where ``prev`` is an allocation."""
    a, b = name_of(prev.stream), name_of(now.stream)
    verb = "writes" if now.write else "reads"
    if prev.alloc:
        was = (f" (the last it freed: {what(freed[0])}, at {fmt(freed[1])})"
               if freed is not None else "")
        return (f"{'write' if now.write else 'read'}-after-allocation race on "
                f"{what(info)}: {b} {verb} it ({_at(now)}) unordered with its "
                f"allocation on {a} ({_at(prev)}): the allocator may have handed it a "
                f"block {a} freed{was} while work queued on {a} before the allocation may "
                f"still use it; make {b} wait for {a} (wait_stream or an event) first"
                f"\n    {a}: {fmt(prev.frames)}"
                f"\n    {b}: {fmt(now.frames)}")
    kind = ("write-after-write" if prev.write and now.write else
            "read-after-write" if prev.write else "write-after-read")
    return (f"{kind} race on {what(info)}{_where(info, prev, now)}: {b} {verb} "
            f"it ({_at(now)}) unordered with {a}'s "
            f"{'write' if prev.write else 'read'} ({_at(prev)})"
            f"\n    {a}: {fmt(prev.frames)}"
            f"\n    {b}: {fmt(now.frames)}")


def _where(info: StorageInfo, prev: Access, now: Access) -> str:
    """Which bytes the two accesses share, where neither is the whole storage."""
    a, b = prev.span, now.span
    if a is None or b is None:  # either is WHOLE (None)
        return ""
    shared = [(max(lo, lo2), min(hi, hi2)) for lo, hi in a for lo2, hi2 in b
              if max(lo, lo2) < min(hi, hi2)]
    if not shared:
        return ""
    lo, hi = shared[0]
    more = f", and {len(shared) - 1} more range(s)" if len(shared) > 1 else ""
    return f", bytes {lo}..{hi} of its {info.nbytes}{more}" if info.nbytes else ""


def _at(use: Access) -> str:
    """Which op, and in which step where the caller counts steps (a checked block does not)."""
    return use.op if use.step is None else f"{use.op}, step {use.step}"


def _short(path: str) -> str:
    return display_path(str(Path(path).resolve()))


def internal_error(oracle: str, exc: BaseException, rank: int | None,
                   step: int | None) -> Failure:
    """A rank-side oracle's own bug as one finding that says whose it is and
    where: read as the target's crash, it would send the user after the wrong code."""
    what = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    at = f" at {_short(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return Failure("crash", f"{oracle} oracle internal error (a bug in streamfuzz, not in the "
                            f"code under test): {what}{at}", rank, step)


def fmt(frames: Frames) -> str:
    """A site: its frames, innermost first, then the innermost line's text."""
    if not frames:
        return "(no Python frame)"
    chain = " <- ".join(f"{_short(p)}:{line} {fn}" for p, line, fn in frames)
    text = source_line(*frames[0][:2])
    return f"{chain}\n        > {text}" if text else chain
