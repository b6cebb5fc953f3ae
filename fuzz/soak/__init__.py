"""Soak campaigns: fuzz for a time budget, survive anything, lose nothing.

A campaign rotates over its targets in rounds; each round is one
``driver.fuzz`` call with a short budget, so one target's
shrinking or one crashed world never starves the others. Everything that must
outlive the driver is written to the campaign directory before it matters:

* ``journal.json``: the examples in flight once the next is dispatched (at
  most two: the driver sends an example before reading the last one's
  verdict), in one write that a killed driver made whole or not at all
  (``journal.Journal``). A start that finds one replays them, in order, before
  anything else (the driver died mid-example, perhaps because of one) and
  records the first that fails.
* ``state.json``: running totals, rewritten atomically at a failure not seen
  before and otherwise at most once per stats sample, so a restarted campaign
  resumes its budget and counts; bounded however long it runs
  (``KEPT_OCCURRENCES``).
* ``stats.jsonl``: one memory/throughput sample per line (a line cut by a kill
  is skipped on reading); ``soak.log``: the same as text.
* the corpus: each failure is saved on first sight, then replaced by its shrunk
  form, then replayed once; one that does not fail again is kept as flaky.

At the end (budget spent, SIGINT, SIGTERM, or external ranks lost) it writes
``report.json``, ``report.md`` and ``report.png``.

One file per role: ``campaign`` (the rounds, and what a failure and a
killed driver's journal become), ``state`` (``state.json``), ``journal``
(``journal.json``), ``sampler`` (``stats.jsonl``, and the growth that recycles
ranks), ``display`` (the stream, ``soak.log`` and the status line) and
``config``.
"""

from streamfuzz.fuzz.soak.campaign import Soak, stop_on_signals
from streamfuzz.fuzz.soak.config import SoakConfig, parse_budget
from streamfuzz.fuzz.soak.journal import Journal
from streamfuzz.fuzz.soak.sampler import read_samples
from streamfuzz.fuzz.soak.state import KEPT_OCCURRENCES, STATE_SCHEMA

__all__ = ["KEPT_OCCURRENCES", "STATE_SCHEMA", "Journal", "Soak", "SoakConfig", "parse_budget",
           "read_samples", "stop_on_signals"]
