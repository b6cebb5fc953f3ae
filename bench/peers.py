"""streamfuzz beside what a user would pick instead, on one GPU: ``make bench-peers``.

Every built-in target and mutant of every protocol, vLLM's targets where a
wheel of theirs is cached, and the correct versions, each on the same
scenarios (its corpus entries, then a fixed list drawn once from the
protocol's strategy with ``--seed``), under each checker:

* ``none``: the hand loop alone, value oracle only, holds left out: the baseline
  each row's time is compared with;
* ``streamfuzz``: every oracle, gates (a clean example whose gate timed out
  runs once more, as the driver does);
* ``csan``: PyTorch's CUDA Sanitizer, enabled first thing in a fresh process,
  over the baseline's loop; only its ``CUDASanitizerErrors`` count as found;
* ``memcheck``, ``racecheck``: compute-sanitizer over the baseline's loop on
  the first ``--sanitizer-examples`` scenarios, where the binary is on the node;
  only its error and hazard counts count as found;
* ``stress``: the scenario's own sleeps and allocations, sleeps spun
  (``torch.cuda._sleep``), value oracle, each scenario ``--reps`` times: a
  value mismatch or a crash is found.

World size 1 (NCCL takes one rank per GPU): only the sending role runs, so a
mutant whose bug is on the receiving side is listed, not run. Each target's
checkers run in child processes (CSAN cannot be turned off once on, and a
device-side assert poisons its process); a cell that raises or dies is that
cell's result and the bench goes on. ``--budget`` bounds the whole run:
rounds of checkers share it, and what did not fit is listed as not run.
Results land in ``--out`` as they come (``peers.jsonl``, one line a cell;
``peers.json`` and ``peers.md`` rewritten after each process), so a kill
keeps what was measured.

    PYTHONPATH=. python bench/peers.py --out reports/peers

On a machine without a GPU it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import _script  # bench/_script.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
CHECKERS = {
    "none": "the hand loop, value oracle only, no holds (the baseline)",
    "streamfuzz": "every oracle, gates",
    "csan": "PyTorch's CUDA Sanitizer over the baseline's loop",
    "memcheck": "compute-sanitizer --tool memcheck over the baseline's loop",
    "racecheck": "compute-sanitizer --tool racecheck over the baseline's loop",
    "stress": "the scenario's sleeps spun and its allocations, value oracle, --reps times",
}
ROUNDS = ((("none", "streamfuzz", "stress"), 0.45), (("csan",), 0.25), (("memcheck",), 0.15),
          (("racecheck",), 0.15))
"""Checkers that share a process, and their share of the budget left when the round starts."""
SANITIZERS = ("memcheck", "racecheck")
WITH_VALUES = ("none", "streamfuzz", "stress")
"""Checkers whose finding includes the value oracle's and a crash; the others
report only their own (the value oracle's count is kept beside it)."""
NO_GPU = "bench-peers: no CUDA GPU here; CSAN, compute-sanitizer and the stress test need one"
MARK = "PEERS "
"""Prefix of the lines a worker prints for the bench among everything else."""
GRACE_S = 8.0
"""A worker stops its loops this long before it is killed: time to print and exit."""
RESERVE_S = 5.0
"""Kept at the end of the budget for the final table."""
MIN_SLOT_S = 30.0
"""The least a target's cell is given (a worker's start alone, torch and NCCL, is a few seconds)."""


@dataclass
class Target:
    """One row group: what runs, on which scenarios, and what it should be found to be."""

    name: str
    protocol: str
    truth: str
    """``bug``, ``correct``, ``unknown``, or ``receiver`` (a bug world size 1 cannot run)."""
    note: str = ""
    scenarios: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


# -- what runs -------------------------------------------------------------------
def drawn(protocol: Any, n: int, seed: int) -> list[Any]:
    """``n`` scenarios of world size 1 from the protocol's strategy, the same for a seed."""
    import hypothesis
    from hypothesis import HealthCheck, Phase

    out: list[Any] = []

    @hypothesis.seed(seed)
    @hypothesis.settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
                         suppress_health_check=list(HealthCheck))
    @hypothesis.given(protocol.part("strategy")(world_size=1))
    def collect(scenario: Any) -> None:
        out.append(scenario)

    collect()
    return out[:n]


def corpus_scenarios(corpus: Path, name: str, protocol: Any) -> list[tuple[str, Any]]:
    """The target's corpus entries of its protocol, as scenarios of world size 1."""
    from streamfuzz.fuzz import corpus as corpus_mod

    folder = corpus / corpus_mod.target_dir(name)
    out = []
    for path in corpus_mod.discover([folder]) if folder.is_dir() else []:
        entry = corpus_mod.load(path)
        if entry.protocol == protocol.name:
            out.append((f"corpus {path.stem}", dataclasses.replace(entry.scenario, world_size=1)))
    return out


def upstream_names() -> tuple[list[str], list[str]]:
    """vLLM's targets for every version found (cache, ``STREAMFUZZ_UPSTREAM``, an
    installed vllm), and notes on what was not found or not usable."""
    from streamfuzz.fuzz import targets, upstream

    sources = [p for p in os.environ.get(upstream.ENV_PATHS, "").split(os.pathsep) if p]
    cache = upstream.cache_dir()
    if cache.is_dir():
        sources += sorted(str(p) for p in [*cache.glob("vllm-*.whl"), *cache.glob("vllm-*.tar.gz")])
    versions, notes = [], []
    for src in sources:
        try:
            versions.append(upstream.read(src).version)
        except upstream.UpstreamError as exc:
            notes.append(f"vLLM source skipped: {exc}")
    try:
        up = upstream.installed()
        if up is not None:
            versions.append(up.version)
    except upstream.UpstreamError as exc:
        notes.append(f"installed vllm skipped: {exc}")
    if not versions:
        notes.append("vLLM's targets not run: no vLLM wheel in the cache "
                     f"({upstream.fetch_hint('X')})")
    names = []
    for v in dict.fromkeys(versions):
        for family in (*targets.UPSTREAM, targets.WEIGHTS_FAMILY):
            name = f"{family}@{v}"
            try:
                targets.provenance(name)
                names.append(name)
            except Exception as exc:  # a version without that file, or one it cannot read
                notes.append(f"{name} not run: {exc}")
    return names, notes


def truth(name: str, protocol: Any, corpus_entries: int) -> tuple[str, str]:
    """What the target is known to be at world size 1, and why."""
    from streamfuzz.fuzz import targets

    if name in targets.CORRECT or name == targets.UPSTREAM_FIXED:
        return "correct", "correct"
    if name in protocol.receiver_side:
        return "receiver", "its bug is on the receiving side: world size 1 has no receiver"
    if name in protocol.versions or name in protocol.mutants:
        return "bug", "a built-in bug"
    if corpus_entries:
        return "bug", f"{corpus_entries} corpus entries found on it"
    return "unknown", "no ground truth"


def plan(names: list[str] | None, corpus: Path, examples: int,
         seed: int) -> tuple[list[Target], list[str]]:
    """The targets in the order they run: each protocol's versions, vLLM's,
    then the variants and mutants (the budget reaches the first ones first)."""
    from streamfuzz.fuzz import protocol as protocols
    from streamfuzz.fuzz import targets

    notes: list[str] = []
    if names is None:
        every = list(protocols.all_protocols().values())
        up, notes = upstream_names()
        names = [*(n for p in every for n in p.versions), *up,
                 *(n for p in every for n in (*p.variants, *p.mutants))]
    draws: dict[str, list[Any]] = {}
    out = []
    for name in names:
        protocol = targets.protocol_of(name)
        if protocol.name not in draws:
            draws[protocol.name] = drawn(protocol, examples, seed)
        entries = corpus_scenarios(corpus, name, protocol)
        known, why = truth(name, protocol, len(entries))
        scenarios = entries + [(f"drawn {i + 1}", s) for i, s in enumerate(draws[protocol.name])]
        out.append(Target(name, protocol.name, known, why,
                          [(label, s.to_dict()) for label, s in scenarios]))
    return out, notes


def without_holds(obj: Any) -> Any:
    """A scenario with every hold (a step's ``delays``, a sync's ``holds``) left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{
            f.name: () if f.name in ("delays", "holds") else without_holds(getattr(obj, f.name))
            for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple):
        return tuple(without_holds(x) for x in obj)
    return obj


def sanitizer_binary() -> str | None:
    """compute-sanitizer on PATH, else the newest under /usr/local/cuda*/bin."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))
    return candidates[-1] if candidates else None


# -- a worker: one target's checkers in one process --------------------------------
def _emit(**fields: Any) -> None:
    print(MARK + json.dumps(fields), flush=True)


def worker(job_file: str) -> NoReturn:
    """Run one target's checkers in turn, printing a line per example and per
    result; exits at once after a crash (a CUDA context may be dead)."""
    job = json.loads(Path(job_file).read_text())
    if "csan" in job["checkers"]:  # before anything touches CUDA
        from torch.cuda import _sanitizer

        _sanitizer.enable_cuda_sanitizer()
    import torch

    from streamfuzz.fuzz import protocol as protocols
    from streamfuzz.fuzz import targets
    from streamfuzz.fuzz.streams import CudaStreams, SimStreams

    start = time.perf_counter()
    device, group, gates, gate_kind = _script.one_rank_group(
        job["device"], gates_wanted="streamfuzz" in job["checkers"])
    protocol = protocols.get(job["protocol"])
    kind = protocol.part("scenario")
    scenarios = [(label, kind.from_dict(d)) for label, d in job["scenarios"]]
    factory = targets.load(job["target"])

    def env(with_gates: bool) -> Any:
        from streamfuzz.fuzz.protocol import RankEnv

        streams = (CudaStreams(device, gates if with_gates else None)
                   if device.type == "cuda" else SimStreams())
        return RankEnv(rank=0, world_size=1, device=device, group=group, streams=streams)

    if job["warm"]:
        _warm(protocol, scenarios[0][1], env, "streamfuzz" in job["checkers"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    _emit(event="ready", start_s=round(time.perf_counter() - start, 3), gates=gate_kind,
          device_name=name)
    checkers = job["checkers"]
    for i, checker in enumerate(checkers):
        deadline = time.perf_counter() + (job["deadline"] - time.time()) / (len(checkers) - i)
        _emit(event="start", checker=checker)
        result = _loop(checker, scenarios, factory, protocol, env, job["reps"], deadline)
        _emit(event="result", **result)
        if result.pop("fatal"):
            os._exit(3)
    os._exit(0)  # not the interpreter's exit: a process group's teardown can block


def _warm(protocol: Any, scenario: Any, env: Any, gated: bool) -> None:
    """The correct version once per option set, untimed: first launches of the
    kernels (each would otherwise hold a gate to its bound) and imports."""
    from streamfuzz.fuzz import targets
    from streamfuzz.fuzz.dispatch_mode import warm
    from streamfuzz.fuzz.options import Hold, Oracle, RunOptions

    correct = targets.load(protocol.correct)
    warm(env(False).device)
    sets = [(RunOptions(oracles={Oracle.VALUE}, hold=Hold.SPIN), False)]
    for options, with_gates in sets + ([(RunOptions(), True)] if gated else []):
        try:
            protocol.part("run")(scenario, correct, env(with_gates), options)
        except Exception as exc:  # a warm-up only saves time; the loops will say more
            _emit(event="warm-failed", error=f"{type(exc).__name__}: {exc}"[:300])


def _loop(checker: str, scenarios: list[tuple[str, Any]], factory: Any, protocol: Any,
          env: Any, reps: int, deadline: float) -> dict[str, Any]:
    """One checker over the scenarios (each ``reps`` times for ``stress``)."""
    from streamfuzz.fuzz.options import Hold, Oracle, RunOptions

    run, values = protocol.part("run"), protocol.part("values")
    gated = checker == "streamfuzz"
    options = RunOptions() if gated else RunOptions(
        oracles={Oracle.VALUE}, hold=Hold.SPIN)
    plain = checker not in ("streamfuzz", "stress")
    caught: tuple[type[BaseException], ...] = ()
    if checker == "csan":
        from torch.cuda._sanitizer import CUDASanitizerErrors

        caught = (CUDASanitizerErrors,)
    res: dict[str, Any] = {"checker": checker, "examples": 0, "found": 0, "first": None,
                           "first_scenario": None, "kind": None, "message": None, "value": 0,
                           "wall_s": 0.0, "cut": None, "error": None, "fatal": False}
    for label, scenario in scenarios:
        scenario = without_holds(scenario) if plain else scenario
        for _ in range(reps if checker == "stress" else 1):
            if time.perf_counter() >= deadline:
                res["cut"] = "time"
                return res
            res["examples"] += 1
            _emit(event="example", checker=checker, i=res["examples"])
            own: list[tuple[str, str]] = []
            wrong: list[Any] = []
            t0 = time.perf_counter()
            try:
                obs = run(scenario, factory, env(gated), options)
                if gated and not obs.findings and "gate-timeout" in obs.held:
                    obs = run(scenario, factory, env(gated), options)  # as the driver does
                own = [(f.kind, f.message) for f in obs.findings]
                wrong = values(scenario, [obs])
            except caught as exc:
                detail = str(exc.errors[0]) if getattr(exc, "errors", None) else str(exc)
                own = [("csan", detail)]
            except Exception as exc:  # the target raised or its CUDA context died
                text = f"{type(exc).__name__}: {exc}"
                res["fatal"] = True
                if checker in WITH_VALUES:
                    own = [("crash", text)]
                else:
                    res["error"] = f"crashed at example {res['examples']}: {text}"[:400]
            res["wall_s"] += time.perf_counter() - t0
            res["value"] += bool(wrong)
            hits = own + ([(f.kind, f.message) for f in wrong] if checker in WITH_VALUES else [])
            if hits:
                res["found"] += 1
                if res["first"] is None:
                    res.update(first=res["examples"], first_scenario=label, kind=hits[0][0],
                               message=" ".join(hits[0][1].split())[:300])
            if res["fatal"]:
                return res
    return res


# -- the parent: processes, bounds, results ------------------------------------------
def _event(line: str) -> dict[str, Any] | None:
    if not line.startswith(MARK):
        return None
    try:
        return json.loads(line[len(MARK):])
    except json.JSONDecodeError:
        return None  # a line cut short by a kill


def _events(text: str) -> list[dict[str, Any]]:
    return [e for e in map(_event, text.splitlines()) if e is not None]


_REPORT = re.compile(r"=+ \S")
"""The first line of a report (its later lines are indented under the ``=`` run)."""
_BANNER = re.compile(r"=+ (COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|"
                     r"Target application returned|\s*$)")


def sanitizer_verdict(text: str) -> dict[str, Any]:
    """compute-sanitizer's counts from a log, and the example running at its
    first report (the worker's last example line before it). Reports made
    before the first example are the process's own start (NCCL's, the
    driver's, the same for every target): counted apart, never a finding."""
    errors = sum(int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text))
    hazards = sum(int(n) for n in re.findall(r"RACECHECK SUMMARY: (\d+) hazard", text))
    example, first, message, at_start, during = 0, None, None, 0, 0
    for line in text.splitlines():
        if line.startswith(MARK):
            ev = _event(line) or {}
            if ev.get("event") == "example":
                example = ev["i"]
        elif _REPORT.match(line) and not _BANNER.match(line):
            if not example:
                at_start += 1
                continue
            during += 1
            if first is None:
                first, message = example, line.strip("= ").strip()
    found = errors + hazards if not at_start else during
    summary = (f"ERROR SUMMARY {errors}" if "ERROR SUMMARY" in text else "no summary printed") + (
        f", RACECHECK SUMMARY {hazards} hazards" if "RACECHECK SUMMARY" in text else "") + (
        f"; {at_start} report(s) before the first example, not counted" if at_start else "")
    return {"tool_errors": found, "summary": summary, "first": first if found else None,
            "message": message if found else None}


def run_process(job: dict[str, Any], out: Path, stem: str, timeout_s: float,
                prefix: list[str]) -> tuple[list[dict[str, Any]], str, int | None]:
    """One worker under ``prefix`` (a sanitizer's command, or nothing): its
    events, its log, its exit status (None: killed at ``timeout_s``)."""
    jobs, logs = out / "jobs", out / "logs"
    jobs.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    (jobs / f"{stem}.json").write_text(json.dumps(job))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [*prefix, sys.executable, str(Path(__file__).resolve()), "--worker",
           str(jobs / f"{stem}.json")]
    log = logs / f"{stem}.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout_s))
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
            if sys.exc_info()[0] is not subprocess.TimeoutExpired:
                raise
    text = log.read_text(errors="replace")
    return _events(text), text, rc


def settle(checkers: list[str], events: list[dict[str, Any]], text: str, rc: int | None,
           sanitizer: str | None = None) -> list[dict[str, Any]]:
    """The results of one process: those it printed, and for a checker it
    started but never finished, what its death says (a crash is a finding
    where the checker counts crashes, else the cell's error)."""
    results = {e["checker"]: e for e in events if e.get("event") == "result"}
    started = [e["checker"] for e in events if e.get("event") == "start"]
    ran = [e["i"] for e in events if e.get("event") == "example"]
    tail = " | ".join(line for line in text.splitlines()[-6:] if not line.startswith(MARK))
    out = []
    for checker in checkers:
        res = results.get(checker)
        if res is None and checker in started:
            n = ran[-1] if ran and started[-1] == checker else 0
            why = (f"killed at its bound after {n} examples" if rc is None
                   else f"the process died (exit {rc}) at example {n}: {tail}"[:400])
            res = {"checker": checker, "examples": n, "found": 0, "first": None, "value": 0,
                   "wall_s": None, "cut": "killed" if rc is None else None, "error": why}
            if rc is not None and checker in WITH_VALUES and n:
                res.update(found=1, first=n, kind="crash", message=why, error=None)
        elif res is None:
            if started:
                continue  # left for the next process
            res = {"checker": checker, "examples": 0, "error": (
                "killed before it started" if rc is None else
                f"the process did not start (exit {rc}): {tail}"[:400])}
        res.pop("event", None)
        res.pop("fatal", None)
        if sanitizer is not None:
            tool = sanitizer_verdict(text)
            res.update(checker=sanitizer, found=int(tool["tool_errors"] > 0),
                       first=tool["first"], kind=sanitizer if tool["tool_errors"] else None,
                       message=tool["message"], summary=tool["summary"])
        out.append(res)
    return out


class Bench:
    """The run: targets by rounds of checkers, inside one budget; every result
    written as it comes."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device = args, device
        self.end = time.time() + args.budget - RESERVE_S
        self.cells: list[dict[str, Any]] = []
        self.report: dict[str, Any] = {}

    def run(self, targets_: list[Target], notes: list[str]) -> dict[str, Any]:
        args = self.args
        tool = sanitizer_binary() if self.device == "cuda" else None
        self.report = {"device": self.device, "device_name": None,
                       "torch": _torch_version(), "python": platform.python_version(),
                       "code": _commit(), "date": time.strftime("%Y-%m-%d"),
                       "args": {k: str(v) for k, v in vars(args).items() if k != "worker"},
                       "sanitizer": tool, "notes": notes,
                       "targets": [{"name": t.name, "protocol": t.protocol, "truth": t.truth,
                                    "note": t.note, "scenarios": len(t.scenarios)}
                                   for t in targets_],
                       "cells": self.cells}
        runnable = [t for t in targets_ if t.truth != "receiver"]
        rounds = [(tuple(c for c in cs if c in args.checkers), share) for cs, share in ROUNDS]
        rounds = [(cs, share) for cs, share in rounds if cs]
        if tool is None:
            notes.append("memcheck, racecheck: not on this node (no compute-sanitizer on PATH "
                         "or under /usr/local/cuda*/bin)")
            rounds = [(cs, share) for cs, share in rounds if cs[0] not in SANITIZERS]
        for r, (checkers, share) in enumerate(rounds):
            left = self.end - time.time()
            round_end = time.time() + left * share / sum(s for _, s in rounds[r:])
            for i, t in enumerate(runnable):
                # Each target at least MIN_SLOT_S, the first ones first: a cell
                # that finishes early leaves its time to the next ones.
                left_now = round_end - time.time()
                slot = min(left_now, max(MIN_SLOT_S, left_now / (len(runnable) - i)))
                if checkers[0] in SANITIZERS:
                    slot = min(args.sanitizer_s, left_now)
                if slot < 2 * GRACE_S:
                    self._add([{"checker": c, "skipped": "budget"} for c in checkers], t)
                    continue
                self._target(t, list(checkers), slot, tool)
        self._write()
        return self.report

    def _target(self, t: Target, checkers: list[str], slot: float, tool: str | None) -> None:
        sanitizer = checkers[0] if checkers[0] in SANITIZERS else None
        scenarios = t.scenarios[:self.args.sanitizer_examples] if sanitizer else t.scenarios
        prefix = [tool, "--tool", sanitizer, "--print-limit", "50"] if sanitizer else []
        todo, end = checkers, time.time() + slot
        while todo and end - time.time() > 2 * GRACE_S:
            left = end - time.time()
            job = {"device": self.device, "target": t.name, "protocol": t.protocol,
                   "checkers": ["none"] if sanitizer else todo, "scenarios": scenarios,
                   "reps": self.args.reps, "warm": sanitizer is None,
                   "deadline": time.time() + left - GRACE_S}
            stem = f"{_stem(t.name)}.{sanitizer or '+'.join(todo)}"
            events, text, rc = run_process(job, self.args.out, stem, left, prefix)
            ready = [e for e in events if e.get("event") == "ready"]
            if ready and not self.report["device_name"]:  # the parent never starts CUDA
                self.report["device_name"] = ready[0].get("device_name")
            results = settle(job["checkers"], events, text, rc, sanitizer)
            self._add(results, t)
            done = {r["checker"] for r in results}
            todo = [c for c in todo if c not in done]
            if not any(e.get("event") == "start" for e in events):
                break  # it did not get as far as a checker: another try would not either
        self._add([{"checker": c, "skipped": "budget"} for c in todo], t)

    def _add(self, results: list[dict[str, Any]], t: Target) -> None:
        with (self.args.out / "peers.jsonl").open("a") as fh:
            for res in results:
                res = {"target": t.name, "truth": t.truth, **res}
                self.cells.append(res)
                fh.write(json.dumps(res) + "\n")
        if results:
            self._write()

    def _write(self) -> None:
        from streamfuzz.fuzz.corpus import write_json_atomic, write_text_atomic

        write_json_atomic(self.args.out / "peers.json", self.report)
        write_text_atomic(self.args.out / "peers.md", markdown(self.report) + "\n")


def _stem(name: str) -> str:
    from streamfuzz.fuzz.corpus import target_dir

    return target_dir(name)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# -- the table -----------------------------------------------------------------------
def verdict(truth: str, cell: dict[str, Any]) -> str:
    """found / missed / false positive / clean, or why there is no verdict."""
    if cell.get("skipped"):
        return f"not run ({cell['skipped']})"
    hit = (cell.get("found") or 0) > 0
    if not hit and cell.get("error"):
        return "error"
    if not hit and not cell.get("examples"):
        return f"not run ({cell.get('cut') or 'no examples'})"
    if truth == "bug":
        return "found" if hit else "missed"
    if truth == "correct":
        return "false positive" if hit else "clean"
    return "found (no ground truth)" if hit else "clean (no ground truth)"


def ms_per_example(cell: dict[str, Any]) -> float | None:
    n, wall = cell.get("examples") or 0, cell.get("wall_s")
    return 1000 * wall / n if n and wall is not None else None


def rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per (target, checker), in run order; a receiver-side target
    gets one row that says why it did not run."""
    by_target: dict[str, list[dict[str, Any]]] = {}
    for cell in report["cells"]:
        by_target.setdefault(cell["target"], []).append(cell)
    out = []
    for t in report["targets"]:
        if t["truth"] == "receiver":
            out.append([t["name"], "-", "not run", "-", "-", "-", "-", t["note"]])
            continue
        cells = by_target.get(t["name"], [])
        base = next((ms_per_example(c) for c in cells if c["checker"] == "none"
                     and not c.get("skipped")), None)
        order = {c: i for i, c in enumerate(CHECKERS)}
        for c in sorted(cells, key=lambda c: order.get(c["checker"], len(order))):
            ms = ms_per_example(c)
            unit = " reps" if c["checker"] == "stress" else ""
            cut = f" (cut: {c['cut']})" if c.get("cut") else ""
            ran = f"{c.get('examples') or 0}{unit}{cut}"
            first = c.get("first")
            note = c.get("error") or (f"{c.get('kind')}: {c.get('message')}" if first else "")
            if c["checker"] not in WITH_VALUES and c.get("value"):
                note = f"{note}; value oracle: {c['value']} wrong".lstrip("; ")
            if c.get("summary"):
                note = f"{c['summary']}; {note}".rstrip("; ")
            out.append([t["name"], c["checker"], verdict(t["truth"], c),
                        "-" if first is None else str(first) if first else "at start",
                        "-" if c.get("skipped") else ran,
                        "-" if ms is None else f"{ms:.2f}",
                        "-" if ms is None or not base else f"{ms / base:.2f}",
                        note.replace("|", "/")[:160]])
    return out


def closing(report: dict[str, Any]) -> list[str]:
    """Where a peer found a bug that streamfuzz missed: each is a bug for streamfuzz."""
    lines = []
    table = rows(report)
    missed = {r[0] for r in table if r[1] == "streamfuzz" and r[2] == "missed"}
    for r in table:
        if r[0] in missed and r[1] != "streamfuzz" and r[2] == "found":
            lines.append(f"- {r[1]} found a bug in `{r[0]}` that streamfuzz missed: "
                         "a bug for streamfuzz.")
    return lines


def markdown(report: dict[str, Any]) -> str:
    head = ["target", "checker", "verdict", "to 1st finding", "run", "ms/example",
            "x none", "note"]
    lines = [f"# streamfuzz beside its peers: {report.get('device_name')} ({report.get('device')}),"
             f" torch {report.get('torch')}, code {report.get('code') or '?'},"
             f" {report.get('date')}", "",
             "World size 1. " + "; ".join(f"`{k}`: {v}" for k, v in CHECKERS.items()) + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    lines += ["", *(f"- {n}" for n in report.get("notes", []))]
    peers = closing(report)
    lines += ["", *(peers or ["- No peer found a bug that streamfuzz missed."])]
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------
class _BadArgs(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        raise _BadArgs(message)


def parse(argv: list[str] | None) -> argparse.Namespace | str:
    """The arguments, or the one line that says what is wrong with them
    (empty after ``--help``, which has printed its text)."""
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("reports/peers"))
    p.add_argument("--budget", type=float, default=420.0, help="seconds, the whole run")
    p.add_argument("--examples", type=int, default=20, help="scenarios drawn per protocol")
    p.add_argument("--seed", type=int, default=0, help="the draw's seed")
    p.add_argument("--reps", type=int, default=10, help="stress repetitions per scenario")
    p.add_argument("--sanitizer-examples", type=int, default=3)
    p.add_argument("--sanitizer-s", type=float, default=90.0,
                   help="bound of one compute-sanitizer process")
    p.add_argument("--targets", default=None, help="comma-separated (default: all)")
    p.add_argument("--checkers", default=",".join(CHECKERS), help="comma-separated")
    p.add_argument("--corpus", type=Path, default=ROOT / "corpus")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    try:
        args = p.parse_args(argv)
    except _BadArgs as exc:
        return str(exc)
    except SystemExit:  # --help
        return ""
    if args.worker:
        return args
    small = [n for n in ("examples", "reps", "sanitizer_examples") if getattr(args, n) < 1]
    if small:
        return f"--{small[0].replace('_', '-')} must be at least 1"
    if args.budget < 30 or args.sanitizer_s < 2 * GRACE_S:
        return "--budget must be at least 30 s and --sanitizer-s at least 16 s"
    args.checkers = [c.strip() for c in args.checkers.split(",") if c.strip()]
    bad = [c for c in args.checkers if c not in CHECKERS]
    if bad or not args.checkers:
        return f"unknown checker {bad[0] if bad else '(none)'}: use {', '.join(CHECKERS)}"
    if args.targets is not None:
        args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        from streamfuzz.fuzz import targets

        try:
            for name in args.targets:
                if "@" not in name:
                    targets.check_importable(name)
        except targets.TargetError as exc:
            return str(exc)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {args.out}: cannot be made ({exc.strerror})"
    return args


def _interrupted(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def bench(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The whole run on ``device``; the table printed and written. SIGTERM is
    Ctrl-C: the running process is killed, what was measured is on disk."""
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        (args.out / "peers.jsonl").write_text("")
        targets_, notes = plan(args.targets, args.corpus, args.examples, args.seed)
        report = Bench(args, device).run(targets_, notes)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(markdown(report))
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if isinstance(args, str):
        if args:
            print(f"bench-peers: {args}", file=sys.stderr)
        return 2 if args else 0
    if args.worker:
        worker(args.worker)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU)
        return 0
    try:
        bench(args, "cuda")
    except KeyboardInterrupt:
        print(f"bench-peers: interrupted; what was measured is in {args.out}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
