"""``python -m streamfuzz`` / ``streamfuzz``: run, replay, matrix, bench, soak, mutate, scan,
check.

Exit status: 0 nothing found (or every replayed entry behaves as recorded),
1 a failure was found and saved (or a replay disagreed), 2 bad usage or config,
3 (soak with external ranks) the ranks were lost before the budget was spent,
70 streamfuzz itself crashed (a traceback, not a finding), 130 interrupted.
"""


from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

from streamfuzz.fuzz import stop
from streamfuzz.fuzz.commands import plan as plans
from streamfuzz.fuzz.commands import say_error
from streamfuzz.fuzz.commands.bench import bench_command
from streamfuzz.fuzz.commands.grammar import parser
from streamfuzz.fuzz.commands.mutate import mutate_command
from streamfuzz.fuzz.commands.replay import replay_command
from streamfuzz.fuzz.commands.run import interrupted_counting_gpus, run_command
from streamfuzz.fuzz.commands.soak import soak_command
from streamfuzz.fuzz.errors import EXIT_CRASH, BadInput


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with _terminate_as_interrupt():
            return _command(argv)
    except BadInput as exc:  # usage, target, corpus, options, upstream, ranks' start
        say_error(exc)
        return 2
    except KeyboardInterrupt:
        print("streamfuzz: interrupted", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        print(f"streamfuzz: crashed (exit {EXIT_CRASH}): a bug in streamfuzz or its "
              "environment, not a finding", file=sys.stderr)
        return EXIT_CRASH




@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a job's time limit, ``kill``) is handled as Ctrl-C: what was
    found is saved as shrunk so far and the report written, where the default
    action would end the process at once. Both are noted as well as raised
    (``streamfuzz.fuzz.stop.note_signal``). ``soak`` installs its own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        stop.note_signal()
        raise KeyboardInterrupt

    try:
        with stop.handled(interrupt):
            yield
    finally:
        stop.clear_signal()


def _command(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.command in ("run", "soak", "matrix"):
        return _planned(args)
    if args.command == "bench":
        return bench_command(args)
    if args.command == "mutate":
        return mutate_command(args)
    if args.command == "check":
        from streamfuzz.fuzz.commands.check import check_command

        return check_command(args)
    if args.command == "scan":
        from streamfuzz.fuzz.scan.command import main as scan

        return scan(args)
    return replay_command(args)


def _planned(args: argparse.Namespace) -> int:
    """A command that runs from a ``Plan``: made once here, before any work."""
    if args.command == "matrix":
        from streamfuzz.fuzz import matrix

        return matrix.main(plans.for_matrix(args, args.argv))
    try:
        plan = (plans.for_run if args.command == "run" else plans.for_soak)(args, args.argv)
    except plans.CountingGPUs as stopped:
        return interrupted_counting_gpus(args, stopped)
    return (run_command if args.command == "run" else soak_command)(plan)
