"""Oracles turn one example's rank observations into failures.

The lifetime oracle (``streamfuzz.fuzz.oracles.lifetime``) and the reuse oracle
(``streamfuzz.fuzz.oracles.reuse``) run on the ranks beside the target, because they
must watch streams, events and frees as they happen; their findings come back
in the observations. A value oracle is its protocol's own (``Protocol.values``,
e.g. ``streamfuzz.fuzz.draft.value.check``): a function ``check(scenario, observations)
-> list[Failure]`` run in the driver, away from any device.
"""
