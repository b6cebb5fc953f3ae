"""Do `scan --harness` files run as written? The measurement of docs/scan.md.

For each release (vLLM 0.34.0 and SGLang 0.5.23 by default): scan the wheel,
take the top N findings, write the harness of each one's function, run each
with pytest on CPU (simulated streams), and classify the outcome:

* ``pass``: the test passed;
* ``skip``: the harness skipped, saying what it needs (a GPU's driver call);
* ``finding``: it failed with a streamfuzz finding (``StreamfuzzError``);
* ``setup``: it failed with another exception (in the harness or the function);
* ``collection``: the file did not collect (the loader or the file itself).

Beside the outcome: whether the function did stream work under the checker
(``reached``: the checker's ops met it, counted as ``--streamfuzz-record``
counts them) and the first line of the checker's finding or of the error.

    python bench/harness_runs.py [--top 10] [--out reports/harness] [--rescan]
    python bench/harness_runs.py --release torchrec==1.9.2 --release lmcache==0.5.6

The wheels come from ``$STREAMFUZZ_SCAN_WHEELS`` or
``${XDG_CACHE_HOME:-~/.cache}/streamfuzz/scan``; a missing one is named with the
``pip download`` line that fetches it (exit 2, before any work). A release's
measured findings are the 20 of docs/scan.md's precision tables; with
``--rescan``, the current scan's top N (written to OUT/sites-NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASES = (("vllm", "0.34.0"), ("sglang", "0.5.23"))
# The 20 findings of docs/scan.md's precision tables (rank, file, line, function),
# fixed so that the measurement does not move when the scan's ranking does; with
# --rescan the current scan's top N are measured instead.
_NPU = "sglang/srt/hardware_backend/npu/sparsity_driven_kv_offload/manager.py"
TABLES = {
    "vllm": [
        (1, "vllm/v1/simple_kv_offload/worker.py", 313, "SimpleCPUOffloadWorker.start_load_kv"),
        (2, "vllm/distributed/ec_transfer/ec_connector/mooncake/memory.py", 275,
         "ProducerMemoryPool.stage"),
        (3, "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_client.py", 218,
         "Hf3fsClient.batch_read"),
        (4, "vllm/distributed/weight_transfer/packed_tensor.py", 181,
         "packed_nccl_broadcast_producer"),
        (5, "vllm/v1/conf_compute_utils.py", 177, "_h2d_inplace"),
        (6, "boundary/boundary.py", 170, "Boundaries.sublayer"),
        (7, "vllm/v1/worker/gpu/structured_outputs.py", 45, "apply_grammar_bitmask"),
        (8, "vllm/distributed/weight_transfer/sharded_rdt_engine.py", 1343, "_process_item"),
        (9, "attention/step.py", 324, "AttentionStep._prepare"),
        (10, "cutedsl/moe/wide.py", 471, "WideMoE.run.shared_expert"),
    ],
    "sglang": [
        (1, "sglang/srt/managers/scheduler_pp_mixin.py", 1423, ""),
        (2, "sglang/srt/managers/scheduler_pp_mixin.py", 1624, ""),
        (3, "sglang/kernels/ops/lora/dense/trtllm_lora_temp/sgemm_lora_a.py", 220, ""),
        (4, "sglang/multimodal_gen/runtime/disaggregation/transport/buffer.py", 124,
         "TransferTensorBuffer.write_tensor"),
        (5, "sglang/srt/hardware_backend/npu/sparsity_driven_kv_offload/manager.py", 370,
         "SparseKVCacheManager.offload"),
        # 6-10: one module's pattern, four functions (the docs' "offload_v2,
        # get_forward... (three), materialize..."): a line inside each function.
        (6, _NPU, 384, "SparseKVCacheManager.offload_v2"),
        (7, _NPU, 576, "SparseKVCacheManager.get_forward_kv"),
        (8, _NPU, 576, "SparseKVCacheManager.get_forward_kv"),
        (9, _NPU, 576, "SparseKVCacheManager.get_forward_kv"),
        (10, _NPU, 689, "SparseKVCacheManager.materialize_selected_kv"),
    ],
}

_PROBE = '''
import json
import os

from streamfuzz.fuzz import frames

_COUNTS = {}


def pytest_sessionstart(session):
    frames.count_functions(_COUNTS)


def pytest_sessionfinish(session, exitstatus):
    frames.count_functions(None)
    out = [{"file": c.co_filename, "name": c.co_name, "line": c.co_firstlineno, "ops": n}
           for c, n in _COUNTS.values()]
    with open(os.environ["HARNESS_REACHED"], "w") as f:
        json.dump(out, f)
'''


def cache_dir() -> Path:
    env = os.environ.get("STREAMFUZZ_SCAN_WHEELS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamfuzz" / "scan"


def wheel(dist: str, version: str) -> Path | None:
    found = sorted(cache_dir().glob(f"{dist}-{version}-*.whl"))
    return found[0] if found else None


def sites(dist: str, path: Path, top: int, keep: Path, rescan: bool) -> list[dict]:
    """The findings measured: the docs' tables, or (``rescan``) the scan's top ones."""
    if not rescan:
        return [{"rank": r, "file": f, "line": ln, "function": fn, "hazard": "", "score": 0,
                 "what": ""} for r, f, ln, fn in TABLES[dist][:top]]
    from streamfuzz.fuzz.scan import scan
    from streamfuzz.fuzz.scan.sources import open_source

    t0 = time.monotonic()
    result = scan(open_source(str(path)))
    print(f"  scanned {path.name} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    rows = [{"rank": f.rank, "file": f.file, "line": f.line, "function": f.function,
             "hazard": f.hazard.value, "score": f.score, "what": f.what}
            for f in result.active[:top]]
    keep.write_text(json.dumps(rows, indent=1))
    return rows


def run_one(harness: Path, function: str, device: str = "cpu") -> dict:
    reached = harness.with_suffix(".reached.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HARNESS_REACHED=str(reached))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rs", "-p", "no:cacheprovider",
                        "-p", "harness_probe", str(harness), "--streamfuzz-device", device],
                       cwd=harness.parent, env=env, capture_output=True, text=True,
                       timeout=900)
    text = r.stdout + r.stderr
    harness.with_suffix(".out").write_text(text)
    if r.returncode == 0:
        # A harness that says it cannot check anything here skips, with its reason.
        outcome = "skip" if " skipped" in text and " passed" not in text else "pass"
    elif "errors during collection" in text or "ERROR collecting" in text or r.returncode == 2:
        outcome = "collection"
    elif "StreamfuzzError" in text:
        outcome = "finding"
    else:
        outcome = "setup"
    ops = 0
    if reached.exists():
        leaf = function.rsplit(".", 1)[-1]
        ops = sum(c["ops"] for c in json.loads(reached.read_text()) if c["name"] == leaf
                  and "streamfuzz" not in Path(c["file"]).name)
    return {"outcome": outcome, "ops": ops, "seconds": round(time.monotonic() - t0, 1),
            "first": _first(text, outcome), "rc": r.returncode}


def _first(text: str, outcome: str) -> str:
    if outcome == "pass":
        return ""
    if outcome == "skip":
        m = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", text)
        return m.group(1)[:200] if m else ""
    if outcome == "finding":
        m = re.search(r"(lifetime|unordered|race|value)[^\n]*", text.split("StreamfuzzError",
                                                                          1)[1])
        return m.group(0)[:200] if m else ""
    # pytest's ``E   TypeError: ...`` lines, else hypothesis's grouped ``|   TypeError: ...``
    # (several distinct errors: the first), else any ``E`` line, else the last line.
    errors = [ln for ln in text.splitlines() if re.match(r"E\s+[\w.]+(Error|Exception)\b", ln)]
    grouped = [ln.strip(" |") for ln in text.splitlines()
               if re.match(r"\s*\|\s+[\w.]+(Error|Exception|Skipped)\b", ln)]
    errors = errors or grouped[:1] or [ln for ln in text.splitlines() if ln.startswith("E ")]
    return (errors[-1] if errors else text.strip().splitlines()[-1])[:200]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "harness")
    p.add_argument("--rescan", action="store_true")
    p.add_argument("--only", default=None, help="NAME:RANK, one harness (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="harnesses run at once (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="the checker's streams: simulated (cpu) or real (cuda) (default cpu)")
    p.add_argument("--release", action="append", default=None, metavar="NAME==VERSION",
                   help="a release to measure, repeatable (default: vllm==0.34.0 and "
                        "sglang==0.5.23); one without a table in docs/scan.md is measured "
                        "on the scan's top N, as with --rescan")
    args = p.parse_args(argv)
    releases = RELEASES
    if args.release:
        bad = [r for r in args.release if not re.fullmatch(r"[\w.-]+==[\w.+-]+", r)]
        if bad:
            print(f"harness_runs: --release {bad[0]!r}: give NAME==VERSION, as "
                  "`--release torchrec==1.9.2`", file=sys.stderr)
            return 2
        releases = tuple(tuple(r.split("==")) for r in args.release)  # type: ignore[misc]
    wheels = {}
    for dist, version in releases:
        w = wheel(dist, version)
        if w is None:
            print(f"harness_runs: {dist} {version} is not in {cache_dir()}: fetch it with "
                  f"`pip download {dist}=={version} --no-deps -d {cache_dir()}`", file=sys.stderr)
            return 2
        wheels[dist] = w
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "harness_probe.py").write_text(_PROBE)
    from streamfuzz.fuzz.scan.harness import Writer
    from streamfuzz.fuzz.scan.sources import open_source

    table = []
    written = []
    for dist, version in releases:
        rows = sites(dist, wheels[dist], args.top, args.out / f"sites-{dist}.json",
                     args.rescan or dist not in TABLES)
        if args.only and not args.only.startswith(dist + ":"):
            continue
        writer = Writer(open_source(str(wheels[dist])))
        for row in rows:
            if args.only and args.only != f"{dist}:{row['rank']}":
                continue
            row["release"] = f"{dist} {version}"
            try:
                row["function"] = writer.function_at(row["file"], row["line"]).qualname
                harness = args.out / (f"test_{dist}_{row['rank']:02d}_" + re.sub(
                    r"[^A-Za-z0-9_]", "_", row["function"]) + ".py")
                writer.write(row["file"], row["line"], harness)
            except Exception as exc:  # noqa: BLE001 - a harness not written is a result
                table.append({**row, "outcome": "unwritten", "ops": 0,
                              "first": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            written.append((row, harness))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, harness, row["function"], args.device): row
                   for row, harness in written}
        for future in as_completed(futures):
            row = futures[future]
            res = future.result()
            table.append({**row, **res})
            print(f"{row['release']} #{row['rank']:2d} {row['function']}: {res['outcome']} "
                  f"(ops {res['ops']}) {res['first']}", flush=True)
    table.sort(key=lambda r: (r["release"], r["rank"]))
    (args.out / "results.json").write_text(json.dumps(table, indent=1))
    ran = sum(r["outcome"] in ("pass", "finding") for r in table)
    reached = sum(r["outcome"] in ("pass", "finding") and r["ops"] > 0 for r in table)
    print(f"{ran} of {len(table)} run as written (pass or a streamfuzz finding); "
          f"{reached} of them did the function's stream work under the checker")
    return 0


if __name__ == "__main__":
    sys.exit(main())
