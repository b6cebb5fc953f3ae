"""The import graph of the project's own packages: rooms, arrows, cycles, arrows up.

Rooms are modules (a package's ``__init__`` is one room); arrows are imports
from one room to another, lazy ones included (a cycle through a function-level
import is still a cycle a reader must hold in mind). An arrow "runs back up"
where it goes from a lower layer to a higher one (``LAYERS``), or across from
one protocol's package into another's. ``python bench/import_graph.py [ROOT]``
prints the four numbers and lists every cycle and every upward arrow.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGES = ("fuzz", "strategies", "streamfuzz")

# Lowest first. A module's layer is the first rule whose prefix it matches
# (longest prefixes first); names of both the flat and the foldered layouts.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fuzz.errors", "fuzz.options", "fuzz.messages", "fuzz.verdict", "fuzz.stages",
              "fuzz.tensors", "fuzz.host", "fuzz.crash_text", "fuzz.sites", "fuzz.frames",
              "fuzz.profiles", "fuzz.exits", "fuzz.stop", "fuzz.__init__", "fuzz",
              "fuzz.timeouts", "fuzz.env")),
    ("sim", ("fuzz.sim", "fuzz.streams", "fuzz.cuda_on_cpu", "fuzz.stream_names",
             "fuzz.threads", "fuzz.gloo_threads", "fuzz.collectives", "fuzz.dispatch_mode",
             "fuzz.gates", "fuzz._gate_kernel", "fuzz._gate_ptx", "fuzz._gate_wait",
             "fuzz.sync_sites")),
    ("oracles", ("fuzz.oracles", "fuzz.annotations")),
    ("seam", ("fuzz.protocol", "fuzz.protocols", "fuzz.targets.__init__", "fuzz.targets",
              "fuzz.targets.mutated", "fuzz.upstream")),
    ("protocols", ("fuzz.draft", "fuzz.weight_sync", "fuzz.scenario", "fuzz.runner",
                   "fuzz.reference", "fuzz.draft_protocol", "fuzz.oracles.value",
                   "fuzz.targets.pp_draft", "fuzz.targets.pp_draft_streams",
                   "fuzz.targets.mutants", "fuzz.targets.vllm_pp", "fuzz.targets.vllm_standins",
                   "fuzz.targets.vllm_weights", "fuzz.targets.weight_sync", "strategies")),
    ("engine", ("fuzz.driver", "fuzz.campaign", "fuzz.corpus", "fuzz.ranks", "fuzz.rank_main",
                "fuzz.zygote",
                "fuzz.coverage", "fuzz.rank")),
    # The checker's runtime: private modules of the face that the face, the
    # pytest plugin and the commands all run on (as Hypothesis's ``internal``).
    ("checker", ("streamfuzz._check", "streamfuzz._record", "streamfuzz._subprocesses",
                 "streamfuzz._group", "streamfuzz._opaque", "streamfuzz._explain",
                 "streamfuzz._boot")),
    # The static scan reads sources and a checked run's record.
    ("scan", ("fuzz.scan",)),
    ("commands", ("fuzz.cli", "fuzz.scan.command", "fuzz.__main__", "fuzz.bench", "fuzz.soak",
                  "fuzz.matrix", "fuzz.mutate", "fuzz.commands", "fuzz.worlds",
                  "fuzz.plan")),
    ("facade", ("streamfuzz",)),
]
LAYER_OF_REPORT = ("fuzz.soak_report", "fuzz.stages_report", "fuzz.mutate_report",
                   "fuzz.worlds_report")

# Which protocol a module belongs to, where it belongs to one: a protocol's
# module importing another protocol's is an arrow across, counted as up.
PROTOCOL_OF: list[tuple[str, str]] = [
    ("fuzz.weight_sync", "weight-sync"), ("fuzz.targets.weight_sync", "weight-sync"),
    ("fuzz.targets.vllm_weights", "weight-sync"), ("strategies.weight_sync", "weight-sync"),
    ("fuzz.draft", "draft"), ("fuzz.scenario", "draft"), ("fuzz.runner", "draft"),
    ("fuzz.reference", "draft"), ("fuzz.draft_protocol", "draft"),
    ("fuzz.oracles.value", "draft"), ("fuzz.targets.pp_draft", "draft"),
    ("fuzz.targets.mutants", "draft"), ("fuzz.targets.vllm_pp", "draft"),
    ("fuzz.targets.vllm_standins", "draft"), ("strategies.batches", "draft"),
    ("strategies.churn", "draft"), ("strategies.interleavings", "draft"),
    ("strategies.scenarios", "draft"),
]


def _match(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer(name: str) -> int:
    if name in LAYER_OF_REPORT:
        return len(LAYERS) - 2
    best, rank = -1, 0
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if _match(name, p) and len(p) > best:
                best, rank = len(p), i
    return rank


def protocol_of(name: str) -> str | None:
    hits = [(len(p), proto) for p, proto in PROTOCOL_OF if _match(name, p)]
    return max(hits)[1] if hits else None


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def _as_laid_out(name: str) -> str:
    """An import's name as the tree's folders are laid out: ``streamfuzz.fuzz.x``
    (the folders' installed name) is ``fuzz.x``, as older trees imported it."""
    head, _, rest = name.partition(".")
    if head == "streamfuzz" and rest.split(".")[0] in ("fuzz", "strategies"):
        return rest
    return name


def arrows(root: Path) -> set[tuple[str, str]]:
    mods = modules(root)
    out: set[tuple[str, str]] = set()
    for name, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [_as_laid_out(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = _as_laid_out(node.module or "")
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod
                           for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out.add((name, t))
    return out


def cycles(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one room (Tarjan)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return out


def upward(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for a, b in sorted(edges):
        pa, pb = protocol_of(a), protocol_of(b)
        if layer(a) < layer(b) or (pa and pb and pa != pb):
            out.append((a, b))
    return out


def measure(root: Path) -> dict:
    mods = modules(root)
    edges = arrows(root)
    cyc = cycles(sorted(mods), edges)
    up = upward(edges)
    return {"rooms": len(mods), "arrows": len(edges), "cycles": len(cyc), "upward": len(up),
            "cycle_rooms": cyc, "upward_arrows": [f"{a} -> {b}" for a, b in up]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = measure(Path(a.root))
    if a.json:
        print(json.dumps(m, indent=1))
        return
    print(f"rooms {m['rooms']}  arrows {m['arrows']}  cycles {m['cycles']}  "
          f"upward {m['upward']}")
    for c in m["cycle_rooms"]:
        print("cycle:", " <-> ".join(c))
    for u in m["upward_arrows"]:
        print("up:", u)


if __name__ == "__main__":
    main()
