"""Threads started inside an example run under its modes: their ops are seen."""

import threading

import torch

import streamfuzz
from streamfuzz.fuzz import driver
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.streams import SimStreams
from tests.helpers import one_step

LIFETIME = RunOptions(oracles={Oracle.LIFETIME, Oracle.VALUE})


def _in_thread(fn):
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


def _copy_out_of(x, out, wait_for=None):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if wait_for is not None:
            side.wait_event(wait_for)
        out.append(x.to("cpu", non_blocking=True))
    side.synchronize()


def test_a_race_made_in_a_thread_is_found_and_named_in_its_code():
    with streamfuzz.checked(device="cpu", collect=True) as check:
        x = torch.arange(16, device="cuda") * 2
        out = []
        _in_thread(lambda: _copy_out_of(x, out))
        assert out[0].tolist()[3] == 6
    (race,) = [f for f in check.findings if f.kind == "race"]
    assert "side reads it (aten._to_copy) unordered with main's write" in race.message
    side_line = next(line for line in race.message.splitlines()
                     if line.lstrip().startswith("side:"))
    assert "_copy_out_of" in side_line and "threading" not in side_line, race.message
    assert "fuzz/sim/threads.py" not in race.message and "test_threads.py" in side_line


def test_a_thread_that_waits_for_main_is_clean():
    with streamfuzz.checked(device="cpu", collect=True) as check:
        x = torch.arange(16, device="cuda") * 2
        ready = torch.cuda.Event()
        ready.record()
        out = []
        _in_thread(lambda: _copy_out_of(x, out, wait_for=ready))
        out[0].tolist()
    assert check.findings == []


def test_each_thread_has_its_own_current_stream():
    api = SimStreams()
    seen = {}
    with api.session():
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            def other():
                seen["start"] = torch.cuda.current_stream()
                torch.cuda.set_stream(torch.cuda.Stream())
                seen["set"] = torch.cuda.current_stream()
            _in_thread(other)
            assert torch.cuda.current_stream() is side
    assert seen["start"] is api.main and seen["set"] is not side


def test_thread_start_is_restored_after_the_example():
    start = threading.Thread.start
    with SimStreams().session():
        assert threading.Thread.start is not start
    assert threading.Thread.start is start



def test_a_handler_that_broadcasts_from_a_thread_is_checked(cpu_pool):
    bad = driver.evaluate(cpu_pool, "tests.cuda_handlers:ThreadedSendNoWait", one_step(),
                          LIFETIME)
    assert not bad.ok and bad.first.kind == "race", bad.summary()
    assert "sender" in bad.first.message, bad.first.message
    good = driver.evaluate(cpu_pool, "tests.cuda_handlers:ThreadedSend", one_step(), LIFETIME)
    assert good.ok, good.summary()
