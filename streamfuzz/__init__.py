"""streamfuzz for your own tests: check any stream code for lifetime and race bugs.

The public surface, kept small on purpose (the engine lives in
``streamfuzz.fuzz``, as Hypothesis keeps its engine in ``_internal``)::

    import streamfuzz

    with streamfuzz.checked():       # cpu: simulated CUDA streams; cuda: real ones
        out = my_engine_step(n)      # unmodified torch.cuda code

At the block's end any finding raises ``StreamfuzzError``, whose message is
what ``python -m streamfuzz run`` prints for it. A target's writer imports
``streamfuzz.draft`` or ``streamfuzz.weight_sync`` (the contexts and handler
``typing.Protocol``s) and marks the factory with ``streamfuzz.target``. Under
pytest the plugin also gives the ``stream_checker`` fixture, the
``@pytest.mark.streamfuzz`` marker and the ``--streamfuzz-device`` option.

This package is the only import name the distribution owns: the repository's
``fuzz/`` and ``strategies/`` folders are ``streamfuzz.fuzz`` and
``streamfuzz.strategies`` (the wheel places them inside this folder; in a
checkout they are found beside it). The public names load on first use, so
that ``python -m streamfuzz`` and every rank, which import this package first,
do not pay for torch before they need it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# A checkout (or an editable install of one): fuzz/ and strategies/ sit beside
# this folder, not in it. A new list, so that this package's spec keeps naming
# this folder alone.
_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "fuzz")):
    __path__ = [*__path__, os.path.dirname(_HERE)]

from streamfuzz.fuzz import __version__  # noqa: E402 - found through the path above

if TYPE_CHECKING:
    from streamfuzz._check import DEVICES, ORACLES, Check, StreamfuzzError, checked
    from streamfuzz._opaque import opaque
    from streamfuzz._target import target
    from streamfuzz.fuzz.errors import BadInput, FuzzError
    from streamfuzz.fuzz.verdict import Failure

_PUBLIC = {"DEVICES": "streamfuzz._check", "ORACLES": "streamfuzz._check",
           "Check": "streamfuzz._check", "StreamfuzzError": "streamfuzz._check",
           "checked": "streamfuzz._check", "opaque": "streamfuzz._opaque",
           "target": "streamfuzz._target",
           "BadInput": "streamfuzz.fuzz.errors", "FuzzError": "streamfuzz.fuzz.errors",
           "Failure": "streamfuzz.fuzz.verdict"}

__all__ = ["DEVICES", "ORACLES", "BadInput", "Check", "Failure", "FuzzError", "StreamfuzzError",
           "__version__", "checked", "opaque", "target"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'streamfuzz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
