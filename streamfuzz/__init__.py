"""streamfuzz for your own tests: check any stream code for lifetime and race bugs.

The public surface, kept small on purpose (the engine lives in ``fuzz``, as
Hypothesis keeps its engine in ``_internal``)::

    import streamfuzz

    with streamfuzz.checked():       # cpu: simulated CUDA streams; cuda: real ones
        out = my_engine_step(n)      # unmodified torch.cuda code

At the block's end any finding raises ``StreamfuzzError``, whose message is
what ``python -m streamfuzz run`` prints for it. Under pytest the plugin also gives
the ``stream_checker`` fixture, the ``@pytest.mark.streamfuzz`` marker and the
``--streamfuzz-device`` option.
"""

from streamfuzz._check import DEVICES, ORACLES, Check, StreamfuzzError, checked
from streamfuzz._explain import hide_own_lines
from streamfuzz._opaque import opaque
from streamfuzz.fuzz import __version__
from streamfuzz.fuzz.errors import BadInput, FuzzError
from streamfuzz.fuzz.verdict import Failure

hide_own_lines()

__all__ = ["DEVICES", "ORACLES", "BadInput", "Check", "Failure", "FuzzError", "StreamfuzzError",
           "__version__",
           "checked", "opaque"]
