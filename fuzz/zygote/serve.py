"""The zygote process: ``python -m streamfuzz.fuzz.zygote.serve [CUDA_RANKS]``.

It forks its early CUDA ranks (``streamfuzz.fuzz.zygote.early``), imports what a rank
imports, says it is ready, then serves the driver's requests (``streamfuzz.fuzz.zygote``
describes them): a rank forked per request, or handed to an early rank; a GPU
count per probe; and the exit status of every child that ended, since it is
their parent.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from typing import Any

from streamfuzz.fuzz.host import die_with_parent
from streamfuzz.fuzz.zygote.child import become_rank, import_rank
from streamfuzz.fuzz.zygote.early import hand_request, start_ranks


def _serve(cuda_ranks: int) -> int:
    die_with_parent()
    start_cwd = os.getcwd()
    early = start_ranks(cuda_ranks, start_cwd)  # before torch: they import it beside us
    main = import_rank()
    out = sys.stdout.fileno()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = {pid for pid, _ in early.values()}

    def say(msg: dict[str, Any]) -> None:
        os.write(out, json.dumps(msg).encode() + b"\n")

    say({"ready": os.getpid()})
    buf = b""
    inp = sys.stdin.fileno()
    while True:
        try:
            ready, _, _ = select.select([inp, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        for child in list(children):
            try:
                done, status = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                done, status = child, 0
            if done:
                children.discard(child)
                say({"exit": child, "code": os.waitstatus_to_exitcode(status)})
        if inp not in ready:
            continue
        chunk = os.read(inp, 65536)
        if not chunk:  # the driver closed its end: the ranks go with us
            return 0
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            req = json.loads(line)
            if "probe" in req:
                gpus, forks = _count_gpus()
                say({"gpus": gpus, "forks": forks})
                if gpus and not forks:
                    return 0
                continue
            pid = hand_request(early, req, line, children)
            if pid is None:
                pid = os.fork()
                if pid == 0:
                    become_rank(main, req, (inp, out, wake_r, wake_w), start_cwd)
                children.add(pid)
            say({"pid": pid})


def _count_gpus() -> tuple[int, bool]:
    """GPUs visible, and whether this process can still fork ranks: true
    unless counting them took CUDA itself (NVML could not) and found one."""
    import torch

    if not torch.cuda._is_compiled():
        return 0, True
    try:
        gpus = torch.cuda._device_count_nvml()  # torch's fork-safe count
    except Exception:  # a torch without it, or an NVML that fails oddly
        gpus = -1
    if gpus >= 0:
        return gpus, True
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus, gpus == 0  # no device started: CPU ranks still fork


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
