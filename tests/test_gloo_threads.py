"""A CPU rank's gloo transport threads are batch threads (no preemption on wake-up)."""

import os
import sys
import threading

import pytest

from streamfuzz.fuzz.sim import gloo_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread scheduling policies are read from Linux /proc")


def _gloo_loops(pid: int) -> dict[int, int]:
    """Each gloo transport thread of ``pid``: its scheduling policy."""
    out = {}
    for tid in gloo_threads.loops(pid):
        try:
            out[tid] = os.sched_getscheduler(tid)
        except OSError:  # a thread that ended
            continue
    return out


def test_every_rank_of_a_cpu_world_runs_its_gloo_loops_as_batch_threads(cpu_pool):
    for pid in cpu_pool.pids:
        loops = _gloo_loops(pid)
        if not loops:  # torch 2.11's gloo leaves them unnamed: nothing is changed there
            pytest.skip(f"this torch's gloo names no thread {sorted(gloo_threads.THREADS)}")
        # The default process group and the ranks' own group: one loop each at least.
        assert len(loops) >= 2, loops
        assert set(loops.values()) == {os.SCHED_BATCH}, loops


def test_threads_with_other_names_are_left_alone():
    """This process may hold gloo threads of its own (an in-process group of an
    earlier test); whatever it changes is one of those, never this thread."""
    main = os.sched_getscheduler(0)
    changed = gloo_threads.no_wakeup_preemption()
    assert threading.get_native_id() not in changed
    assert os.sched_getscheduler(0) == main
    for tid in changed:
        with open(f"/proc/self/task/{tid}/comm") as fh:
            assert fh.read().strip() in gloo_threads.THREADS
