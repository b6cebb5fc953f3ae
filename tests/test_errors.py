"""One exception root: every error streamfuzz raises on purpose is a
``FuzzError``, and every ``BadInput`` reaching the command line is one line
and exit 2 (``tests/test_cli.py`` runs the real commands)."""

import importlib
import inspect
import pkgutil

import pytest

from streamfuzz import _check, fuzz
from streamfuzz.fuzz import cli
from streamfuzz.fuzz.errors import BadInput, FuzzError


def _modules():
    yield _check
    for info in pkgutil.walk_packages(fuzz.__path__, "streamfuzz.fuzz."):
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # a module for a GPU or a package this machine lacks
            continue


def test_every_exception_class_streamfuzz_defines_is_under_the_root():
    seen, outside = [], []
    for module in _modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ not in (module.__name__, "streamfuzz") \
                    or not issubclass(cls, BaseException):
                continue
            seen.append(cls)
            if not issubclass(cls, (FuzzError, KeyboardInterrupt)):
                outside.append(f"{module.__name__}.{cls.__qualname__}")
    assert len(seen) >= 15, seen  # the walk found the engine's classes
    assert not outside, f"not under streamfuzz.fuzz.errors.FuzzError: {outside}"


def test_bad_input_the_commands_raise_keeps_its_builtin_base():
    from streamfuzz.fuzz.corpus import CorpusError
    from streamfuzz.fuzz.draft.scenario import ScenarioError
    from streamfuzz.fuzz.options import OptionsError
    from streamfuzz.fuzz.targets import TargetError

    for cls in (CorpusError, OptionsError, ScenarioError, TargetError):
        assert issubclass(cls, BadInput) and issubclass(cls, ValueError)


@pytest.mark.parametrize("error", ["streamfuzz.fuzz.protocol.scenario:ScenarioError",
                                   "streamfuzz.fuzz.options:OptionsError",
                                   "streamfuzz.fuzz.protocol:ProtocolError"])
def test_any_bad_input_from_a_command_is_one_line_and_exit_2(monkeypatch, capsys, error):
    module, name = error.split(":")
    cls = getattr(importlib.import_module(module), name)

    def replay(args):
        raise cls("step 3 names stream 'left'; use main or side")

    monkeypatch.setattr(cli, "replay_command", replay)
    assert cli.main(["replay", "corpus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["streamfuzz: error: step 3 names stream 'left'; use main or side"]
