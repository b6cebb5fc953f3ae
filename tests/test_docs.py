"""The docs say what the code does: quoted output comes from real runs, links
resolve, and the weight-sync example target is clean and its syncs matter.

Quoted blocks are rewritten from real runs with ``python -m tests.doc_quotes``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import doc_quotes
from tests.doc_quotes import QUOTES, ROOT

# What a block of printed findings has and prose or code does not.
_FINDING = re.compile(r"FOUND |race on |was freed while stream|StreamfuzzError|\.py:\d+ \w+ <- ")


def _all_blocks() -> list[doc_quotes.Block]:
    return [b for p in doc_quotes.doc_files() for b in doc_quotes.blocks(p)]


def _unmarked_output(path: Path) -> list[str]:
    """Fenced non-code blocks and tables that print findings with no marker above."""
    lines = path.read_text().splitlines()
    marked = {b.start for b in doc_quotes.blocks(path)}
    bad, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            lang = line[3:].strip()
            body = "\n".join(lines[i + 1:end])
            if lang not in ("python", "sh", "json") and _FINDING.search(body) \
                    and i + 1 not in marked:
                bad.append(f"{path.name}:{i + 1}")
            i = end + 1
        elif line.startswith("|"):
            end = next((k for k in range(i, len(lines)) if not lines[k].startswith("|")),
                       len(lines))
            if _FINDING.search("\n".join(lines[i:end])) and i not in marked:
                bad.append(f"{path.name}:{i + 1}")
            i = end
        else:
            i += 1
    return bad


def test_every_quoted_finding_is_checked_against_a_run():
    bad = [where for p in doc_quotes.doc_files() for where in _unmarked_output(p)]
    assert not bad, f"output quoted with no <!-- output: NAME --> marker: {bad}"
    names = {b.name for b in _all_blocks()}
    assert names <= set(QUOTES), names - set(QUOTES)
    assert set(QUOTES) <= names, f"quotes no doc shows: {set(QUOTES) - names}"


@pytest.mark.parametrize("name", sorted(QUOTES))
def test_quoted_output_is_what_the_command_prints(name):
    if QUOTES[name].vllm and not doc_quotes.has_wheel(QUOTES[name].vllm):
        pytest.skip(f"no cached vLLM {QUOTES[name].vllm} wheel (make vllm-fetch "
                    f"VLLM={QUOTES[name].vllm})")
    real = doc_quotes.comparable(doc_quotes.produce(name))
    for b in (b for b in _all_blocks() if b.name == name):
        assert doc_quotes.comparable(b.text) == real, (
            f"{b.path.name}: the quote {name!r} is not what the command prints now; "
            f"rewrite it with `python -m tests.doc_quotes {name}`:\n{real}")


def test_comparing_ignores_timings_only():
    a = "pre-fix: FOUND lifetime after 1 examples (0.1s)\n  pre-fix  lifetime  3  23.9  1 ex / 0.1s"
    b = "pre-fix: FOUND lifetime after 1 examples (2.4s)\n  pre-fix  lifetime  3  9.5   1 ex / 2.4s"
    assert doc_quotes.comparable(a) == doc_quotes.comparable(b)
    assert doc_quotes.comparable(a) != doc_quotes.comparable(a.replace("after 1", "after 2"))
    frames = "fuzz/runner.py:253 _call <- fuzz/runner.py:180 run"
    assert doc_quotes.comparable(frames) != doc_quotes.comparable(frames.replace("253", "254"))


def test_links_resolve():
    link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
    bad = []
    for p in [*doc_quotes.doc_files(), ROOT / "bench" / "README.md", ROOT / "bench" / "HISTORY.md"]:
        for target, _ in link.findall(p.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (p.parent / target).exists():
                bad.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not bad, bad


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_weight_sync_page_shows_the_example_target_verbatim():
    code = (ROOT / "examples" / "my_weight_sync.py").read_text()
    assert code.strip() in (ROOT / "docs" / "target-weight-sync.md").read_text()


def test_weight_sync_example_target_is_clean():
    r = doc_quotes.run("-m", "streamfuzz", "run", "--target", doc_quotes.WEIGHT_SYNC, "--device",
                       "cpu", "--world-size", "2", "--max-examples", "40", "--seed", "0",
                       "--corpus", "{tmp}/corpus", in_root=True)
    assert r.rc == 0, r.stdout + r.stderr
    assert f"{doc_quotes.WEIGHT_SYNC}: clean over 40 examples" in r.stdout, r.stdout


def test_weight_sync_example_needs_its_waits():
    r = doc_quotes.run(*doc_quotes.WEIGHT_SYNC_MUTATE, in_root=True)
    assert r.rc in (0, 1), r.stdout + r.stderr
    assert "the original ran clean over 40 examples" in r.stdout, r.stdout
    caught = re.findall(r"^  examples/my_weight_sync\.py:\d+\s+\S+\.wait_stream\(\w+\)\s+caught ",
                        r.stdout, re.M)
    assert caught, r.stdout

