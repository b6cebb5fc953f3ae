"""A target writer's API is public and typed: ``streamfuzz.draft``,
``streamfuzz.weight_sync`` and ``streamfuzz.target``.

The examples pass ``mypy --strict``, a handler's ``ctx`` is its context type
(not ``Any``), a misspelled field or a factory of the wrong protocol is a type
error, the files a user reads name no engine module, and the old import paths
still work for one release, with a warning that names the new import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import streamfuzz
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.errors import BadInput
from tests.helpers import ROOT

_PROBES = {
    "probe_reveal.py": '''
from my_handler import MyHandler, make_handler
from my_weight_sync import MyWeightSync


def look(h: MyHandler, w: MyWeightSync) -> None:
    reveal_type(h.ctx)
    reveal_type(w.ctx)


reveal_type(make_handler)
''',
    "probe_misspelled.py": '''
from streamfuzz.draft import DraftContext
from streamfuzz.weight_sync import WeightSyncContext


def steps(ctx: DraftContext) -> int:
    return ctx.num_spec_step


def size(ctx: WeightSyncContext) -> int:
    return ctx.buffer_byte
''',
    "probe_wrong_protocol.py": '''
import streamfuzz
from my_handler import MyHandler
from my_weight_sync import MyWeightSync
from streamfuzz.draft import DraftContext
from streamfuzz.weight_sync import WeightSyncContext


@streamfuzz.target(protocol="weight-sync")
def draft_as_weights(ctx: DraftContext) -> MyHandler:
    return MyHandler(ctx)


@streamfuzz.target(protocol="weight-synk")
def misspelled(ctx: WeightSyncContext) -> MyWeightSync:
    return MyWeightSync(ctx)


class Half:
    def __init__(self, ctx: DraftContext) -> None:
        self.ctx = ctx

    def receive_drafts(self, batch: object) -> None:
        pass


@streamfuzz.target
def half(ctx: DraftContext) -> Half:
    return Half(ctx)
''',
}
"""Files mypy checks beside the examples: what a target writer gets wrong."""

_EXAMPLES = ("my_handler.py", "my_weight_sync.py")


@pytest.fixture(scope="module")
def mypy_lines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """One ``mypy --strict`` run over the examples and the probes, its lines by file.

    The packages are laid out as the wheel lays them out (``streamfuzz/fuzz``),
    through links, as ``make typecheck`` does; the cache is kept under build/.
    Torch's own functions are partly unannotated, so calls into it are let be."""
    pytest.importorskip("mypy")
    tree = tmp_path_factory.mktemp("typed")
    pkg = tree / "streamfuzz"
    pkg.mkdir()
    for f in (ROOT / "streamfuzz").iterdir():
        if f.suffix == ".py" or f.name == "py.typed" or f.name == "_boot":
            (pkg / f.name).symlink_to(f)
    for folder in ("fuzz", "strategies"):
        (pkg / folder).symlink_to(ROOT / folder)
    for name in _EXAMPLES:
        shutil.copy(ROOT / "examples" / name, tree / name)
    for name, text in _PROBES.items():
        (tree / name).write_text(text.lstrip())
    (tree / "mypy.ini").write_text("[mypy]\n")
    cache = ROOT / "build" / "mypy-public-api"
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--strict",
                        "--untyped-calls-exclude=torch", "--follow-imports=silent",
                        "--cache-dir", str(cache), "--no-error-summary", "--hide-error-context",
                        *_EXAMPLES, *_PROBES], cwd=tree, capture_output=True, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    out: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        out.setdefault(line.partition(":")[0], []).append(line)
    return out


def test_the_examples_pass_mypy_strict(mypy_lines):
    for name in _EXAMPLES:
        assert mypy_lines.get(name, []) == [], "\n".join(mypy_lines[name])


def test_a_handlers_ctx_is_its_context_type_not_any(mypy_lines):
    revealed = [line for line in mypy_lines.get("probe_reveal.py", [])
                if "Revealed type" in line]
    assert len(revealed) == 3, mypy_lines
    draft, weights, factory = revealed
    assert "DraftContext" in draft and "Any" not in draft, draft
    assert "WeightSyncContext" in weights and "Any" not in weights, weights
    # the decorator hands the factory back with its own type
    assert "def (ctx: streamfuzz.fuzz.draft.context.DraftContext) -> my_handler.MyHandler" \
        in factory, factory
    assert not [line for line in mypy_lines["probe_reveal.py"] if ": error:" in line]


def test_a_misspelled_context_field_is_a_type_error(mypy_lines):
    errors = "\n".join(mypy_lines.get("probe_misspelled.py", []))
    assert re.search(r'"DraftContext" has no attribute "num_spec_step"', errors), errors
    assert re.search(r'"WeightSyncContext" has no attribute "buffer_byte"', errors), errors


def test_a_factory_of_the_wrong_protocol_is_a_type_error(mypy_lines):
    errors = [line for line in mypy_lines.get("probe_wrong_protocol.py", [])
              if ": error:" in line]
    # the draft factory under "weight-sync", the misspelled name, the half handler:
    # each refused by target's signature, not by a name mypy cannot find
    refused = {int(line.split(":")[1]) for line in errors
               if line.endswith(("[type-var]", "[call-overload]"))}
    assert refused == {8, 13, 26}, "\n".join(errors)


def _user_facing() -> list[Path]:
    """What a user reads: the examples, the README and docs/, but for
    docs/architecture.md, the engine's map, whose job is to name its modules."""
    docs = [p for p in (ROOT / "docs").glob("*.md") if p.name != "architecture.md"]
    return [ROOT / "README.md", *docs, *sorted((ROOT / "examples").rglob("*.py"))]


def test_user_facing_files_name_no_engine_module():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in _user_facing()
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "streamfuzz.fuzz" in line]
    assert not found, "\n".join(found)


def test_the_old_import_paths_warn_and_name_the_new_one():
    from streamfuzz.draft import Batch, DraftContext
    from streamfuzz.weight_sync import WeightSyncContext

    with pytest.warns(DeprecationWarning, match="from streamfuzz.draft import DraftContext"):
        from streamfuzz.fuzz.targets import TargetContext
    with pytest.warns(DeprecationWarning, match="from streamfuzz.draft import Batch"):
        from streamfuzz.fuzz.targets import Batch as OldBatch
    with pytest.warns(DeprecationWarning,
                      match="from streamfuzz.weight_sync import WeightSyncContext"):
        from streamfuzz.fuzz.weight_sync.context import WeightSyncContext as Old
    assert (TargetContext, OldBatch, Old) == (DraftContext, Batch, WeightSyncContext)


def test_the_engine_itself_imports_no_deprecated_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for p in protocols.all_protocols().values():
            for part in ("run", "scenario"):
                p.part(part)


def test_target_infers_the_protocol_from_the_context_annotation():
    from streamfuzz.draft import DraftContext
    from streamfuzz.weight_sync import WeightSyncContext

    def draft(ctx: DraftContext) -> object:
        return ctx

    def weights(ctx: WeightSyncContext) -> object:
        return ctx

    def named(ctx: WeightSyncContext) -> object:  # as under `from __future__ import annotations`
        return ctx

    named.__annotations__["ctx"] = "streamfuzz.weight_sync.WeightSyncContext"
    for factory, expected in ((draft, "draft-broadcast"), (weights, "weight-sync"),
                              (named, "weight-sync")):
        assert streamfuzz.target(factory) is factory
        assert protocols.of_factory(factory).name == expected


def test_target_with_a_protocol_name_and_the_old_attribute_agree():
    def explicit(ctx: object) -> object:
        return ctx

    def old(ctx: object) -> object:
        return ctx

    streamfuzz.target(protocol="weight-sync")(explicit)
    old.protocol = "weight-sync"  # type: ignore[attr-defined]
    assert protocols.of_factory(explicit) is protocols.of_factory(old)
    assert protocols.of_factory(old).name == "weight-sync"


def test_target_without_a_known_context_is_one_clear_error():
    def bare(ctx):  # noqa: ANN001, ANN202
        return ctx

    with pytest.raises(BadInput, match="cannot tell the protocol of .*bare: annotate"):
        streamfuzz.target(bare)


def test_each_role_calls_the_methods_its_typing_protocol_declares():
    from streamfuzz.draft import DraftReceiver, DraftSender
    from streamfuzz.fuzz.draft import LAST_RANK, OTHER_RANKS
    from streamfuzz.fuzz.weight_sync import CONSUMERS, PRODUCER
    from streamfuzz.weight_sync import WeightSyncConsumer, WeightSyncProducer

    assert protocols.get("draft-broadcast").handler_methods == {
        LAST_RANK: ("broadcast_drafts",), OTHER_RANKS: ("receive_drafts", "apply_received")}
    assert protocols.get("weight-sync").handler_methods == {
        PRODUCER: ("send",), CONSUMERS: ("receive",)}
    for role in (DraftSender, DraftReceiver, WeightSyncProducer, WeightSyncConsumer):
        assert protocols.methods_of(role) == tuple(
            n for n in vars(role) if not n.startswith("_"))


def test_py_typed_is_package_data():
    assert (ROOT / "streamfuzz" / "py.typed").is_file()
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*\nstreamfuzz = \["py\.typed"\]',
                     text), "py.typed is not package data"


@pytest.mark.parametrize("module, says", [
    ("streamfuzz.rank", "STREAMFUZZ_DRIVER=host:port is not set"),
    ("streamfuzz.vllm", "usage: python -m streamfuzz.vllm fetch VERSION..."),
])
def test_the_documented_entry_points_are_public_and_run(module, says):
    env = {k: v for k, v in os.environ.items() if k != "STREAMFUZZ_DRIVER"}
    r = subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and says in r.stderr, r.stderr
