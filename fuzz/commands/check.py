"""``streamfuzz check [--device D] [--oracle O,..] SCRIPT [ARGS]`` / ``check -m MODULE [ARGS]``.

A program runs unchanged as one checked region, as ``coverage run`` runs it:
on ``cpu`` on simulated streams from its first line, on ``cuda`` on real ones.
The processes it starts are checked too (``streamfuzz._subprocesses``), and
their findings are reported here, at the program's end. Exit status: the
program's own when it is not 0, else 1 on a finding, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from streamfuzz.fuzz.commands import UsageError

_WHERE = "under streamfuzz check"
_ON_GPU = "run the program under streamfuzz check --device cuda on a GPU"


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "check", help="run a program unchanged as one checked region, its child processes "
                      "included; findings at its exit (exit 1)",
        description="Run SCRIPT (or -m MODULE) with its arguments as one checked region, "
                    "as `coverage run` does; processes it starts are checked too.")
    c.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                   help="cpu: simulated CUDA streams, no GPU needed; cuda: real streams; "
                        "auto (default): cuda where a GPU is visible")
    c.add_argument("--oracle", default=None, metavar="O[,O]",
                   help="which findings to report: lifetime, race (default: both)")
    c.add_argument("--record", default=None, metavar="FILE",
                   help="write the run's record to FILE (which functions did stream work, "
                        "which a finding named), for `streamfuzz scan PATH --record FILE` "
                        "(default: none)")
    c.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                   help="run a module as `python -m MODULE` does, instead of a script; "
                        "what follows is its arguments (default: a script)")
    c.add_argument("program", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the program and its arguments")


def _plan(args: argparse.Namespace) -> tuple[str, list[str], tuple[str, ...]]:
    """What to run (``script`` or ``-m``), its argv, and the oracles: bad input
    is one line here, before anything starts."""
    from streamfuzz import _check
    from streamfuzz.fuzz.commands.checks import check_file

    if args.record is not None:
        check_file(Path(args.record), "check --record")
    if args.oracle is not None and not args.oracle.strip(" ,"):
        raise UsageError("--oracle: no oracle given, so nothing would judge the program")
    names = None if args.oracle is None else [o.strip() for o in args.oracle.split(",")
                                               if o.strip()]
    oracles = _check._valid_oracles(names)
    argv = list(args.program)
    if args.module is not None:
        if not args.module:
            raise UsageError("check -m needs a module name")
        try:
            found = importlib.util.find_spec(args.module[0]) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"check -m {args.module[0]}: no such module here")
        return "-m", list(args.module), oracles
    if not argv:
        raise UsageError("check needs a program: SCRIPT [ARGS] or -m MODULE [ARGS]")
    script = argv[0]
    if not os.path.isfile(script):
        raise UsageError(f"check: no such file {script!r}")
    if not os.access(script, os.R_OK):
        raise UsageError(f"check: cannot read {script!r}")
    return "script", argv, oracles


def check_command(args: argparse.Namespace) -> int:
    from streamfuzz import _check, _record, _subprocesses

    how, argv, oracles = _plan(args)
    device = _check._resolve(_check._valid_device(args.device))
    folder = tempfile.mkdtemp(prefix="streamfuzz-check-")
    try:
        if args.record is not None:
            _record.start()
        _subprocesses.export(folder, device, oracles)
        _check.begin_whole(device, _WHERE, _ON_GPU)
        check = _check.checked(device=device, oracles=oracles, collect=True)
        check.__enter__()
        try:
            status = _run(how, argv)
        finally:
            check.__exit__(None, None, None)
            _check.end_whole()
        children = _subprocesses.gather(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    found = len(check.findings) + sum(len(c.findings) for c in children)
    program = argv[0] if how == "script" else f"-m {argv[0]}"
    _report(program, device, oracles, check.findings, children)
    if args.record is not None:
        for child in children:
            _record.absorb(child.record)
        record = _record.this_process(f"streamfuzz check {program}", device)
        _record.write(args.record, record)
        print(f"streamfuzz check: record written to {args.record} ({len(record.functions)} "
              f"function(s) did stream work, {len(record.findings)} finding(s))",
              file=sys.stderr)
    if status != 0:
        return status
    return 1 if found else 0


def _run(how: str, argv: list[str]) -> int:
    """Run the program as ``python`` would; its exit status."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = list(argv)
    if how == "-m":
        sys.argv[0] = argv[0]
        sys.path[0:1] = [os.getcwd()]
    else:
        sys.path[0:1] = [os.path.dirname(os.path.abspath(argv[0]))]
    try:
        if how == "-m":
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        print("streamfuzz check: the program was interrupted", file=sys.stderr)
        return 130
    except BaseException:
        _print_program_traceback()
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0:1] = [saved_path0]
    return 0


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_program_traceback() -> None:
    """The program's own traceback, without this module's frames."""
    kind, exc, tb = sys.exc_info()
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
        tb = tb.tb_next
    traceback.print_exception(kind, exc, tb)


def _report(program: str, device: str, oracles: tuple[str, ...], own: list[Any],
            children: list[Any]) -> None:
    judged = ", ".join(oracles)
    processes = 1 + len(children)
    found = len(own) + sum(len(c.findings) for c in children)
    where = f"{processes} process{'es' if processes > 1 else ''}"
    if not found:
        print(f"streamfuzz check: {program}: clean ({judged} judged on {device}; {where})",
              file=sys.stderr)
        return
    print(f"streamfuzz check: {program}: {found} finding(s) on {device} ({judged} judged; "
          f"{where})", file=sys.stderr)
    for f in own:
        print(f"{f.kind}: {f.message}", file=sys.stderr)
    for child in children:
        for f in child.findings:
            print(f"[child process {child.pid}: {' '.join(child.argv)[:80]}] {f.kind}: "
                  f"{f.message}", file=sys.stderr)
