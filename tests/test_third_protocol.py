"""Adding a protocol is its own modules plus one line: a toy third protocol
(``tests/toy_protocol``), written only against ``streamfuzz.fuzz.protocol``, runs through
the whole engine: the registry, the commands' built-ins, the ranks, the run
skeleton and its oracles, the value check, the corpus."""

import json

import hypothesis
import pytest

from streamfuzz.fuzz import corpus, driver, protocol, targets
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.ranks import RankPool

SPEC = "tests.toy_protocol:PROTOCOL"


@pytest.fixture
def toy(monkeypatch):
    """The one line: the toy's spec in the registry's list (ranks inherit it)."""
    monkeypatch.setenv(protocol.ENV, SPEC)
    return protocol.get("toy-fill")


def test_the_one_line_registers_the_protocol_everywhere(toy):
    assert toy.part("scenario").__name__ == "ToyScenario"
    assert isinstance(toy.part("smallest")(2), protocol.ScenarioType)
    assert isinstance(toy.part("run"), protocol.Runner)
    assert targets.protocol_of("toy-unsynced") is toy
    assert protocol.of_scenario(toy.part("smallest")(1)) is toy
    # Every command's default rows are every protocol's built-ins.
    assert {"toy-synced", "toy-unsynced"} <= set(targets.BUILTIN)
    assert "toy-synced" in targets.CORRECT and "toy-unsynced" in targets.MUTANTS


def test_without_the_line_the_protocol_is_unknown(monkeypatch):
    monkeypatch.delenv(protocol.ENV, raising=False)
    with pytest.raises(protocol.ProtocolError, match="unknown protocol 'toy-fill'"):
        protocol.get("toy-fill")
    assert "toy-synced" not in targets.BUILTIN


def test_a_spec_that_names_no_protocol_is_one_line(monkeypatch):
    monkeypatch.setenv(protocol.ENV, "tests.toy_protocol:FILLER")
    with pytest.raises(protocol.ProtocolError, match="is not a streamfuzz.fuzz.protocol.Protocol"):
        protocol.all_protocols()


def test_the_engine_runs_the_toy_protocol_and_judges_it(toy, tmp_path):
    settings = hypothesis.settings(deadline=None, database=None, derandomize=True)
    with RankPool(2, "cpu", timeout=20.0) as pool:
        clean = driver.fuzz(pool, "toy-synced", settings, max_examples=20, seed=0,
                            options=RunOptions())
        assert clean.failure is None, clean.failure
        found = driver.fuzz(pool, "toy-unsynced", settings, max_examples=50, seed=0,
                            options=RunOptions(oracles={Oracle.LIFETIME}),
                            corpus_dir=tmp_path)
    assert found.failure is not None and found.failure.kind in ("race", "lifetime")
    (saved,) = tmp_path.rglob("*.json")
    data = json.loads(saved.read_text())
    assert data["protocol"] == "toy-fill"
    # The skeleton reports the oracles that really ran: no reuse watch on CPU.
    assert data["found_on"]["oracles"] == ["lifetime"]
    assert corpus.load(saved).scenario == found.scenario
