"""In a child the zygote forked: what a rank imports, once, in the zygote;
then becoming a rank as a spawned one would be."""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn


def import_rank() -> Callable[[], int]:
    """Everything a rank imports before its first example; returns the rank's
    entry point, ``streamfuzz.fuzz.rank_main.main``. The cyclic collector would scan the
    imports' objects again and again (about a tenth of it); frozen, they are
    never scanned in the ranks either, nor copied on write by a scan."""
    gc.disable()
    import streamfuzz.fuzz.draft.targets.mutants  # noqa: F401
    import streamfuzz.fuzz.draft.targets.pp_draft  # noqa: F401
    import streamfuzz.fuzz.rank_main as rank_main
    import streamfuzz.fuzz.targets.mutated  # noqa: F401

    try:  # what torch imports as a dispatch mode is first entered
        import torch._subclasses.schema_check_mode  # noqa: F401
    except ImportError:
        pass
    gc.freeze()
    return rank_main.main


def become_rank(main: Callable[[], int], req: dict[str, Any], fds: tuple[int, ...],
                start_cwd: str) -> NoReturn:
    """In the forked child: become a rank as a spawned one would be, then exit."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        gc.enable()
        os.setsid()
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in {log, null, *fds} - {0, 1, 2}:
            os.close(fd)
        if req["cwd"] != start_cwd:
            os.chdir(req["cwd"])
            if sys.path and sys.path[0] == start_cwd:  # what ``python -m`` puts first
                sys.path[0] = req["cwd"]
        os.environ.clear()
        os.environ.update(req["env"])
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
