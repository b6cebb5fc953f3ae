"""``mutate``: delete each synchronization of a target, fuzz, and say which were missed.

One mutant per sync site (``streamfuzz.fuzz.sync_sites``), loaded on the ranks by name
(``streamfuzz.fuzz.targets.mutated``). The original target is fuzzed first with the same
seed and example bound: a target that fails already says nothing about its
syncs. Then the mutants are fuzzed in parallel, each worker on its own rank
pool. A mutant is ``caught`` when the fuzzer finds a failure, ``survived``
when it runs its examples clean; a survivor is explained as far as the tool
can tell (see ``_why``).
"""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamfuzz.fuzz import driver, profiles, sync_sites
from streamfuzz.fuzz.errors import FuzzError
from streamfuzz.fuzz.options import RunOptions
from streamfuzz.fuzz.ranks import RankPool
from streamfuzz.fuzz.sync_sites import Site
from streamfuzz.fuzz.targets import mutated

Log = Callable[[str], None]


class NotClean(FuzzError):
    """The original target fails on its own: its mutants would tell nothing."""


@dataclass
class Row:
    """One site's mutant and its verdict."""

    site: Site
    mutant: str
    verdict: str = "survived"
    """``caught`` or ``survived``."""
    examples: int = 0
    seconds: float = 0.0
    kind: str | None = None
    first_failure: int | None = None
    """Examples run up to and including the first failing one."""
    message: str | None = None
    """The shrunk case's finding."""
    shrunk: str | None = None
    corpus_path: str | None = None
    flaky: bool = False
    reached: bool | None = None
    """Whether any example ran the site's line (survivors; None when unknown)."""
    why: str | None = None
    """For a survivor: redundant, or cannot tell and what would separate."""


@dataclass
class Report:
    target: str
    device: str
    world_size: int
    max_examples: int
    seed: int
    oracles: list[str]
    jobs: int
    clean_examples: int = 0
    sites: int = 0
    """Sites asked for; fewer rows when interrupted."""
    rows: list[Row] = field(default_factory=list)
    elapsed_s: float = 0.0
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for row, r in zip(d["rows"], self.rows):
            row["site"] = {"file": r.site.path, "line": r.site.line, "col": r.site.col,
                           "rule": r.site.rule, "call": r.site.call}
        d["caught"] = sum(r.verdict == "caught" for r in self.rows)
        d["survived"] = sum(r.verdict == "survived" for r in self.rows)
        d["mutants_per_min"] = (round(60 * len(self.rows) / self.elapsed_s, 2)
                                if self.elapsed_s else None)
        return d


def select(target: str, lines: list[int] | None = None) -> list[Site]:
    """``target``'s sites (those on ``lines`` only, when given); raises ValueError
    (or TargetError) naming what is wrong, before any work."""
    sites = mutated.sites(target)
    if not sites:
        raise ValueError(f"{target}: no synchronization call in its own source")
    if lines:
        missing = sorted(set(lines) - {s.line for s in sites})
        if missing:
            raise ValueError(f"--site {missing[0]}: no sync site on that line of "
                             f"{sites[0].path} (sites: {', '.join(str(s.line) for s in sites)})")
        sites = [s for s in sites if s.line in lines]
    return sites


def default_jobs(device: str, gpus: int, world_size: int) -> int:
    """One rank pool per ``world_size`` CPU cores (cpu) or GPUs (cuda)."""
    import os

    have = (os.cpu_count() or 1) if device == "cpu" else gpus
    return max(1, have // world_size)


def run(target: str, sites: list[Site], *, device: str, world_size: int, jobs: int,
        max_examples: int, seed: int, options: RunOptions, timeout: float,
        shrink_budget_s: float, corpus_dir: Path | None, log: Log = print) -> Report:
    """Check ``target`` is clean, then fuzz one mutant per site; raises NotClean."""
    report = Report(target, device, world_size, max_examples, seed, options.oracle_names(),
                    max(1, min(jobs, len(sites))), sites=len(sites))
    start = time.monotonic()
    settings = profiles.get("ci")
    hits = Path(tempfile.mkdtemp(prefix="streamfuzz-hits-"))
    stopping = threading.Event()

    def pool() -> RankPool:
        p = RankPool(world_size, device, timeout=timeout, env={mutated.HITS_ENV: str(hits)})
        p.start()
        return p

    def fuzz(pool: RankPool, name: str, corpus: Path | None) -> driver.CampaignResult:
        return driver.fuzz(pool, name, settings, max_examples=max_examples, seed=seed,
                           options=options, shrink_budget_s=shrink_budget_s, corpus_dir=corpus,
                           stop=stopping.is_set)

    def one(p: RankPool, site: Site) -> Row:
        return _mutant(fuzz, p, target, site, hits, corpus_dir)

    first = None
    try:
        first = pool()
        log(f"{target}: checking the original ({max_examples} examples, seed {seed})")
        clean = fuzz(first, target, None)
        if clean.failure is not None:
            raise NotClean(f"{target} is not clean: {clean.failure.kind} after "
                           f"{clean.first_failure_examples} examples "
                           f"({clean.failure.message.splitlines()[0]}); "
                           "fix it (or fuzz it with `run`) before asking which syncs it needs")
        report.clean_examples = clean.examples
        rows = _parallel(sites, report.jobs, first, pool, one, stopping, log)
        report.rows = [rows[s] for s in sites if s in rows]
        report.complete = not stopping.is_set() and len(report.rows) == len(sites)
        _explain(report)
    finally:
        if first is not None:
            first.close()
        for f in hits.iterdir():
            f.unlink()
        hits.rmdir()
    report.elapsed_s = time.monotonic() - start
    return report


def _parallel(sites: list[Site], jobs: int, first: RankPool, pool: Callable[[], RankPool],
              one: Callable[[RankPool, Site], Row], stopping: threading.Event,
              log: Log) -> dict[Site, Row]:
    """``one`` per site on ``jobs`` workers, each with its own pool (the first
    reuses ``first``). Ctrl-C stops them all and keeps the rows already done."""
    todo: queue.Queue[Site] = queue.Queue()
    for s in sites:
        todo.put(s)
    rows: dict[Site, Row] = {}
    errors: list[BaseException] = []

    def work(mine: RankPool | None) -> None:
        p = mine
        try:
            p = p or pool()
            while not stopping.is_set():
                try:
                    site = todo.get_nowait()
                except queue.Empty:
                    return
                row = one(p, site)
                if not stopping.is_set() or row.verdict == "caught":
                    rows[site] = row
                    log(_line(row))
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
            stopping.set()
        finally:
            if mine is None and p is not None:
                p.close()

    workers = [threading.Thread(target=work, args=(first if i == 0 else None,),
                                name=f"mutate-{i}") for i in range(jobs)]
    for w in workers:
        w.start()
    try:
        for w in workers:
            while w.is_alive():
                w.join(0.5)
    except KeyboardInterrupt:
        stopping.set()
        for w in workers:
            w.join()
    if errors:
        raise errors[0]
    return rows


def _mutant(fuzz: Callable[..., driver.CampaignResult], pool: RankPool, target: str,
            site: Site, hits: Path, corpus_dir: Path | None) -> Row:
    name = mutated.name(target, site)
    res = fuzz(pool, name, corpus_dir)
    row = Row(site=site, mutant=name, examples=res.examples, seconds=round(res.elapsed_s, 2))
    if res.failure is None:
        row.reached = (hits / mutated.hit_file(name)).exists()
        return row
    row.verdict = "caught"
    row.kind = res.failure.kind
    row.first_failure = res.first_failure_examples
    row.message = res.failure.message
    row.shrunk = res.scenario.describe() if res.scenario is not None else None
    row.corpus_path = str(res.corpus_path) if res.corpus_path else None
    row.flaky = res.flaky
    return row


def _line(row: Row) -> str:
    if row.verdict == "caught":
        return (f"  {row.site.where} {row.site.call}: caught {row.kind} after "
                f"{row.first_failure} examples")
    return f"  {row.site.where} {row.site.call}: survived {row.examples} examples"


def _explain(report: Report) -> None:
    src = mutated.source_of(report.target)
    nodes = sync_sites.scope(src.tree, src.root)
    for row in report.rows:
        if row.verdict == "survived":
            row.why = _why(report, row, sync_sites.twin(nodes, row.site))


def _why(report: Report, row: Row, twin: int | None) -> str:
    """A survivor is redundant, or the tool says it cannot tell and what would."""
    if twin is not None:
        return (f"redundant under this protocol: line {twin} makes the same call with "
                "nothing between that this one could order")
    gpu = (f"`python -m streamfuzz mutate --target {report.target} --device cuda --oracle all "
           f"--site {row.site.line}` (gates; value, lifetime and reuse oracles)")
    if row.reached is False:
        return (f"cannot tell: no example ran this line in {row.examples} (a branch the "
                "harness never takes); only a scenario or platform that runs it can say "
                "whether it is needed")
    seen = "/".join(report.oracles)
    if row.site.rule == "stream context":
        return (f"cannot tell, though likely redundant for safety: ran in {row.examples} "
                "examples; without the context its body runs on the enclosing stream, in "
                "program order with it, which removes overlap rather than ordering. It would "
                "matter only where another stream consumes the body's work through a sync "
                f"the oracle does not see. A GPU run with gates separates the two: {gpu}")
    if report.device == "cuda":
        return (f"cannot tell: ran in {row.examples} examples on the GPU and no {seen} "
                "oracle saw a failure; either another sync orders the same work (redundant "
                "here) or the hazard is one no oracle models; more examples, or a scenario "
                "that holds the streams where this sync matters, would separate the two")
    return (f"cannot tell: ran in {row.examples} examples and the {seen} oracle found every "
            "use ordered without it; either another sync orders the same work (redundant "
            "here) or the hazard is outside what the oracle models (host reads, memory "
            f"outside the torch dispatcher). A GPU run with gates separates the two: {gpu}")
