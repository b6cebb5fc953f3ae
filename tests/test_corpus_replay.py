"""Every committed corpus entry is a regression test.

An entry found on a built-in buggy target must still fail there and pass on
``main-gather``; an entry found on vLLM's own code must still fail there (it
is skipped where that vLLM is not cached) and pass on vLLM 0.34.0's; an entry
found on a user target must still fail there. An
entry replays with the oracles that found it; on CPU, replaying it twice gives
the same verdict. An entry found on a GPU replays only where a GPU is.
"""


import pytest

from streamfuzz.fuzz import corpus, driver, targets
from streamfuzz.fuzz import protocol as protocols
from streamfuzz.fuzz.host import probe_gpus
from streamfuzz.fuzz.ranks import RankPool
from tests.helpers import ROOT

ENTRIES = corpus.discover([ROOT / "corpus"]) if (ROOT / "corpus").is_dir() else []
_pools: dict = {}


@pytest.fixture(scope="module")
def pools():
    yield _pools
    for pool in _pools.values():
        pool.close()


def _pool(pools, device, world):
    if (device, world) not in pools:
        pools[(device, world)] = RankPool(world, device, timeout=60.0)
        pools[(device, world)].start()
    return pools[(device, world)]


@pytest.mark.parametrize("path", ENTRIES, ids=[str(p.relative_to(ROOT)) for p in ENTRIES])
def test_corpus_entry_still_behaves_as_recorded(path, pools):
    entry = corpus.load(path)
    if targets.upstream_family(entry.target) or "@" in entry.target:
        try:
            targets.check_importable(entry.target)
        except targets.TargetError as exc:
            pytest.skip(f"upstream code not here: {exc}")
        targets.check_upstream(entry.target, entry.found_on.get("upstream"))
    world = entry.scenario.world_size
    attempts = 1
    if entry.device == "cuda":
        if probe_gpus() < world:
            pytest.skip(f"found on cuda with {world} GPU(s); not enough here")
        attempts = 5
    pool = _pool(pools, entry.device, world)
    verdict = driver.replay(pool, entry, attempts=attempts)
    assert not verdict.ok, f"{path} no longer fails on {entry.target}"
    if entry.device == "cpu":
        assert verdict.first.kind == entry.kind, verdict.summary()
        again = driver.replay(pool, entry)
        assert again.failures == verdict.failures, f"{path}: replays disagree"
    if targets.is_builtin(entry.target) and entry.target not in targets.CORRECT:
        fix = protocols.get(entry.protocol).correct
        fixed = driver.replay(pool, entry, target=fix)
        assert fixed.ok, f"{fix} fails {path}: {fixed.summary()}"
    if targets.upstream_family(entry.target):
        try:
            targets.check_importable(targets.UPSTREAM_FIXED)
        except targets.TargetError:
            return
        fixed = driver.replay(pool, entry, target=targets.UPSTREAM_FIXED)
        assert fixed.ok, f"{targets.UPSTREAM_FIXED} fails {path}: {fixed.summary()}"
