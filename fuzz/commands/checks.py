"""What the commands check before any work: the device, the world, the
folders they write, the run options."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from streamfuzz.fuzz.commands import UsageError
from streamfuzz.fuzz.host import cpu_world_limit, probe_gpus
from streamfuzz.fuzz.options import (
    RunOptions,
)


def run_options(args: argparse.Namespace, device: str | None = None) -> RunOptions:
    """The options of a run that judges on ``device``: refused (bad input) where
    no oracle can see anything there, a note on stderr for each that cannot."""
    options = RunOptions(oracles=args.oracle, hold=args.hold)
    if device is not None:
        judging(options, device)
    return options


def judging(options: RunOptions, device: str) -> None:
    for note in options.judging(device):
        print(f"streamfuzz: {note}", file=sys.stderr)


def pick_device(requested: str) -> tuple[str, int]:
    gpus = probe_gpus() if requested in ("cuda", "auto") else 0
    if requested == "cuda" and gpus == 0:
        raise UsageError("--device cuda: no CUDA GPU is visible here")
    return ("cuda" if gpus else "cpu"), gpus


def pick_world_size(device: str, gpus: int, requested: int | None) -> int:
    if device == "cpu":
        size = requested or 2
        check_cpu_world(size, f"--world-size {size}")
        return size
    size = requested or gpus
    if size > gpus:
        raise UsageError(f"--world-size {size} needs {size} GPUs (one per rank; NCCL refuses "
                         f"two ranks on one GPU) but {gpus} visible")
    return size


def pick_worlds(worlds: int | None, mps: str, device: str, world: int) -> int:
    """How many worlds: ``--worlds``, else ``env.WORLDS``, else what the node
    holds. Asked by the controller only: a world is one (``streamfuzz.fuzz.plan``)."""
    if mps == "on" and device != "cuda":
        raise UsageError(f"--mps on shares a GPU between worlds, but the ranks run on {device}")
    from streamfuzz.fuzz.worlds import how_many

    try:
        n = how_many(worlds, device, world)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if n.asked and device == "cpu":
        check_cpu_world(n.worlds * world, f"{n.why} of {world} ranks")
    return n.worlds


def check_cpu_world(size: int, what: str) -> None:
    limit, why = cpu_world_limit()
    if size > limit:
        raise UsageError(f"{what}: this machine holds at most {limit} CPU ranks ({why})")


def check_dir(path: Path, flag: str) -> None:
    """A directory that exists or can be made, and takes a new file; else one
    line, exit 2. Tried for real (root passes any permission check); the
    folders made for the try are removed again, so that a run that writes
    nothing there leaves nothing behind (every writer makes its own folder)."""
    with contextlib.suppress(FileNotFoundError):  # one stat: a folder may come and go
        if not stat.S_ISDIR(path.stat().st_mode):
            raise UsageError(f"{flag} {path}: exists and is not a directory")
    for attempt in range(_PROBE_TRIES):
        made = [p for p in (path, *path.parents) if not p.exists()]
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".streamfuzz-probe.", suffix=".tmp", dir=path)
            os.close(fd)
            os.unlink(probe)
            return
        except (FileNotFoundError, FileExistsError):
            # Another process checking the same folder (a world beside this one)
            # removed the empty folder it had made for its own try: try again.
            if attempt == _PROBE_TRIES - 1:
                raise UsageError(f"{flag} {path}: not a writable directory (it vanished "
                                 f"{_PROBE_TRIES} times while being tried)") from None
        except OSError as exc:
            raise UsageError(f"{flag} {path}: not a writable directory "
                             f"({exc.strerror or exc})") from None
        finally:
            for p in made:  # deepest first; one that another writer filled meanwhile stays
                with contextlib.suppress(OSError):
                    p.rmdir()


_PROBE_TRIES = 20


def check_file(path: Path, flag: str) -> None:
    """A file that can be written (its folder is made if missing)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    check_dir(path.parent, flag)
