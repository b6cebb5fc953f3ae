"""What the bench scripts do alike: check their arguments before any work
(one line on stderr and exit 2, as the fuzzer's own command line does),
resolve ``--device auto``, and leave their report as JSON and markdown."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser with the options they all take: ``--device`` and ``--out``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", type=Path, required=True, help="where the report goes")
    return p


def error(device: str, **counts: int) -> str | None:
    """Why ``device`` and the positive ``counts`` (by option name) cannot run here."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: no CUDA GPU is visible here"
    small = [f"--{name.replace('_', '-')}" for name, value in counts.items() if value < 1]
    if small:
        return f"{' and '.join(small)} must be at least 1"
    return None


def device_kind(device: str) -> str:
    """``auto`` resolved: cuda where a GPU is visible, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def one_rank_group(device_kind: str, gates_wanted: bool = True) -> tuple[Any, Any, Any, str]:
    """A one-rank process group in this process (gloo on CPU, NCCL on CUDA):
    (device, group, the gate pool on CUDA or None, what gates it got)."""
    import torch
    import torch.distributed as dist

    gates, kind = None, "none"
    if device_kind == "cuda":
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=device)
        group = dist.new_group(backend="nccl")
        from streamfuzz.fuzz.gates import Gates, GateUnavailable

        try:
            if gates_wanted:
                gates = Gates.create(device)
                kind = gates.kind
        except GateUnavailable as exc:
            kind = f"unavailable ({exc})"
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group = dist.new_group(backend="gloo")
    return device, group, gates, kind


def write_report(out: Path, stem: str, report: dict[str, Any], lines: list[str]) -> None:
    """``stem.json`` and ``stem.md`` in ``out``; the markdown is printed too."""
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
