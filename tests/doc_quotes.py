"""The example output quoted in README.md and docs/, and the runs that make it.

A quoted block sits right under a marker line ``<!-- output: NAME -->``: a
fenced block or a markdown table. ``tests/test_docs.py`` runs each quote's
command and checks the block against what it prints, timings aside, so the
file:line frames in the docs cannot drift from the code. After a change that
moves code, rewrite the blocks from real runs:

    python -m tests.doc_quotes             # every quote
    python -m tests.doc_quotes NAME ...    # some of them

Each command runs in a fresh temporary folder with the project first on
``PYTHONPATH`` (or in the project, for a quote of a path target, writing only
under the temporary folder), so what it saves lands there, never in the
project's ``corpus/``.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

MARKER = re.compile(r"^<!-- output: ([\w.-]+) -->$")


@dataclass(frozen=True)
class Ran:
    """One command's result, and its temporary folder (the files it wrote)."""

    rc: int
    stdout: str
    stderr: str
    tmp: Path


@functools.cache
def run(*args: str, in_root: bool = False, timeout: int = 900) -> Ran:
    """``python ARGS...`` in a fresh folder (or the project's), once per process
    for the same args; ``{tmp}`` in ARGS is that fresh folder."""
    tmp = Path(tempfile.mkdtemp(prefix="quote-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    res = subprocess.run([sys.executable, *(a.replace("{tmp}", str(tmp)) for a in args)],
                         cwd=ROOT if in_root else tmp, env=env, capture_output=True,
                         text=True, timeout=timeout)
    return Ran(res.returncode, res.stdout, res.stderr, tmp)


def _finding(target: str) -> Callable[[Ran], str]:
    """A target's finding as ``run`` prints it: the FOUND line to its saved line."""
    def take(r: Ran) -> str:
        lines = r.stdout.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}: FOUND"))
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("  saved: "))
        return "\n".join(lines[start:end + 1])
    return take


def _stdout(r: Ran) -> str:
    return r.stdout.strip("\n")


def _mutate_table(r: Ran) -> str:
    """The markdown table ``mutate`` writes into --out."""
    (md,) = (r.tmp / "out").glob("*.md")
    return "\n".join(line for line in md.read_text().splitlines() if line.startswith("|"))


def _not_clean(r: Ran) -> str:
    return next(line for line in r.stderr.splitlines() if " is not clean: " in line)


def _pytest_failure(r: Ran) -> str:
    """The first failure's message and Hypothesis's shrunk example, as pytest prints them."""
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "streamfuzz.StreamfuzzError:" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip() == "E       )")
    return "\n".join(lines[start:end + 1])


@dataclass(frozen=True)
class Quote:
    """What makes one quoted block: a command, and the part of its output quoted."""

    args: tuple[str, ...]
    take: Callable[[Ran], str]
    in_root: bool = False
    vllm: str = ""
    """A vLLM version the command needs as a cached wheel (else it is skipped)."""


def _mutate(target: str, *more: str) -> tuple[str, ...]:
    return ("-m", "streamfuzz", "mutate", "--target", target, "--out", "{tmp}/out", *more)


WEIGHT_SYNC = "examples/my_weight_sync.py:make_handler"
WEIGHT_SYNC_MUTATE = _mutate(WEIGHT_SYNC, "--max-examples", "40")
"""The weight-sync example's mutants (run in the project, as a user would run
them); tests/test_docs.py checks their verdicts too."""

QUOTES: dict[str, Quote] = {
    "run-three": Quote(("-m", "streamfuzz", "run", "--device", "cpu", "--seed", "0"), _stdout),
    "host-read-unsynced": Quote(
        ("-m", "streamfuzz", "run", "--target", "host-read-unsynced", "--device", "cpu",
         "--oracle", "lifetime", "--seed", "0"), _finding("host-read-unsynced")),
    "weight-sync-unordered": Quote(
        ("-m", "streamfuzz", "run", "--target", "weight-sync-unordered", "--device", "cpu",
         "--world-size", "2", "--oracle", "lifetime", "--seed", "0"),
        _finding("weight-sync-unordered")),
    "check-overlap": Quote(
        ("-m", "pytest", "-q", "-p", "no:cacheprovider", "--streamfuzz-device", "cpu",
         str(ROOT / "examples" / "check_overlap.py")), _pytest_failure),
    "mutate-my-handler": Quote(_mutate("examples.my_handler:make_handler"), _mutate_table),
    "mutate-main-gather": Quote(_mutate("main-gather"), _mutate_table),
    "mutate-my-weight-sync": Quote(WEIGHT_SYNC_MUTATE, _mutate_table, in_root=True),
    "mutate-vllm-pp-0.34.0": Quote(_mutate("vllm-pp@0.34.0"), _mutate_table, vllm="0.34.0"),
    "mutate-vllm-pp-0.32.0": Quote(_mutate("vllm-pp@0.32.0"), _not_clean, vllm="0.32.0"),
}


def produce(name: str) -> str:
    """Run quote ``name``'s command and return the text the docs quote."""
    q = QUOTES[name]
    return q.take(run(*q.args, in_root=q.in_root))


def has_wheel(version: str) -> bool:
    from streamfuzz.fuzz import upstream

    return any(upstream.cache_dir().glob(f"vllm-{version}-*.whl"))


def comparable(text: str) -> str:
    """Text with what changes from run to run taken out: decimals (seconds,
    rates) and the column padding that follows their width."""
    text = re.sub(r"\d+\.\d+", "N", text)
    return "\n".join(re.sub(r"[ \t]+", " ", line).rstrip() for line in text.strip().splitlines())


@dataclass(frozen=True)
class Block:
    """A quoted block in a markdown file: its marker's name and its lines."""

    path: Path
    name: str
    start: int
    """Index of the block's first content line."""
    end: int
    """Index one past its last content line."""
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines[self.start:self.end])


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every marked block in one markdown file."""
    lines = tuple(path.read_text().splitlines())
    found = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].startswith("```"):
            end = next(k for k in range(j + 1, len(lines)) if lines[k].startswith("```"))
            found.append(Block(path, m.group(1), j + 1, end, lines))
        elif j < len(lines) and lines[j].startswith("|"):
            end = next((k for k in range(j, len(lines)) if not lines[k].startswith("|")),
                       len(lines))
            found.append(Block(path, m.group(1), j, end, lines))
        else:
            raise ValueError(f"{path.name}:{i + 1}: marker {m.group(1)!r} has no block under it")
    return found


def rewrite(names: set[str] | None = None) -> list[str]:
    """Rewrite the marked blocks (those of ``names``, else all) from real runs."""
    done = []
    for path in doc_files():
        lines = path.read_text().splitlines()
        for b in reversed(blocks(path)):  # from the end, so earlier indices stay valid
            if names and b.name not in names:
                continue
            if QUOTES[b.name].vllm and not has_wheel(QUOTES[b.name].vllm):
                print(f"skipped {b.name}: no cached vLLM {QUOTES[b.name].vllm} wheel")
                continue
            lines[b.start:b.end] = produce(b.name).splitlines()
            done.append(f"{path.relative_to(ROOT)}: {b.name}")
        path.write_text("\n".join(lines) + "\n")
    return done

if __name__ == "__main__":
    for line in rewrite(set(sys.argv[1:]) or None):
        print(line)
