"""The weight-sync protocol: scenario, reference, built-in targets, corpus.

The lifetime oracle must find the unordered producer and every consumer-side
mutant on CPU, and pass the ordered version; the value oracle must name stale
bytes when a rank holds the values from before the optimizer step.
"""

from __future__ import annotations

import json

import pytest

from streamfuzz.fuzz import corpus, driver, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.protocol.scenario import ScenarioError
from streamfuzz.fuzz.weight_sync import PROTOCOL, WeightSyncObservations
from streamfuzz.fuzz.weight_sync.reference import check, expected, values
from streamfuzz.fuzz.weight_sync.scenario import Param, Sync, WeightSyncScenario, chunk_sizes

LIFETIME = RunOptions(oracles=frozenset({Oracle.LIFETIME}))


def _scn(world: int = 2) -> WeightSyncScenario:
    return WeightSyncScenario(world_size=world, params=(Param((4,), "float32"),
                                                         Param((2, 4), "bfloat16")),
                              buffer_bytes=8, num_buffers=2,
                              syncs=(Sync(writes=(0, 1)), Sync(writes=(1,))))


def _bytes(t) -> bytes:
    return t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes()


def test_scenario_round_trip_and_chunks():
    scn = _scn()
    assert WeightSyncScenario.from_dict(json.loads(json.dumps(scn.to_dict()))) == scn
    # 16 bytes, then 16: the first parameter already exceeds 8 bytes.
    assert chunk_sizes(scn) == [1, 1]
    with pytest.raises(ScenarioError, match="writes must be distinct parameter indices"):
        WeightSyncScenario.from_dict(dict(scn.to_dict(), syncs=[{"writes": [5]}]))
    with pytest.raises(ScenarioError, match="unknown field"):
        WeightSyncScenario.from_dict(dict(scn.to_dict(), idx_mapping=[0]))


def test_reference_follows_the_last_write():
    scn = _scn()
    # Sync 1 writes only p1: p0 keeps sync 0's values.
    assert expected(scn, 1)[0].equal(values(0, 0, scn.params[0]))
    assert expected(scn, 1)[1].equal(values(1, 1, scn.params[1]))
    assert not values(0, 1, scn.params[1]).equal(values(1, 1, scn.params[1]))


def test_value_oracle_names_stale_bytes():
    scn = _scn()
    good = [b"".join(_bytes(t) for t in expected(scn, s)) for s in range(2)]
    stale = _bytes(expected(scn, 0)[0]) + _bytes(expected(scn, 0)[1])  # sync 1 sent sync 0's
    recv = [(s, [_bytes(t) for t in expected(scn, s)]) for s in range(2)]

    def obs(rank, **out):
        return WeightSyncObservations(rank=rank, held=(), oracles=("value",), findings=(), **out)

    ok = [obs(0, sent=[(0, good[0]), (1, good[1])]), obs(1, received=recv)]
    assert check(scn, ok) == []
    bad = [obs(0, sent=[(0, good[0]), (1, stale)]), obs(1, received=recv)]
    (f,) = check(scn, bad)
    assert f.kind == "value" and f.step == 1 and f.rank == 0
    assert "p1 (bfloat16[2, 4]): 8 of 8 elements differ, 8 stale" in f.message


def test_corpus_entry_names_its_protocol(tmp_path):
    entry = corpus.Entry(target="weight-sync-unordered", protocol="weight-sync", kind="race",
                         message="m", scenario=_scn())
    path = corpus.save(tmp_path, entry)
    data = json.loads(path.read_text())
    assert data["protocol"] == "weight-sync"
    assert corpus.load(path).scenario == _scn()
    # An entry without the field is the draft broadcast's (entries written before).
    del data["protocol"]
    path.write_text(json.dumps(data))
    with pytest.raises(corpus.CorpusError, match="bad scenario"):
        corpus.load(path)
    data["protocol"] = "nope"
    path.write_text(json.dumps(data))
    with pytest.raises(corpus.CorpusError, match="unknown protocol 'nope'"):
        corpus.load(path)


def test_targets_know_their_protocol():
    assert targets.protocol_of("weight-sync-ordered") is PROTOCOL
    assert targets.protocol_of("vllm-weights@0.34.0") is PROTOCOL
    assert targets.protocol_of("pre-fix").name == protocols.DEFAULT
    assert protocols.of_scenario(_scn()) is PROTOCOL


@pytest.mark.parametrize("target,kind", [
    ("weight-sync-unordered", "race"),
    ("weight-sync-consumer-no-drain", "race"),
    ("weight-sync-consumer-caller-alloc", "lifetime"),
    ("weight-sync-consumer-load-on-caller", "race"),
])
def test_lifetime_oracle_finds_the_buggy_versions(cpu_pool, ci_settings, target, kind):
    res = driver.fuzz(cpu_pool, target, ci_settings, max_examples=100, seed=0, options=LIFETIME)
    assert res.failure is not None and res.failure.kind == kind, res.failure
    assert isinstance(res.scenario, WeightSyncScenario)


def test_ordered_version_is_clean(cpu_pool, ci_settings):
    res = driver.fuzz(cpu_pool, "weight-sync-ordered", ci_settings, max_examples=150, seed=0,
                      options=RunOptions())
    assert res.failure is None, res.failure
    assert res.examples == 150


def _cached(version: str) -> bool:
    from streamfuzz.fuzz import targets

    try:
        targets.check_importable(f"vllm-weights@{version}")
    except targets.TargetError:
        return False
    return True


@pytest.mark.skipif(not _cached("0.34.0"), reason="vLLM 0.34.0 is not cached or installed")
def test_vllm_producer_reads_the_parameters_unordered(cpu_pool, ci_settings):
    """vLLM 0.34's own packed_tensor.py, unchanged: torch.cat on a buffer stream
    reads the optimizer's write on the caller's stream with no ordering."""
    res = driver.fuzz(cpu_pool, "vllm-weights@0.34.0", ci_settings, max_examples=100, seed=0,
                      options=LIFETIME)
    assert res.failure is not None and res.failure.kind == "race", res.failure
    assert "read-after-write race on p0" in res.failure.message
    assert "packed_tensor.py" in res.failure.message and "aten.cat" in res.failure.message


@pytest.mark.skipif(not _cached("0.34.0"), reason="vLLM 0.34.0 is not cached or installed")
def test_upstream_path_pins_the_bare_weights_family(tmp_path):
    """``--target vllm-weights --upstream WHEEL`` runs that wheel's producer, as
    ``--target vllm-pp --upstream WHEEL`` does for the draft broadcast."""
    import subprocess
    import sys

    from streamfuzz.fuzz import upstream

    wheel = upstream.find("0.34.0").path
    res = subprocess.run([sys.executable, "-m", "streamfuzz", "run", "--target", "vllm-weights",
                          "--upstream", wheel, "--device", "cpu", "--world-size", "2",
                          "--max-examples", "50", "--shrink-budget", "10", "--seed", "1",
                          "--oracle", "lifetime", "--corpus", str(tmp_path / "corpus")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "vllm-weights@0.34.0: FOUND race" in res.stdout, res.stdout
    assert list((tmp_path / "corpus" / "vllm-weights-0.34.0").glob("race-*.json"))
