"""gloo's transport threads, scheduled so that they do not preempt on wake-up.

A gloo pair's event-loop thread (``gloo_tcp_loop``) handles a readable
socket only when it gets the pair's lock without waiting; otherwise it goes
straight back to ``epoll_wait``, which reports the same unread bytes at once.
Woken by a peer's message while the rank's own gloo worker holds that lock
(it has just posted a receive and told the peer), it preempts the worker on
a busy host and spins until the scheduler lets the worker finish. On a
shared 2-core machine that spin was most of the CPU the receiving rank's
gloo threads burnt per example (see bench/README.md).

As ``SCHED_BATCH`` threads they keep their full share of the CPU but do not
preempt on wake-up (the kernel's rule for batch threads), so the lock holder
finishes first. Linux only; anywhere else, where gloo leaves its threads unnamed
(torch 2.11), or should the kernel refuse, nothing changes: this is a
matter of speed, never of what a run finds.
"""

from __future__ import annotations

import os

THREADS = frozenset({"gloo_tcp_loop"})
"""The thread names gloo gives its transport event loops (one per process group)."""


def loops(pid: int | str = "self") -> list[int]:
    """The ids of a process's gloo transport threads (Linux ``/proc``; none elsewhere)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                if fh.read().strip() in THREADS:
                    found.append(int(tid))
        except OSError:  # a thread that ended
            continue
    return found


def no_wakeup_preemption() -> list[int]:
    """Make this process's gloo transport threads batch threads; returns their ids."""
    setscheduler = getattr(os, "sched_setscheduler", None)
    batch = getattr(os, "SCHED_BATCH", None)
    if setscheduler is None or batch is None:
        return []
    changed = []
    for tid in loops():
        try:
            setscheduler(tid, batch, os.sched_param(0))
        except OSError:  # a thread that ended, or a kernel that says no
            continue
        changed.append(tid)
    return changed
