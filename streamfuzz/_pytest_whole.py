"""``pytest --streamfuzz``: every test of the session, unchanged, as one checked block.

Registered by the plugin (``streamfuzz._pytest_plugin``) when the flag is
given. In a process that runs tests, a test's block opens before its
fixtures are set up and closes at the end of its call, so a finding fails
the test itself; what the processes it started found fails it too. A test
that fails only because it reached a call the simulation does not model is
reported as skipped, ``not simulated: <call>``. Each test's outcome under the
checker rides on its report (``user_properties``), so the summary is right
under pytest-xdist too, where it is printed by the controller. With
``--streamfuzz-record`` each worker hands its part of the record
(``streamfuzz._record``) to the controller at its end, which writes the file.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest

_BLOCK = pytest.StashKey[Any]()
"""The block a test runs in, from its setup to the end of its call."""
_PROPERTY = "streamfuzz"
_PART = "streamfuzz_record"
"""A pytest-xdist worker's part of the record, in its ``workeroutput``."""


class WholeSuite:
    """The hooks of ``--streamfuzz``. ``folder``: where the processes a test
    starts report (None in a pytest-xdist controller, which runs no test).
    ``record``: where the run's record goes (``--streamfuzz-record``)."""

    def __init__(self, device: str, folder: str | None,
                 wrap_examples: Callable[[Any, dict[str, Any]], None],
                 record: str | None = None) -> None:
        self.device = device
        self.folder = folder
        self._wrap_examples = wrap_examples
        self.tally: collections.Counter[str] = collections.Counter()
        self.record = record
        self._written: Any = None

    # -- the block ------------------------------------------------------------
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        __tracebackhide__ = True
        if self.folder is None or _asks_for_its_own(item):
            fn = getattr(item, "obj", None)
            if (self.folder is not None and item.get_closest_marker("streamfuzz") is None
                    and _hypothesis(fn)):
                self._wrap_examples(fn, {})  # each example a block, so it shrinks
            return (yield)
        import streamfuzz

        check = streamfuzz.checked(collect=True)
        check._implicit = True
        check.__enter__()
        item.stash[_BLOCK] = check
        try:
            return (yield)
        except BaseException as exc:
            del item.stash[_BLOCK]
            check.__exit__(type(exc), exc, exc.__traceback__)
            self._judge(check, exc)
            raise

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        __tracebackhide__ = True
        check = item.stash.get(_BLOCK, None)
        if check is None:
            return (yield)
        del item.stash[_BLOCK]
        try:
            result = yield
        except BaseException as exc:
            check.__exit__(type(exc), exc, exc.__traceback__)
            self._judge(check, exc)
            raise
        check.__exit__(None, None, None)
        self._judge(check, None)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Any:
        check = item.stash.get(_BLOCK, None)  # still open: the call never ran
        if check is not None:
            del item.stash[_BLOCK]
            check.abandon()
        return (yield)

    def _judge(self, check: Any, exc: BaseException | None) -> None:
        """The block's findings and those of the processes it started, as one
        ``StreamfuzzError`` (a note on ``exc`` where the test failed anyway)."""
        __tracebackhide__ = True
        import streamfuzz
        from streamfuzz import _subprocesses
        from streamfuzz.fuzz.verdict import Failure

        found = list(check.findings)
        for child in _subprocesses.gather(self.folder or ""):
            _absorb(child.record)
            found += [Failure(f.kind, f"(in process {child.pid}, started by the test) "
                                      f"{f.message}", f.rank, f.step)
                      for f in child.findings]
        if not found:
            return
        error = streamfuzz.StreamfuzzError(found, check.device or "?")
        if exc is not None:
            exc.add_note(str(error))
            return
        raise error

    # -- the reports and the summary ------------------------------------------
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        report = yield
        error = call.excinfo.value if call.excinfo is not None else None
        what = _not_simulated(error) if report.failed else None
        if what is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), (item.location[1] or 0) + 1,
                               f"Skipped: not simulated: {what}")
            report.user_properties.append((_PROPERTY, f"not simulated: {what}"))
        elif report.when == "call" and not report.skipped:
            report.user_properties.append((_PROPERTY, _outcome(report, error)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, value in report.user_properties:
            if key == _PROPERTY:
                self.tally[str(value)] += 1

    # -- the record ---------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """pytest-xdist's controller: a worker ended, with its part of the record."""
        _absorb(getattr(node, "workeroutput", {}).get(_PART))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.record is None:
            return
        from streamfuzz import _record, _subprocesses

        for child in _subprocesses.gather(self.folder or ""):  # ended after their test
            _absorb(child.record)
        part = _record.this_process("pytest --streamfuzz", self.device)
        output = getattr(session.config, "workeroutput", None)
        if output is not None:  # a pytest-xdist worker: the controller writes
            output[_PART] = part.to_dict()
            return
        _record.write(self.record, part)
        self._written = part

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tally = self.tally
        skipped = {k: n for k, n in tally.items() if k.startswith("not simulated: ")}
        ran = tally["clean"] + tally["finding"] + tally["failed"]
        tr = terminalreporter
        tr.write_sep("-", "streamfuzz")
        tr.write_line(f"{ran} test(s) ran under the checker (--streamfuzz-device "
                      f"{self.device}): {tally['clean']} clean, {tally['finding']} failed "
                      f"with a finding, {tally['failed']} failed otherwise; "
                      f"{sum(skipped.values())} skipped as not simulated")
        for what, n in sorted(skipped.items(), key=lambda kv: -kv[1])[:10]:
            tr.write_line(f"  {n:4d}  {what}")
        if self._written is not None:
            tr.write_line(f"record written to {self.record}: {len(self._written.functions)} "
                          f"function(s) did stream work, {len(self._written.findings)} "
                          f"finding(s), {self._written.processes} process(es); mark a scan "
                          f"with it: python -m streamfuzz scan PATH --record {self.record}")


def _absorb(part: Any) -> None:
    from streamfuzz import _record

    _record.absorb(part)


def _hypothesis(fn: Any) -> bool:
    return hasattr(getattr(fn, "hypothesis", None), "inner_test")


def _asks_for_its_own(item: pytest.Item) -> bool:
    """A test with the marker or the fixture has its own block, which takes
    precedence; a Hypothesis test's examples are each a block."""
    return (item.get_closest_marker("streamfuzz") is not None
            or "stream_checker" in getattr(item, "fixturenames", ())
            or _hypothesis(getattr(item, "obj", None)))


def _outcome(report: pytest.TestReport, error: BaseException | None) -> str:
    if report.passed:
        return "clean"
    notes = getattr(error, "__notes__", None) or ()
    finding = type(error).__name__ == "StreamfuzzError" or any(
        note.startswith("streamfuzz: ") and "finding(s)" in note for note in notes)
    return "finding" if finding else "failed"


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
        if type(exc).__module__.startswith("torch._dynamo") or _DYNAMO_REFUSES in text:
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
