"""The pytest plugin (entry point ``pytest11: streamfuzz``).

* ``--streamfuzz``: every test of the session runs as one checked block, with
  no change to the test (its fixtures' setup included; a Hypothesis test's
  examples each a block). On ``cpu`` the whole process runs on simulated
  streams from its start, collection and conftest files included, so tests
  that skip without a GPU run; a test that reaches a call the simulation does
  not model is skipped as ``not simulated: <call>``. Processes the tests
  start are checked too, and their findings fail the test that started them.
* ``--streamfuzz-device cpu|cuda|auto``: the device of every checked block that
  names none (default ``auto``).
* ``--streamfuzz-record FILE`` (with ``--streamfuzz``): write the run's record
  (``streamfuzz._record``) for ``streamfuzz scan PATH --record FILE``.
* ``stream_checker``: a fixture whose test body runs as one checked block; the
  fixture is the ``streamfuzz.Check``, e.g. to ``name()`` a tensor.
* ``@pytest.mark.streamfuzz(device=..., oracles=..., collect=...)``: the same
  without the fixture. On a Hypothesis test each example is its own block, so
  a finding fails that example and Hypothesis shrinks it as usual. With
  ``collect=True`` a test's findings go to its report section ``streamfuzz``.

The fixture's and the marker's block wraps the test's call phase, not its
fixtures: a finding fails the test itself (and ``xfail`` applies); both take
precedence over ``--streamfuzz``'s block. Nothing here imports torch until a test
asks for a check, so the plugin costs nothing to a suite that never does.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from typing import Any

import pytest

_CHECK = pytest.StashKey[Any]()
_WHOLE = pytest.StashKey[Any]()
"""The ``--streamfuzz`` block a test runs in, from its setup to the end of its call."""
_FOLDER = pytest.StashKey[str]()
_PROPERTY = "streamfuzz"
"""The report property that carries a test's outcome under the checker to the
session's summary (through pytest-xdist too)."""
_DEVICES = ("cpu", "cuda", "auto")  # streamfuzz.DEVICES, without importing torch here


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("streamfuzz", "stream lifetime and race checks")
    group.addoption("--streamfuzz-device", choices=_DEVICES, default="auto",
                    help="device of checked blocks that name none: cpu (simulated CUDA "
                         "streams), cuda (real streams) or auto (cuda if a GPU is visible)")
    group.addoption("--streamfuzz", action="store_true", default=False,
                    help="run every test, unchanged, as one checked block (its child "
                         "processes too); on cpu, CUDA is simulated from the session's start")
    group.addoption("--streamfuzz-record", default=None, metavar="FILE",
                    help="with --streamfuzz: write the run's record to FILE (which functions "
                         "did stream work, which a finding named), for `streamfuzz scan PATH "
                         "--record FILE`")


def _xdist_controller(namespace: Any) -> bool:
    """Whether this process hands tests to pytest-xdist workers (it runs none).
    A worker is started as ``python -c`` with ``PYTEST_XDIST_WORKER`` set; a
    controller run by a worker's test inherits the variable, not the ``-c``."""
    workers = getattr(namespace, "numprocesses", None)
    worker = "PYTEST_XDIST_WORKER" in os.environ and sys.argv[:1] == ["-c"]
    return bool(workers) and workers != "0" and not worker


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    """``--streamfuzz``: the simulation starts before any conftest or test module
    is imported, since those often decide at import whether CUDA is there."""
    namespace = early_config.known_args_namespace
    record = getattr(namespace, "streamfuzz_record", None)
    if record is not None:
        _check_record(record, getattr(namespace, "streamfuzz", False))
    if not getattr(namespace, "streamfuzz", False) or _xdist_controller(namespace):
        return
    from streamfuzz import _check, _record, _subprocesses
    from streamfuzz.fuzz.errors import CheckArgumentError

    _subprocesses.hand_over()  # a checked program's child: each test is a block now
    try:
        device = _check.begin_whole(
            getattr(namespace, "streamfuzz_device", "auto"), "under pytest --streamfuzz",
            "run the test with --streamfuzz-device cuda on a GPU")
    except CheckArgumentError as exc:
        raise pytest.UsageError(f"--streamfuzz: {exc}") from None
    folder = tempfile.mkdtemp(prefix="streamfuzz-pytest-")
    early_config.stash[_FOLDER] = folder
    if record is not None:
        _record.start()
    _subprocesses.export(folder, device, _check.ORACLES)


def _check_record(path: str, whole: bool) -> None:
    """``--streamfuzz-record``: one usage line, before anything runs."""
    if not whole:
        raise pytest.UsageError("--streamfuzz-record needs --streamfuzz: the record is of "
                                "the whole suite's run")
    from pathlib import Path

    from streamfuzz.fuzz.commands import UsageError
    from streamfuzz.fuzz.commands.checks import check_file

    try:
        check_file(Path(path), "--streamfuzz-record")
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "streamfuzz(device=None, oracles=None, collect=False): run the test "
                   "(each example of a Hypothesis test) as a streamfuzz.checked() block")
    if config.getoption("streamfuzz"):
        from streamfuzz._pytest_whole import WholeSuite

        config.pluginmanager.register(
            WholeSuite(config.getoption("streamfuzz_device"), config.stash.get(_FOLDER, None),
                       _wrap_examples, config.getoption("streamfuzz_record")),
            "streamfuzz-whole-suite")
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
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        sys.modules["streamfuzz._check"].end_whole()
        shutil.rmtree(folder, ignore_errors=True)


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
