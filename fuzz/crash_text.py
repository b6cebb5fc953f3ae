"""What a dying or stuck rank's output says, in a line a finding can hold:
the cause among pages of backtrace, the serving thread's stack from a
faulthandler dump, how the process ended."""

from __future__ import annotations

import re
import signal

from streamfuzz.fuzz.sites import display_path

# Lines of a dying process that say nothing about why: C++ and Python frames,
# addresses, separators.
_NOISE = re.compile(r"^\s*(frame #\d+|#\d+\s|0x[0-9a-fA-F]+|Exception raised from|"
                    r"C\+\+ CapturedTraceback|File \"|Traceback \(|-{3,}|={3,})")
# Lines that do: a device-side assert, a CUDA or NCCL error, an abort.
_CAUSE = re.compile(r"Assertion .* failed|CUDA error|NCCL error|terminate called|"
                    r"Aborted|Segmentation fault|\w+Error\b|illegal memory access")
# A device-side assert repeats once per thread; its coordinates make lines differ.
_COORDS = re.compile(r"block: \[[\d,]+\], thread: \[[\d,]+\]")


def cause(text: str, limit: int = 600) -> str:
    """The lines of a rank's output that say why it died, at most ``limit`` chars.

    A device-side assert kills the process with SIGABRT after pages of C++
    backtrace; the assert line (with the kernel's source file shortened to its
    name) is what a user needs in the finding. Without a recognisable cause
    line, the last few lines that are not frames.
    """
    lines, seen = [], set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _NOISE.match(line):
            continue
        line = re.sub(r"(?:/[^\s:/]+)+/([^\s:/]+:\d+)", r"\1", line)
        key = _COORDS.sub("", line)
        if key in seen:
            continue
        seen.add(key)
        lines.append(line)
    causes = [ln for ln in lines if _CAUSE.search(ln)]
    picked = causes[:3] if causes else lines[-4:]
    return " | ".join(picked)[:limit] or "(no output)"


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<fn>\S+)')


def main_stack(dump: str, limit: int = 8) -> str:
    """From a faulthandler dump of every thread, the thread serving examples
    (the one in ``rank_main.serve``), innermost first, as ``path:line fn <- ...``."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    frames = [[m.groupdict() for m in map(_FRAME.match, b.splitlines()) if m] for b in blocks]
    serving = [f for f in frames
               if any(x["path"].endswith("rank_main.py") and x["fn"] == "serve" for x in f)]
    pick = serving[0] if serving else (frames[0] if frames else [])
    return " <- ".join(f"{display_path(x['path'])}:{x['line']} {x['fn']}" for x in pick[:limit])


def signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
