"""Test suites nobody here wrote, unchanged, under ``pytest --streamfuzz``.

Two steps, so that a GPU node with no network can run what this one fetched:

* ``fetch`` (network): each suite's sdist from PyPI (it ships its tests), and
  the wheels its tests need beyond torch, into ``--cache`` (default
  ``bench/.suites``, which git ignores), for every ``--python`` listed.
* ``run`` (offline): per suite, a virtual environment that sees the running
  interpreter's packages (torch included, never reinstalled) plus the suite's
  own, then the suite's chosen test files plainly, then under
  ``--streamfuzz --streamfuzz-device D``, optionally under pytest-xdist and
  under PyTorch's CUDA Sanitizer (``TORCH_CUDA_SANITIZER=1``, GPU only).
  Writes ``suites.json`` and ``suites.md`` to ``--out``.

    python bench/suites.py fetch
    python bench/suites.py run --device cpu --out reports/suites
    python bench/suites.py run --device cuda --csan --out reports/suites-gpu

Each count comes from the run's JUnit XML, where the plugin leaves each
test's outcome under the checker as the property ``streamfuzz``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Suite:
    """A released package whose sdist ships its tests, and the test files that
    reach its multi-stream or non_blocking-copy code."""

    name: str
    dist: str
    version: str
    module: str
    tests: tuple[str, ...]
    needs: tuple[str, ...] = ()
    """Requirements of its tests beyond torch, pytest and what the package's
    own metadata names (installed without torch: torch is the interpreter's)."""
    deselect: tuple[str, ...] = ()
    why: str = ""


SUITES = (
    Suite("accelerate", "accelerate", "1.15.0", "accelerate",
          ("tests/test_big_modeling.py", "tests/test_hooks.py", "tests/test_modeling_utils.py",
           "tests/test_offload.py", "tests/test_activation_checkpointing_offload.py",
           "tests/test_memory_utils.py", "tests/test_utils.py"),
          needs=("numpy", "packaging", "psutil", "pyyaml", "safetensors", "huggingface_hub<2",
                 "transformers==5.23.0", "parameterized"),
          why="CPU/disk offload hooks and send_to_device(non_blocking), activation "
              "offload to pinned memory"),
    Suite("pytorch-ignite", "pytorch_ignite", "0.5.5", "ignite",
          ("tests/ignite/engine",),
          needs=("packaging",),
          why="supervised trainers and evaluators that copy batches with non_blocking=True"),
    Suite("timm", "timm", "1.0.31", "timm",
          ("tests/test_data.py", "tests/test_multilabel.py", "tests/test_scheduled_sampler.py"),
          needs=("pyyaml", "huggingface_hub", "safetensors", "pillow", "numpy", "torchvision"),
          why="PrefetchLoader: host-to-device copies on a side stream, consumer waits"),
)

_BACKENDS = ("setuptools", "wheel", "hatchling", "pdm-backend")
"""Build backends of the sdists, fetched so that they build offline."""
_PYTHONS = ("3.11", "3.12", "3.13")  # transformers 5 needs 3.11
_TORCHVISION = "torchvision"
"""Installed only where the interpreter lacks it, at the release of its torch."""


def _torchvision_for(torch_version: str) -> str:
    """torchvision's release for a torch release (2.N pairs with 0.N+15)."""
    major, minor = torch_version.split("+")[0].split(".")[:2]
    if major != "2":
        raise SystemExit(f"suites: no torchvision pairing known for torch {torch_version}")
    return f"0.{int(minor) + 15}.0"


def _pip(python: str | Path, *args: str, quiet: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(python), "-m", "pip", *(("-q",) if quiet else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def fetch(cache: Path, pythons: tuple[str, ...], torches: tuple[str, ...]) -> int:
    src, wheels = cache / "src", cache / "wheels"
    src.mkdir(parents=True, exist_ok=True)
    wheels.mkdir(parents=True, exist_ok=True)
    failed = 0
    for suite in SUITES:
        if not list(src.glob(f"{suite.dist}-{suite.version}.tar.gz")):
            done = _pip(sys.executable, "download", "--no-deps", "--no-binary", ":all:",
                        "-d", str(src), f"{suite.name}=={suite.version}")
            print(f"fetch: {suite.name} {suite.version} sdist: "
                  f"{'ok' if done.returncode == 0 else done.stderr.strip().splitlines()[-1]}")
            failed += done.returncode != 0
        needs = [n for n in suite.needs if n != _TORCHVISION]
        for py in pythons:
            done = _pip(sys.executable, "download", "--only-binary", ":all:", "--python-version",
                        py, "-d", str(wheels), *needs, *_BACKENDS)
            if done.returncode != 0:
                print(f"fetch: {suite.name} wheels for python {py}: "
                      f"{done.stderr.strip().splitlines()[-1]}")
                failed += 1
        if _TORCHVISION in suite.needs:
            for tv in sorted({_torchvision_for(t) for t in torches}):
                for py in pythons:
                    done = _pip(sys.executable, "download", "--no-deps", "--only-binary", ":all:",
                                "--python-version", py, "-d", str(wheels), f"torchvision=={tv}")
                    if done.returncode != 0:
                        print(f"fetch: torchvision {tv} for python {py}: not on the index")
    print(f"fetch: {cache} holds {len(list(src.iterdir()))} sdists and "
          f"{len(list(wheels.iterdir()))} wheels")
    return 1 if failed else 0


def _venv(cache: Path, suite: Suite) -> tuple[Path, str]:
    """A suite's environment: the running interpreter's packages through a
    ``.pth`` (as the Makefile's GPU bootstrap does), the suite's own on top.
    The second value is why it cannot run here, or empty."""
    import site

    home = cache / "venv" / suite.name
    python = home / "bin" / "python"
    stamp = home / ".ready"
    if stamp.exists():
        return python, stamp.read_text()
    shutil.rmtree(home, ignore_errors=True)
    # pip comes from the interpreter's own packages, through the .pth below: a GPU
    # node's python may have no ensurepip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dirs = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    Path(purelib, "_suites_parent.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    offline = ("--no-index", "--find-links", str(cache / "wheels"))
    needs = [n for n in suite.needs if n != _TORCHVISION]
    steps = [("install", *offline, *needs),
             ("install", *offline, "--no-deps", str(_sdist(cache, suite)))]
    if _TORCHVISION in suite.needs and _imports(python, "torchvision") is not None:
        torch_version = _imports(python, "torch", "print(torch.__version__)") or ""
        steps.append(("install", *offline, "--no-deps",
                      f"torchvision=={_torchvision_for(torch_version)}"))
    why = ""
    for step in steps:
        done = _pip(python, *step)
        if done.returncode != 0:
            why = f"pip {' '.join(step[:1] + step[3:])}: {done.stderr.strip().splitlines()[-1]}"
            break
    else:
        error = _imports(python, suite.module)
        if error is not None:
            why = f"import {suite.module}: {error}"
    stamp.write_text(why)
    return python, why


def _imports(python: Path, module: str, then: str = "") -> str | None:
    """The last line of the error importing ``module`` (None: it imports), or
    what ``then`` prints."""
    done = subprocess.run([str(python), "-c", f"import {module}\n{then}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit {done.returncode}"
    return done.stdout.strip() if then else None


def _sdist(cache: Path, suite: Suite) -> Path:
    return cache / "src" / f"{suite.dist}-{suite.version}.tar.gz"


def _tree(cache: Path, suite: Suite) -> Path:
    """The sdist unpacked, fresh for each run so no run sees another's files."""
    tree = cache / "tree" / f"{suite.dist}-{suite.version}"
    shutil.rmtree(tree, ignore_errors=True)
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(_sdist(cache, suite)) as archive:
        archive.extractall(tree.parent, filter="data")
    return tree


@dataclass
class Outcome:
    """One pytest run of a suite, counted from its JUnit XML."""

    args: list[str]
    wall_s: float
    exit: int
    tests: dict[str, dict[str, str]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        n = {"collected": len(self.tests), "run": 0, "passed": 0, "finding": 0,
             "not_simulated": 0, "csan": 0, "failed_otherwise": 0, "skipped": 0}
        for test in self.tests.values():
            kind = test["kind"]
            n[kind] += 1
            n["run"] += kind in _RAN
        return n


def _read_junit(path: Path) -> dict[str, dict[str, str]]:
    tests: dict[str, dict[str, str]] = {}
    if not path.exists():
        return tests
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        props = {p.get("name"): p.get("value", "") for p in case.iter("property")}
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        message = ""
        if bad is not None:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            message = (bad.get("message") or "").splitlines()[0][:300] if bad.get("message") else ""
            if props.get("streamfuzz") == "finding":
                kind = "finding"
            elif "CUDASanitizerErrors" in text or "CSAN detected" in text:
                kind = "csan"
            else:
                kind = "failed_otherwise"
        elif skip is not None:
            message = (skip.get("message") or "")[:300]
            kind = "not_simulated" if "not simulated: " in message else "skipped"
        else:
            kind = "passed"
        tests[test_id] = {"kind": kind, "message": message}
    return tests


def _config(tree: Path, out: Path) -> Path:
    """The suite's own pytest configuration, or an empty one: the tree lies
    inside this repository, whose configuration must not apply to it."""
    for name, section in (("pytest.ini", ""), ("pyproject.toml", "[tool.pytest.ini_options]"),
                          ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]")):
        path = tree / name
        if path.exists() and section in path.read_text():
            return path
    empty = out / "empty-pytest.ini"
    empty.write_text("[pytest]\n")
    return empty


def _pytest(python: Path, tree: Path, suite: Suite, extra: list[str], out: Path, tag: str,
            timeout: float, env: dict[str, str] | None = None) -> None:
    junit = out / f"{suite.name}-{tag}.xml"
    log = out / f"{suite.name}-{tag}.log"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}",
            "--rootdir", str(tree), "-c", str(_config(tree, out)),
            *[f"--deselect={d}" for d in suite.deselect], *extra, *suite.tests]
    start = time.perf_counter()
    with open(log, "w") as sink:
        try:
            rc = subprocess.run([str(python), *args], cwd=tree, stdout=sink,
                                stderr=subprocess.STDOUT, timeout=timeout,
                                env={**os.environ, **(env or {})}).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.perf_counter() - start
    print(f"run: {suite.name} {tag}: exit {rc} in {wall:.0f} s", flush=True)
    (out / f"{suite.name}-{tag}.run.json").write_text(
        json.dumps({"args": args[2:], "wall_s": round(wall, 1), "exit": rc}))


def run(cache: Path, out: Path, names: list[str], device: str, xdist_suite: str | None,
        csan: bool, timeout: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    flag = ["--streamfuzz", "--streamfuzz-device", device]
    (out / "device.txt").write_text(device)
    for suite in SUITES:
        if names and suite.name not in names:
            continue
        python, why = _venv(cache, suite)
        (out / f"{suite.name}.cannot.txt").unlink(missing_ok=True)
        if why:
            print(f"run: {suite.name}: cannot run here: {why}")
            (out / f"{suite.name}.cannot.txt").write_text(why)
            continue
        _pytest(python, _tree(cache, suite), suite, [], out, "plain", timeout)
        _pytest(python, _tree(cache, suite), suite, flag, out, "streamfuzz", timeout)
        if suite.name == xdist_suite:
            _pytest(python, _tree(cache, suite), suite, [*flag, "-n", "2"], out,
                    "streamfuzz-n2", timeout)
        if csan:
            _pytest(python, _tree(cache, suite), suite, [], out, "csan", timeout,
                    env={"TORCH_CUDA_SANITIZER": "1"})
    return summarize(out)


_TAGS = ("plain", "streamfuzz", "streamfuzz-n2", "csan")


def summarize(out: Path) -> int:
    """``suites.json`` and ``suites.md`` from the runs' files in ``out``."""
    device = (out / "device.txt").read_text() if (out / "device.txt").exists() else "?"
    report: dict[str, Any] = {"device": device, "python": platform.python_version(),
                              "machine": platform.machine(), "suites": {}}
    for suite in SUITES:
        entry: dict[str, Any] = {"version": suite.version, "tests": list(suite.tests),
                                 "why": suite.why}
        cannot = out / f"{suite.name}.cannot.txt"
        runs = {tag: _outcome(out, suite, tag) for tag in _TAGS
                if (out / f"{suite.name}-{tag}.run.json").exists()}
        if cannot.exists():
            entry["cannot_run"] = cannot.read_text()
        elif not runs:
            continue
        report["suites"][suite.name] = entry
        if "plain" not in runs:
            continue
        plain = runs["plain"].tests
        entry["runs"] = {}
        entry["details"] = {}
        for tag, r in runs.items():
            counts = r.counts()
            # GPU-only tests: skipped plainly (no GPU), run here on simulated streams.
            counts["gpu_only_run"] = sum(
                1 for test, info in r.tests.items() if info["kind"] in _RAN
                and plain.get(test, {}).get("kind") == "skipped")
            entry["runs"][tag] = {"args": r.args, "wall_s": r.wall_s, "exit": r.exit, **counts}
            if tag != "plain":
                entry["details"][tag] = {
                    test: {**info, "plain": plain.get(test, {}).get("kind", "absent")}
                    for test, info in r.tests.items()
                    if info["kind"] in ("finding", "csan", "not_simulated")
                    or (info["kind"] == "failed_otherwise"
                        and plain.get(test, {}).get("kind") != "failed_otherwise")}
    (out / "suites.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "suites.md").write_text(_markdown(report))
    print((out / "suites.md").read_text())
    return 0


_RAN = ("passed", "finding", "csan", "failed_otherwise")


def _outcome(out: Path, suite: Suite, tag: str) -> Outcome:
    meta = json.loads((out / f"{suite.name}-{tag}.run.json").read_text())
    return Outcome(meta["args"], meta["wall_s"], meta["exit"],
                   _read_junit(out / f"{suite.name}-{tag}.xml"))


_COLUMNS = (("collected", "collected"), ("run", "run"), ("passed", "passed"),
            ("finding", "finding"), ("not_simulated", "not simulated"),
            ("csan", "CSAN error"), ("failed_otherwise", "failed otherwise"),
            ("skipped", "skipped"), ("gpu_only_run", "GPU-only run"), ("wall_s", "wall s"))


def _markdown(report: dict[str, Any]) -> str:
    lines = [f"Device `{report['device']}`, Python {report['python']}.", "",
             "| suite | run | " + " | ".join(title for _, title in _COLUMNS) + " |",
             "|---|---|" + "---:|" * len(_COLUMNS)]
    for name, entry in report["suites"].items():
        if "cannot_run" in entry:
            lines.append(f"| {name} {entry['version']} | cannot run here: "
                         f"{entry['cannot_run'][:120]} |" + " |" * len(_COLUMNS))
            continue
        for tag, r in entry["runs"].items():
            lines.append(f"| {name} {entry['version']} | {tag} | "
                         + " | ".join(str(r[key]) for key, _ in _COLUMNS) + " |")
    lines.append("")
    for name, entry in report["suites"].items():
        for tag, tests in entry.get("details", {}).items():
            if tests:
                lines.append(f"{name}, {tag}: findings, not simulated, and tests that pass "
                             f"plainly but failed:")
                lines += [f"- `{test}` ({info['plain']} plainly): {info['kind']}: "
                          f"{info['message'][:200]}"
                          for test, info in sorted(tests.items())]
                lines.append("")
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=ROOT / "bench" / ".suites",
                        help="where fetch puts sdists and wheels, and run finds them")
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="download the suites and their test wheels (network)")
    get.add_argument("--python", default=",".join(_PYTHONS),
                     help="Python versions to fetch wheels for, comma-separated")
    get.add_argument("--torch", default="2.13,2.11",
                     help="torch releases to fetch the matching torchvision for")
    go = sub.add_parser("run", help="run the fetched suites (offline)")
    go.add_argument("--out", type=Path, required=True)
    go.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    go.add_argument("--suite", action="append", default=[],
                    choices=[s.name for s in SUITES], help="only this suite (repeatable)")
    go.add_argument("--xdist-suite", default=SUITES[0].name,
                    help="the suite also run under pytest-xdist -n 2 ('' for none)")
    go.add_argument("--csan", action="store_true",
                    help="also run each suite plainly under TORCH_CUDA_SANITIZER=1 (GPU)")
    go.add_argument("--timeout", type=float, default=1200.0,
                    help="seconds for each pytest run")
    show = sub.add_parser("report", help="suites.json and suites.md again from a run's --out")
    show.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cache = args.cache.resolve()
    if args.command == "fetch":
        return fetch(cache, tuple(args.python.split(",")), tuple(args.torch.split(",")))
    if args.command == "report":
        if not args.out.is_dir():
            print(f"suites: --out {args.out}: no such folder", file=sys.stderr)
            return 2
        return summarize(args.out.resolve())
    missing = [s.name for s in SUITES if (not args.suite or s.name in args.suite)
               and not _sdist(cache, s).exists()]
    if missing:
        print(f"suites: {', '.join(missing)} not fetched into {cache}: run "
              f"'python bench/suites.py fetch' where the index is reachable", file=sys.stderr)
        return 2
    if args.csan and args.device != "cuda":
        print("suites: --csan needs --device cuda (the sanitizer needs a GPU)", file=sys.stderr)
        return 2
    if args.xdist_suite and args.xdist_suite not in [s.name for s in SUITES]:
        print(f"suites: --xdist-suite {args.xdist_suite}: no such suite", file=sys.stderr)
        return 2
    return run(cache, args.out.resolve(), args.suite, args.device, args.xdist_suite or None,
               args.csan, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
