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

import collections
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


def _xdist_controller(namespace: Any) -> bool:
    """Whether this process hands tests to pytest-xdist workers (it runs none)."""
    workers = getattr(namespace, "numprocesses", None)
    return bool(workers) and workers != "0" and "PYTEST_XDIST_WORKER" not in os.environ


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    """``--streamfuzz``: the simulation starts before any conftest or test module
    is imported, since those often decide at import whether CUDA is there."""
    namespace = early_config.known_args_namespace
    if not getattr(namespace, "streamfuzz", False) or _xdist_controller(namespace):
        return
    from streamfuzz import _check, _subprocesses
    from streamfuzz.fuzz.errors import CheckArgumentError

    try:
        device = _check.begin_whole(
            getattr(namespace, "streamfuzz_device", "auto"), "under pytest --streamfuzz",
            "run the test with --streamfuzz-device cuda on a GPU")
    except CheckArgumentError as exc:
        raise pytest.UsageError(f"--streamfuzz: {exc}") from None
    folder = tempfile.mkdtemp(prefix="streamfuzz-pytest-")
    early_config.stash[_FOLDER] = folder
    _subprocesses.export(folder, device, _check.ORACLES)


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
    folder = config.stash.get(_FOLDER, None)
    if folder is not None:
        sys.modules["streamfuzz._check"].end_whole()
        shutil.rmtree(folder, ignore_errors=True)


def _whole(config: pytest.Config) -> bool:
    return bool(config.getoption("streamfuzz", False))


def _own_block(item: pytest.Item) -> bool:
    """Whether the test asks for its own block (marker, fixture), which takes
    precedence over ``--streamfuzz``'s, or is a Hypothesis test, whose
    examples are each a block."""
    fn = getattr(item, "obj", None)
    return (item.get_closest_marker("streamfuzz") is not None
            or "stream_checker" in getattr(item, "fixturenames", ())
            or hasattr(getattr(fn, "hypothesis", None), "inner_test"))


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


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """``--streamfuzz``: the test's block starts before its fixtures do."""
    __tracebackhide__ = True
    _wrap_for_marker(item)
    if not _whole(item.config) or item.config.stash.get(_FOLDER, None) is None:
        return (yield)
    if _own_block(item):
        fn = getattr(item, "obj", None)
        if (item.get_closest_marker("streamfuzz") is None
                and hasattr(getattr(fn, "hypothesis", None), "inner_test")):
            _wrap_examples(fn, {})
        return (yield)
    import streamfuzz

    check = streamfuzz.checked(collect=True)
    check._implicit = True
    check.__enter__()
    item.stash[_WHOLE] = check
    try:
        return (yield)
    except BaseException as exc:
        del item.stash[_WHOLE]
        check.__exit__(type(exc), exc, exc.__traceback__)
        _fail_on(item, check, exc)
        raise


def _fail_on(item: pytest.Item, check: Any, exc: BaseException | None) -> None:
    """The block's findings and those of the processes it started, raised as
    one ``StreamfuzzError`` (a note on ``exc`` where the test failed anyway)."""
    __tracebackhide__ = True
    import streamfuzz
    from streamfuzz import _subprocesses
    from streamfuzz.fuzz.verdict import Failure

    found = list(check.findings)
    for child in _subprocesses.gather(item.config.stash[_FOLDER]):
        found += [Failure(f.kind, f"(in process {child.pid}, started by the test) {f.message}",
                          f.rank, f.step) for f in child.findings]
    if not found:
        return
    error = streamfuzz.StreamfuzzError(found, check.device or "?")
    if exc is not None:
        exc.add_note(str(error))
        return
    raise error


def _wrap_for_marker(item: pytest.Item) -> None:
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
    whole = item.stash.get(_WHOLE, None)
    if whole is not None:
        del item.stash[_WHOLE]
        try:
            result = yield
        except BaseException as exc:
            whole.__exit__(type(exc), exc, exc.__traceback__)
            _fail_on(item, whole, exc)
            raise
        whole.__exit__(None, None, None)
        _fail_on(item, whole, None)
        return result
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Any) -> Any:
    whole = item.stash.get(_WHOLE, None)  # left open: the call never ran
    if whole is not None:
        del item.stash[_WHOLE]
        whole.abandon()
    return (yield)


def _not_simulated(exc: BaseException | None) -> str | None:
    """The call the simulation does not model, where that is why a test failed
    (also behind the test's own exception): a custom kernel with no CPU
    implementation is one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "NotSimulated":
            return str(exc).split(" is not simulated", 1)[0]
        text = str(exc)
        if isinstance(exc, NotImplementedError) and "with arguments from the 'CPU' backend" in text:
            op = text.split("'", 2)[1] if text.count("'") >= 2 else "an operator"
            return f"{op} (a kernel with no CPU implementation)"
        if (type(exc).__module__.startswith("torch._dynamo")
                or _DYNAMO_REFUSES in text):
            return _COMPILE
        if _NO_NCCL in text:
            return "the NCCL backend (this torch has none; simulated collectives use gloo)"
        exc = exc.__cause__ or exc.__context__
    return None


_DYNAMO_REFUSES = "non-infra torch dispatch mode present"
"""How torch.compile(fullgraph=True) refuses a frame run under a dispatch mode."""
_NO_NCCL = "Distributed package doesn't have NCCL built in"
"""A CPU build of torch, asked for an NCCL process group (a GPU test's fixture)."""
_COMPILE = "torch.compile(fullgraph=True) (Dynamo does not trace through the checker's modes)"
"""Without fullgraph, Dynamo falls back to running the frame eagerly, which is checked;
with it, Dynamo either refuses the frame or fails tracing into the mode's handler."""


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if not _whole(item.config):
        return report
    excinfo = call.excinfo
    what = _not_simulated(excinfo.value) if report.failed and excinfo is not None else None
    if what is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1,
                           f"Skipped: not simulated: {what}")
        report.user_properties.append((_PROPERTY, f"not simulated: {what}"))
    elif report.when == "call":
        from streamfuzz.fuzz.errors import FuzzError

        error = excinfo.value if excinfo is not None else None
        finding = type(error).__name__ == "StreamfuzzError" or any(
            "streamfuzz: " in note and "finding(s)" in note
            for note in getattr(error, "__notes__", ()) or ())
        if isinstance(error, FuzzError) or finding:
            report.user_properties.append((_PROPERTY, "finding" if finding else "failed"))
        elif report.failed:
            report.user_properties.append((_PROPERTY, "failed"))
        elif report.passed:
            report.user_properties.append((_PROPERTY, "clean"))
    return report


_tally: collections.Counter[str] = collections.Counter()
"""Tests by outcome under the checker, in the process that prints the summary."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == _PROPERTY:
            _tally[value] += 1


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    if not _whole(config):
        return
    tally = _tally
    skipped = {k: n for k, n in tally.items() if k.startswith("not simulated: ")}
    ran = tally["clean"] + tally["finding"] + tally["failed"]
    device = config.getoption("streamfuzz_device")
    tr = terminalreporter
    tr.write_sep("-", "streamfuzz")
    tr.write_line(f"{ran} test(s) ran under the checker (--streamfuzz-device {device}): "
                  f"{tally['clean']} clean, {tally['finding']} failed with a finding, "
                  f"{tally['failed']} failed otherwise; {sum(skipped.values())} skipped "
                  f"as not simulated")
    for what, n in sorted(skipped.items(), key=lambda kv: -kv[1])[:10]:
        tr.write_line(f"  {n:4d}  {what}")
