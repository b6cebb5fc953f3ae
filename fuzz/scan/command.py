"""``python -m streamfuzz scan``: its options and what it does with them.

Exit status: 0 no finding at or above ``--fail-above`` (or no threshold set),
1 at least one, 2 bad input (said in one line, before any file is read).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from streamfuzz.fuzz.errors import BadInput

if TYPE_CHECKING:
    from streamfuzz._record import Record


class ScanUsageError(BadInput, ValueError):
    """A scan option that cannot be used; one line."""


def _score(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer score") from None
    if not 1 <= value <= 99:
        raise argparse.ArgumentTypeError(f"{text!r} must be a score in 1..99")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("scan", help="rank the places where a package's stream code may be "
                                    "unordered; write a checked() harness for one")
    s.add_argument("path", metavar="PATH",
                   help="a source tree, a .py file, a wheel, an sdist or an installed "
                        "package's name")
    s.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="write every finding (and the suppressed ones) as JSON (default: none)")
    s.add_argument("--md", type=Path, default=None, metavar="FILE",
                   help="write every finding as a markdown table (default: none)")
    s.add_argument("--fail-above", type=_score, default=None, metavar="SCORE",
                   help="exit 1 when a finding scores SCORE or more (default: exit 0 "
                        "whatever is found)")
    s.add_argument("--top", type=_count, default=30, metavar="N",
                   help="rows of the terminal table (default 30; 0: all)")
    s.add_argument("--harness", default=None, metavar="FILE:LINE",
                   help="write a streamfuzz.checked() harness skeleton for the function at "
                        "FILE:LINE of PATH (a finding's site) instead of the report "
                        "(default: the report)")
    s.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="where --harness writes (default test_streamfuzz_<function>.py)")
    s.add_argument("--record", default=None, metavar="FILE",
                   help="a record of a checked run (pytest --streamfuzz-record, check "
                        "--record): mark each finding flagged, clean or not reached in it; "
                        "with --harness, write the harness from the call it recorded "
                        "(default: no marks; a harness read from the source)")


def main(args: argparse.Namespace) -> int:
    from streamfuzz.fuzz.commands.checks import check_file
    from streamfuzz.fuzz.scan import report, scan
    from streamfuzz.fuzz.scan.sources import open_source

    for path, flag in ((args.json, "--json"), (args.md, "--md"), (args.out, "--out")):
        if path is not None:
            check_file(path, flag)
    site = _site(args.harness) if args.harness else None
    record = _record(args.record)
    source = open_source(args.path)  # bad input: one line, exit 2, nothing read yet
    if site is not None:
        from streamfuzz.fuzz.scan import harness

        out = harness.write_for(source, site[0], site[1], args.out,
                                None if record is None else (record, args.record))
        made = " from the recorded call" if record is not None else ""
        print(f"streamfuzz scan: wrote {out}{made} (run it with pytest --streamfuzz-device cpu)")
        return 0
    t0 = time.monotonic()
    result = scan(source)
    seconds = time.monotonic() - t0
    marks = None
    if record is not None:
        from streamfuzz.fuzz.scan.marks import mark

        marks = mark(result, record, args.record)
    if args.json is not None:
        report.write_json(args.json, result, seconds, marks)
    if args.md is not None:
        report.write(args.md, report.markdown(result, marks))
    print(report.table(result, None if args.top == 0 else args.top, marks))
    print(f"({seconds:.1f} s)", file=sys.stderr)
    if args.fail_above is not None and any(f.score >= args.fail_above for f in result.active):
        return 1
    return 0


def _record(path: str | None) -> Record | None:
    """The run's record ``--record`` names, read before the scan starts."""
    if path is None:
        return None
    from streamfuzz._record import read

    return read(path, "--record")


def _site(text: str) -> tuple[str, int]:
    file, sep, line = text.rpartition(":")
    if not sep or not file or not line.isdigit() or int(line) < 1:
        raise ScanUsageError(f"--harness {text!r}: expected FILE:LINE, as a finding's site")
    return file, int(line)
