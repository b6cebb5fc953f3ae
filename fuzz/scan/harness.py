"""From a finding to a check: a ``streamfuzz.checked()`` harness for one function.

The harness loads the function's own file at run time (``streamfuzz.fuzz.targets.standins``:
compiled unchanged, unimportable imports stood in), makes its arguments on the
devices the scan saw them used on, calls it under ``checked()`` inside a
Hypothesis ``@given`` over sizes, then drops the caller's references, as a
caller would, so that a free the function left unordered is seen. The
findings of the function and the interleaving each one needs are written as
comments; what the scan could not guess is marked ``TODO``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from streamfuzz.fuzz import env
from streamfuzz.fuzz.scan import hazards
from streamfuzz.fuzz.scan.ops import Trace
from streamfuzz.fuzz.scan.package import Function, Package
from streamfuzz.fuzz.scan.sources import ScanInputError, Source, SourceFile
from streamfuzz.fuzz.targets.standins import find_text

_INTERLEAVING = {
    hazards.Hazard.LIFETIME: (
        "The tensor's block goes back to the caching allocator when its last "
        "reference dies, on the host, while the other stream's read or write of "
        "it may still be queued; the next allocation on the allocating stream may "
        "then get the same block and overwrite it first."),
    hazards.Hazard.UNORDERED: (
        "The two streams run in any order: the consumer's kernels may start before "
        "the producer's have finished (RAW), or overwrite what the other still "
        "reads (WAR/WAW)."),
    hazards.Hazard.PINNED_REWRITE: (
        "cudaMemcpyAsync from pinned memory reads it when the copy runs on the "
        "stream, not when it is called; the host's next write to the buffer can "
        "land first."),
    hazards.Hazard.UNSYNCED_D2H: (
        "A non_blocking device-to-host copy returns at once; the host reads "
        "whatever the buffer held before the copy landed."),
    hazards.Hazard.EARLY_EVENT: (
        "An event covers only the work queued before its record(); a waiter on it "
        "is not ordered after the work queued later."),
    hazards.Hazard.CACHED_STREAM: (
        "A stream made once and shared is current for several callers, none of "
        "which its work is ordered against."),
    hazards.Hazard.ASYNC_COLLECTIVE: (
        "An async collective runs on the communicator's stream; until its work is "
        "waited for, the current stream's use of its tensors is unordered with it."),
}


def write_for(source: Source, file: str, line: int, out: Path | None) -> Path:
    """Write the harness for the function at ``file:line`` of ``source``; its path."""
    text = find_text(source, file)
    rel = _relative(source, file)
    pkg = Package([SourceFile(rel, text)])
    fn = _function_at(pkg, rel, line)
    trace = pkg.walk(fn)
    findings = hazards.judge(trace)
    code = render(source.spec, rel, fn, trace, findings)
    path = out or Path(f"test_streamfuzz_{re.sub(r'[^A-Za-z0-9_]', '_', fn.qualname)}.py")
    from streamfuzz.fuzz.scan.report import write

    write(path, code)
    return path


def _relative(source: Source, file: str) -> str:
    want = file.replace("\\", "/").lstrip("./")
    paths = [f.path for f in source.files()]
    if want in paths:
        return want
    ends = [p for p in paths if p.endswith("/" + want) or want.endswith("/" + p)]
    return ends[0] if len(ends) == 1 else want


def _function_at(pkg: Package, file: str, line: int) -> Function:
    inside = [f for f in pkg.functions if f.file == file and
              f.node.lineno <= line <= (f.node.end_lineno or f.node.lineno)]
    if not inside:
        raise ScanInputError(f"{file}:{line}: no function there")
    return max(inside, key=lambda f: f.node.lineno)  # the innermost


def _arg(name: str, trace: Trace, annotation: ast.expr | None) -> str:
    ann = ast.unparse(annotation) if annotation is not None else ""
    low = name.lower()
    if "stream" in low:
        return "torch.cuda.Stream()"
    if "event" in low and "events" not in low:
        return "torch.cuda.Event()"
    if re.match(r"^(int|float|bool)", ann) or low in ("n", "num", "size", "count"):
        return "n"
    if name in trace.tensors or "Tensor" in ann:
        if name in trace.pinned or name in trace.host:
            return "torch.zeros(n, dtype=torch.int64, pin_memory=True)"
        if re.search(r"idx|indices|index|mapping|ids$|perm", low):  # an index tensor
            return "torch.randperm(n, device=DEVICE)"
        return "torch.arange(n, device=DEVICE, dtype=torch.float32)"
    return "None  # TODO: what the caller passes"


def _attr(key: str, trace: Trace) -> str:
    if key in trace.streams:
        return "torch.cuda.Stream()"
    if key in trace.events:
        return "torch.cuda.Event()"
    if key in trace.pinned:
        return "torch.zeros(n, dtype=torch.float32, pin_memory=True)"
    if key in trace.host:
        return "torch.zeros(n, dtype=torch.float32)"
    return "torch.zeros(n, device=DEVICE, dtype=torch.float32)"


def render(spec: str, file: str, fn: Function, trace: Trace,
           findings: list[hazards.Finding]) -> str:
    """The harness source."""
    params = fn.params()
    args = {p.arg: _arg(p.arg, trace, p.annotation) for p in params}
    attrs = sorted({k.split(".")[1] for k in (trace.tensors | trace.streams | trace.events)
                    if k.startswith("self.") and k.count(".") >= 1})
    findings = sorted(findings, key=lambda f: (-f.score, f.line))
    lines = [
        f'"""streamfuzz harness for {fn.qualname} ({file}:{fn.node.lineno}).',
        "",
        "Written by `python -m streamfuzz scan --harness`; fill in each TODO, then run",
        "`pytest THIS_FILE --streamfuzz-device cpu` (simulated CUDA streams, no GPU) or",
        "`--streamfuzz-device cuda`. A finding fails the test with the checker's message.",
        '"""',
        "",
        "import os",
        "",
        "import torch",
        "from hypothesis import given, settings",
        "from hypothesis import strategies as st",
        "",
        "import streamfuzz",
        "from streamfuzz.fuzz.targets.standins import load",
        "",
        f"SOURCE = os.environ.get({env.SOURCE!r}, {spec!r})",
        f"FILE = {file!r}",
        'DEVICE = "cuda"  # simulated on CPU under --streamfuzz-device cpu',
        "",
        "# The real code, compiled unchanged. Imports that fail here are stood in",
        "# (streamfuzz.fuzz.targets.standins); `TARGET.stood_in` lists them: replace the ones the",
        "# function reaches with what it needs.",
        "TARGET = load(SOURCE, FILE)",
        "",
    ]
    lines += ["# What the scan found in this function, and the interleaving each needs:"]
    if not findings:
        lines += ["#   (no finding: the skeleton still checks the function as it runs)"]
    for f in findings:
        lines += [f"#   [{f.score}] {f.hazard.value} at line {f.line}: {f.what}"]
        lines += ["#       " + w for w in textwrap.wrap(_INTERLEAVING[f.hazard], 76)]
        lines += ["#       " + w for w in textwrap.wrap(f.safe_if, 76)]
    lines += ["", "", "@settings(max_examples=20, deadline=None)",
              "@given(n=st.integers(min_value=1, max_value=64))",
              f"def test_{re.sub(r'[^A-Za-z0-9_]', '_', fn.qualname)}(n):",
              "    with streamfuzz.checked():"]
    body: list[str] = []
    if fn.cls is not None:
        cls_path = ".".join(fn.qualname.split(".")[:-1])
        body += [f"obj = TARGET.module.{cls_path}.__new__(TARGET.module.{cls_path})",
                 "# The attributes the method reads (TODO: the shapes and dtypes it expects):"]
        body += [f"obj.{a} = {_attr('self.' + a, trace)}" for a in attrs]
        target = f"obj.{fn.name}"
    else:
        target = f"TARGET.module.{fn.qualname}"
    body += ["# The arguments, on the devices the function uses (TODO: real shapes):"]
    body += [f"{k} = {v}" for k, v in args.items()]
    call = f"{target}({', '.join(f'{k}={k}' for k in args)})"
    body += ["# The hazardous interleaving: the call queues its work and returns; the",
             "# caller then drops its references while that work may still be pending.",
             f"result = {call}"]
    drop = [*args, "result"]
    body += [f"del {', '.join(drop)}"]
    lines += ["        " + b for b in body]
    lines += [""]
    return "\n".join(lines)
