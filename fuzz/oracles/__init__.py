"""Oracles turn one example's rank observations into failures.

The value oracle is a function ``check(scenario, observations) ->
list[Failure]`` run in the driver, away from any device. The lifetime oracle
(``fuzz.oracles.lifetime``) runs on the ranks beside the target, because it
must watch streams, events and frees as they happen; its findings come back
in the observations.
"""

from fuzz.draft.value import check as check_values

__all__ = ["check_values"]
