"""The pytest plugin (entry point ``pytest11: streamfuzz``).

* ``--streamfuzz-device cpu|cuda|auto``: the device of every checked block that
  names none (default ``auto``).
* ``stream_checker``: a fixture whose test body runs as one checked block; the
  fixture is the ``streamfuzz.Check``, e.g. to ``name()`` a tensor.
* ``@pytest.mark.streamfuzz(device=..., oracles=..., collect=...)``: the same
  without the fixture. On a Hypothesis test each example is its own block, so
  a finding fails that example and Hypothesis shrinks it as usual. With
  ``collect=True`` a test's findings go to its report section ``streamfuzz``.

The block wraps the test's call phase, not its fixtures: a finding fails the
test itself (and ``xfail`` applies). Nothing here imports torch until a test
asks for a check, so the plugin costs nothing to a suite that never does.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import pytest

_CHECK = pytest.StashKey[Any]()
_DEVICES = ("cpu", "cuda", "auto")  # streamfuzz.DEVICES, without importing torch here


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamfuzz", "stream lifetime and race checks")
    group.addoption("--streamfuzz-device", choices=_DEVICES, default="auto",
                    help="device of checked blocks that name none: cpu (simulated CUDA "
                         "streams), cuda (real streams) or auto (cuda if a GPU is visible)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "streamfuzz(device=None, oracles=None, collect=False): run the test "
                   "(each example of a Hypothesis test) as a streamfuzz.checked() block")
    device = config.getoption("streamfuzz_device")
    if device != "auto":
        from streamfuzz import _check

        _check._set_default_device(device)
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise pytest.UsageError("--streamfuzz-device cuda: no CUDA GPU is visible "
                                        "here; use cpu (simulated streams) or auto")


def pytest_unconfigure(config: pytest.Config) -> None:
    group = sys.modules.get("streamfuzz._group")  # only where a check ran
    if group is not None:
        group.close()


_MARKER_KEYWORDS = ("device", "oracles", "collect", "pending_polls")
"""``streamfuzz.checked()``'s arguments, which the marker passes on."""


def _options(item: pytest.Item) -> dict[str, Any] | None:
    """The marker's arguments; a bad one is a ``CheckArgumentError`` (a
    ``BadInput``), as from ``checked()`` itself."""
    from streamfuzz.fuzz.errors import CheckArgumentError

    marker = item.get_closest_marker("streamfuzz")
    if marker is None:
        return None
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KEYWORDS))
    if marker.args or unknown:
        what = f"no {', '.join(unknown)}" if unknown else "keyword arguments only"
        raise CheckArgumentError(f"{item.nodeid}: @pytest.mark.streamfuzz takes {what} "
                                 f"({', '.join(k + '=' for k in _MARKER_KEYWORDS)})")
    return dict(marker.kwargs)


@pytest.fixture
def stream_checker(request: pytest.FixtureRequest) -> Any:
    """The ``streamfuzz.Check`` the test body runs in (see the module docstring)."""
    import streamfuzz

    check = streamfuzz.checked(**(_options(request.node) or {}))
    request.node.stash[_CHECK] = check
    return check


def _wrap_examples(fn: Any, options: dict[str, Any]) -> None:
    """Make each Hypothesis example of ``fn`` one checked block (once per function)."""
    inner = fn.hypothesis.inner_test
    if getattr(inner, "_streamfuzz_checked", False):
        return

    @functools.wraps(inner)
    def example(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        import streamfuzz

        with streamfuzz.checked(**options):
            return inner(*args, **kwargs)

    example._streamfuzz_checked = True  # type: ignore[attr-defined]
    fn.hypothesis.inner_test = example


def pytest_runtest_setup(item: pytest.Item) -> None:
    __tracebackhide__ = True
    options = _options(item)
    fn = getattr(item, "obj", None)
    if options is not None and hasattr(getattr(fn, "hypothesis", None), "inner_test"):
        if options.get("collect"):
            from streamfuzz.fuzz.errors import CheckArgumentError

            raise CheckArgumentError(f"{item.nodeid}: @pytest.mark.streamfuzz(collect=True) "
                                     f"would drop every example's findings; on a Hypothesis "
                                     f"test use streamfuzz.checked(collect=True) in the body")
        _wrap_examples(fn, options)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    __tracebackhide__ = True
    check = item.stash.get(_CHECK, None)
    if check is None:
        options = _options(item)
        fn = getattr(item, "obj", None)
        if options is None or hasattr(getattr(fn, "hypothesis", None), "inner_test"):
            return (yield)
        import streamfuzz

        check = streamfuzz.checked(**options)
    code = getattr(getattr(item, "obj", None), "__code__", None)
    if code is not None:
        check._end_frames = ((code.co_filename, code.co_firstlineno,
                              f"{code.co_name} (at its end)"),)
    try:
        with check:
            return (yield)
    finally:
        if check.findings and check.collect:
            # Collected, not raised: still in the report (shown with -rA, -rP or a failure).
            import streamfuzz

            text = str(streamfuzz.StreamfuzzError(check.findings, check.device or "?"))
            item.add_report_section("call", "streamfuzz", text)
