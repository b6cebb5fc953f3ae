"""The processes a checked program starts are checked too, and report back.

A checked program (``streamfuzz check``, ``pytest --streamfuzz``) exports the
variables below; ``streamfuzz/_boot/sitecustomize.py``, put first on
``PYTHONPATH``, makes every Python process started under them (``torchrun``'s
workers, ``mp.spawn``, a spawned ``multiprocessing`` child) run as one
checked region, the way coverage.py measures subprocesses. A child forked by
``multiprocessing`` inherits the parent's simulation and starts a checker of
its own. Each child writes its findings to one file of the folder at its exit,
with its part of the run's record where the run keeps one (``streamfuzz._record``);
the parent reads them back and reports them as its own.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import env
from streamfuzz.fuzz.verdict import Failure

DIR_ENV = env.CHECK_DIR
"""The folder children write their findings to; set, it turns the checking of children on."""
DEVICE_ENV = env.CHECK_DEVICE
ORACLES_ENV = env.CHECK_ORACLES
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")

_check: Any = None
"""This process's checker over its whole run, once ``check_this_process`` started it."""
_wrote = False


@dataclass(frozen=True)
class ChildFindings:
    """What one child process found, as it wrote it at its exit."""

    pid: int
    argv: list[str]
    findings: list[Failure]
    record: dict[str, Any] | None = None
    """Its part of the run's record (``streamfuzz._record.Record.to_dict``), where kept."""

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "argv": self.argv,
                "findings": [f.to_dict() for f in self.findings], "record": self.record}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChildFindings:
        return cls(int(d["pid"]), [str(a) for a in d["argv"]],
                   [Failure(**f) for f in d["findings"]], d.get("record"))


def export(folder: str, device: str, oracles: tuple[str, ...]) -> None:
    """Have every Python process started from now on check itself on ``device``."""
    os.environ[DIR_ENV] = folder
    os.environ[DEVICE_ENV] = device
    os.environ[ORACLES_ENV] = ",".join(oracles)
    path = os.environ.get("PYTHONPATH", "")
    if _BOOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = _BOOT + (os.pathsep + path if path else "")
    os.register_at_fork(after_in_child=_forked)
    import multiprocessing.util

    multiprocessing.util.register_after_fork(_KEEP, _forked_by_multiprocessing)


def gather(folder: str) -> list[ChildFindings]:
    """The findings children wrote to ``folder`` since the last call (read once)."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                out.append(ChildFindings.from_dict(json.load(f)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return out


def check_this_process() -> None:
    """Run this whole process as one checked region (a child of a checked
    program: ``sitecustomize`` calls this where ``DIR_ENV`` is set)."""
    global _check
    from streamfuzz import _check as check_module
    from streamfuzz import _record

    if os.environ.get(_record.RECORD_ENV):
        _record.start()
    check_module.begin_whole(os.environ.get(DEVICE_ENV, "auto"),
                             "in a process of a checked program",
                             "run the program with --device cuda on a GPU")
    _start_checker()


def _start_checker() -> None:
    """This process's block over the rest of its run, on the whole process's
    device, judged by the oracles the parent exported; written at its exit."""
    global _check
    from streamfuzz import _check as check_module

    oracles = [o for o in os.environ.get(ORACLES_ENV, "").split(",") if o] or None
    _check = check_module.checked(device=check_module.whole_device(), oracles=oracles,
                                  collect=True)
    _check.__enter__()
    atexit.register(_write)


def hand_over() -> None:
    """This process, checked whole as a child of a checked program, is a test
    session now: its tests are the blocks, and the session reports them."""
    global _check, _wrote
    check, _check = _check, None
    _wrote = True
    if check is not None:
        check.abandon()


class _Keep:
    """``multiprocessing.util.register_after_fork`` holds its objects weakly."""


_KEEP = _Keep()


def _forked() -> None:
    """In a forked child: the parent's checker is the parent's; this child
    gets its own, over the rest of its run."""
    global _check, _wrote
    from streamfuzz import _check as check_module
    from streamfuzz import _record

    inherited = check_module._active
    if inherited is not None:
        inherited.abandon()
    _record.forked()
    _wrote = False
    _check = None
    if os.environ.get(DIR_ENV) and check_module.whole_device() is not None:
        _start_checker()


def _forked_by_multiprocessing(_: object) -> None:
    """A ``multiprocessing`` child ends with ``os._exit``, after its finalizers
    (registered here: its start clears those it inherited), not ``atexit``."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _write, exitpriority=-100)


def _write() -> None:
    """End this process's checker and write what it found (once)."""
    global _wrote, _check
    folder = os.environ.get(DIR_ENV)
    if _wrote or _check is None or not folder:
        return
    _wrote = True
    check, _check = _check, None
    try:
        check.__exit__(None, None, None)
    except Exception as exc:  # its own bug must not hide the program's exit
        print(f"streamfuzz: the checker of process {os.getpid()} failed at exit: {exc}",
              file=sys.stderr)
        return
    if not os.path.isdir(folder):
        return  # the checked program ended before this helper of it (a resource tracker)
    from streamfuzz import _record

    part = (_record.this_process("a child process", check.device or "?").to_dict()
            if _record.recording() else None)
    from streamfuzz.fuzz.corpus import write_json_atomic

    record = ChildFindings(os.getpid(), list(sys.argv), list(check.findings), part)
    try:  # a temporary name first: ``gather`` reads only whole ``.json`` files
        write_json_atomic(Path(folder) / f"{os.getpid()}.json", record.to_dict())
    except OSError as exc:
        print(f"streamfuzz: process {os.getpid()} could not report its findings: {exc}",
              file=sys.stderr)
