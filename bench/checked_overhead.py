"""What ``streamfuzz.checked()`` costs a user's test: ``make bench-checked``.

Runs the overlap test of ``examples/test_user_code.py`` (its own code and
strategy) as a Hypothesis test of ``--examples`` derandomized examples, so
every mode runs the same examples, in interleaved rounds:

* ``plain`` (GPU only): no block, real streams; the baseline on a GPU.
* ``simulated``: the block's streams with no checker watching: on CPU, the
  simulated CUDA streams alone; the baseline without a GPU, where plain
  torch.cuda code cannot run at all.
* ``checked``: a block with every oracle, as a test gets by default.
* ``csan`` (GPU only): no block, under PyTorch's CUDA Sanitizer, what a user
  runs instead (``TORCH_CUDA_SANITIZER=1``). Measured in a process of its own
  (``--only csan``), since the sanitizer's GPU-trace hooks stay registered
  once made and would slow every later mode.

Also the first block of a process (one-rank group, imports), paid once per
test process (once per pytest-xdist worker).

    PYTHONPATH=. python bench/checked_overhead.py --device auto --rounds 5
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import hypothesis
import torch
from hypothesis import HealthCheck, given, settings

import streamfuzz
from examples.test_user_code import MainGather, batches, run_steps
from streamfuzz import _check


def _test(mode: str, device: str, examples: int) -> Any:
    """The example test, as Hypothesis runs it, in one of the modes."""

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(steps=batches)
    def test(steps: list[list[int]]) -> None:
        if mode in ("plain", "csan"):
            run_steps(MainGather(), steps)
            return
        if mode == "simulated":  # the streams a block runs on, with no checker watching
            with _check._session(device, False):
                run_steps(MainGather(), steps)
            return
        with streamfuzz.checked(device=device):
            run_steps(MainGather(), steps)

    return test


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=streamfuzz.DEVICES, default="auto")
    p.add_argument("--examples", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="also write JSON here")
    p.add_argument("--only", choices=("csan",), default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.examples < 1 or a.rounds < 1:
        print("checked_overhead: --examples and --rounds must be at least 1", file=sys.stderr)
        return 2
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("checked_overhead: --device cuda needs a CUDA GPU", file=sys.stderr)
        return 2

    if a.only == "csan":
        return _csan_rounds(a.examples, a.rounds)
    t0 = time.perf_counter()
    with streamfuzz.checked(device=device):
        pass
    first_block_s = time.perf_counter() - t0

    modes = (["plain"] if device == "cuda" else []) + ["simulated", "checked"]
    tests = {m: _test(m, device, a.examples) for m in modes}
    for test in tests.values():  # warm: imports, kernels, Hypothesis's strategy caches
        test()
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(a.rounds):
        for m in modes:
            t0, c0 = time.perf_counter(), time.process_time()
            tests[m]()
            wall[m].append(time.perf_counter() - t0)
            cpu[m].append(time.process_time() - c0)

    if device == "cuda":
        csan = _csan_in_own_process(a.examples, a.rounds)
        if csan is not None:
            modes.append("csan")
            wall["csan"], cpu["csan"] = csan["wall"], csan["cpu"]
    base = "plain" if device == "cuda" else "simulated"
    # This process's CPU time as well as wall time: on a shared host the first
    # is what the check costs, the best wall time what an unloaded run waits.
    cpu_s = {m: statistics.median(s) for m, s in cpu.items()}
    rows = [{"mode": m, "cpu_s": round(cpu_s[m], 3),
             "cpu_ms_per_example": round(1000 * cpu_s[m] / a.examples, 2),
             "cpu_vs_" + base: round(cpu_s[m] / cpu_s[base], 2),
             "wall_best_s": round(min(wall[m]), 3),
             "wall_median_s": round(statistics.median(wall[m]), 3),
             "wall_all_s": [round(x, 3) for x in wall[m]],
             "cpu_all_s": [round(x, 3) for x in cpu[m]]} for m in modes]
    info = {"device": device, "examples": a.examples, "rounds": a.rounds,
            "first_block_s": round(first_block_s, 3), "torch": torch.__version__,
            "hypothesis": hypothesis.__version__, "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None, "rows": rows}
    print(f"checked() overhead on {device} ({info['gpu'] or platform.machine()}), "
          f"{a.examples} examples x {a.rounds} rounds; first block of a process: "
          f"{first_block_s:.3f} s\n")
    print(f"| mode | CPU s (median) | CPU ms/example | x {base} (CPU) | wall s (best) | "
          f"wall s (median) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['cpu_s']} | {r['cpu_ms_per_example']} | "
              f"{r['cpu_vs_' + base]} | {r['wall_best_s']} | {r['wall_median_s']} |")
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(info, indent=1) + "\n")
    return 0


def _csan_rounds(examples: int, rounds: int) -> int:
    """``--only csan``: the example test under the CUDA Sanitizer; JSON on stdout."""
    from torch.cuda._sanitizer import enable_cuda_sanitizer

    from streamfuzz import _group

    _group.ensure()  # the test's broadcast needs the one-rank group a block starts
    enable_cuda_sanitizer()
    test = _test("csan", "cuda", examples)
    test()  # warm
    wall, cpu = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        test()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"wall": wall, "cpu": cpu}))
    return 0


def _csan_in_own_process(examples: int, rounds: int) -> dict[str, list[float]] | None:
    import subprocess

    r = subprocess.run([sys.executable, __file__, "--device", "cuda", "--only", "csan",
                        "--examples", str(examples), "--rounds", str(rounds)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        print(f"checked_overhead: the CSAN process failed:\n{r.stderr[-2000:]}",
              file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
