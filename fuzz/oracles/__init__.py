"""Oracles turn one example's rank observations into failures.

Each oracle is a function ``check(scenario, observations) -> list[Failure]``
run in the driver, away from any device.
"""

from fuzz.oracles.value import check as check_values

__all__ = ["check_values"]
