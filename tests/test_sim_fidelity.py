"""CUDA on CPU that engine code cannot tell from a GPU.

Each probe is a few lines of plain torch.cuda code, written as engine code
is, under ``streamfuzz.checked``, and states its verdict. Those parametrized
with ``cuda`` run the same lines on a GPU too, and must agree.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

import streamfuzz
from streamfuzz.fuzz import driver
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.sim.cuda_on_cpu import NotSimulated
from streamfuzz.fuzz.streams import NoSimulation, SimStreams

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU])]


def _kinds(check: streamfuzz.Check) -> list[str]:
    return [f.kind for f in check.findings]


# -- what a tensor says about its device -----------------------------------------------
def _fused_scale(x: torch.Tensor) -> torch.Tensor:
    """An engine kernel's guard, as engines write it."""
    if not x.is_cuda or x.get_device() != 0:
        raise ValueError(f"fused_scale expects CUDA tensors, got device={x.device}")
    return x * 2


@pytest.mark.parametrize("device", DEVICES)
def test_a_guard_on_is_cuda_takes_the_gpu_path(device):
    """Verdict: clean, and the guard passes (device memory says cuda:0, host memory cpu)."""
    with streamfuzz.checked(device=device, collect=True) as check:
        x = torch.ones(4, device="cuda")
        assert x.device == torch.device("cuda", 0) and str(x.device) == "cuda:0"
        assert x.is_cuda and not x.is_cpu and x.get_device() == 0
        assert _fused_scale(x).is_cuda
        for host in (torch.ones(4), torch.ones(4).pin_memory(), x.cpu()):
            assert host.device == torch.device("cpu") and not host.is_cuda
            assert host.get_device() == -1
    assert check.findings == []


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_a_device_passed_back_into_torch_makes_device_memory(device, waits):
    """Verdict: a race where the side stream reads, unordered, what main wrote
    into a buffer made on ``x.device``; clean once the side stream waits."""
    with streamfuzz.checked(device=device, collect=True) as check:
        x = torch.ones(4, device="cuda")
        made = [x.to(x.device), torch.empty(4, device=x.device), x.new_empty(4),
                torch.empty_like(x), torch.zeros(4, device=x.device.index)]
        assert all(t.is_cuda and t.device == x.device for t in made)
        buf = torch.empty(4, device=x.device)
        buf.fill_(2)
        side = torch.cuda.Stream()
        if waits:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = buf * 2
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del y


@pytest.mark.parametrize("device", DEVICES)
def test_a_generator_on_the_device_samples_device_memory(device):
    """Verdict: clean; a seeded ``torch.Generator(device="cuda")`` repeats itself."""
    with streamfuzz.checked(device=device, collect=True) as check:
        draws = []
        for _ in range(2):
            g = torch.Generator(device="cuda")
            g.manual_seed(7)
            assert isinstance(g, torch.Generator)
            draws.append(torch.randn(4, device="cuda", generator=g))
        assert draws[0].is_cuda and torch.equal(draws[0], draws[1])
    assert check.findings == []


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_an_integer_device_is_the_cuda_device(device, waits):
    """Verdict: a race where the side stream reads, unordered, what main wrote
    into memory made on device ``0``; clean once the side stream waits."""
    with streamfuzz.checked(device=device, collect=True) as check:
        assert torch.device(0) == torch.device("cuda", 0)
        made = [torch.zeros(2, device=0), torch.ones(2).to(0), torch.ones(2).to(0, torch.half),
                torch.empty(2, device=torch.device(0)), torch.ones(2).cuda(0)]
        assert all(t.is_cuda and t.device == torch.device(0) for t in made)
        buf = torch.zeros(4, device=0)
        side = torch.cuda.Stream(0)
        if waits:
            side.wait_stream(torch.cuda.current_stream(0))
        with torch.cuda.stream(side):
            y = buf * 2
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del y


MOVES = {
    "to(device=)": lambda m: m.to(device="cuda"),
    "to(device=, dtype=)": lambda m: m.to(device="cuda", dtype=torch.float32),
    "to(index)": lambda m: m.to(0),
    "to(tensor)": lambda m: m.to(torch.empty(0, device="cuda")),
    "to(torch.device)": lambda m: m.to(torch.device("cuda")),
    "cuda()": lambda m: m.cuda(),
}


def _offload_then_reload(move, waits: bool) -> torch.Tensor:
    """An offload path: weights parked in pinned host memory, copied back on a
    load stream, then used by the forward on main."""
    layer = torch.nn.Linear(16, 16)
    move(layer)
    assert layer.weight.is_cuda and layer.bias.is_cuda
    parked = [p.detach().to("cpu", non_blocking=True) for p in layer.parameters()]
    torch.cuda.synchronize()
    load = torch.cuda.Stream()
    load.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(load):
        for p, host in zip(layer.parameters(), parked):
            p.data.copy_(host, non_blocking=True)
    if waits:
        torch.cuda.current_stream().wait_stream(load)
    out = layer(torch.ones(2, 16, device="cuda"))
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("device", DEVICES)
def test_a_module_moved_to_the_device_holds_device_memory(device, move, waits):
    """Verdict: a race where the forward on main reads the weights a load
    stream copies back, unordered; clean once main waits for the load."""
    with streamfuzz.checked(device=device, collect=True) as check:
        out = _offload_then_reload(MOVES[move], waits)
    assert set(_kinds(check)) == (set() if waits else {"race"}), check.findings
    del out


# -- meta, and the default device ----------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_meta_stays_meta_and_materializes_as_device_memory(device):
    """Verdict: clean; ``meta`` is meta, and materializing on cuda gives device memory."""
    with streamfuzz.checked(device=device, collect=True) as check:
        x = torch.ones(4, device="cuda")
        for m in (x.to("meta"), x.to(device="meta"), torch.empty_like(x, device="meta"),
                  torch.empty(2, device=torch.device("meta"))):
            assert m.is_meta and m.device.type == "meta" and not m.is_cuda
        assert torch.empty_like(x.to("meta"), device="cuda").is_cuda
        layer = torch.nn.Linear(4, 4, device="meta")
        layer.to_empty(device="cuda")
        assert layer.weight.is_cuda and not layer.weight.is_meta
    assert check.findings == []


def _load_weights_and_run(wait: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """A weight loader as engines write it: build without memory, materialize
    on the device, copy the weights in on a loader stream, run the layer."""
    layer = torch.nn.Linear(4, 4, bias=False).to("meta")
    if layer.weight.is_meta:
        layer.to_empty(device="cuda")
    loader = torch.cuda.Stream()
    host = torch.ones(4, 4).pin_memory()
    loader.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(loader):
        layer.weight.data.copy_(host, non_blocking=True)
    if wait:
        torch.cuda.current_stream().wait_stream(loader)
    return layer, layer(torch.ones(1, 4, device="cuda"))


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_weights_loaded_into_a_model_built_on_meta_are_checked(device, waits):
    """Verdict: a race where the forward reads weights the loader stream is
    still writing; clean once main waits for the loader."""
    with streamfuzz.checked(device=device, collect=True) as check:
        out = _load_weights_and_run(waits)
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    assert re.search(r"\bloader\b", "".join(f.message for f in check.findings)) or waits
    del out


@pytest.mark.parametrize("device", DEVICES)
def test_the_default_device_cuda_makes_device_memory(device):
    """Verdict: a race (the side stream reads, unordered, what main wrote into a
    tensor made with no device argument under ``set_default_device("cuda")``)."""
    try:
        with streamfuzz.checked(device=device, collect=True) as check:
            with torch.device("cuda"):
                assert torch.zeros(2).is_cuda
                assert torch.get_default_device() == torch.device("cuda", 0)
            assert torch.get_default_device() == torch.device("cpu")
            torch.set_default_device("cuda")
            x = torch.zeros(4)
            assert x.is_cuda and torch.get_default_device() == torch.device("cuda", 0)
            assert torch.zeros(2, device="cpu").is_cpu
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                y = x + 1
        if device == "cpu":  # the simulated device ends with the block
            assert torch.get_default_device() == torch.device("cpu")
    finally:
        torch.set_default_device(None)
    assert _kinds(check) == ["race"], check.findings
    del y


# -- optimizers, and the stream and event types engine code derives from -------------
@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
@pytest.mark.parametrize("device", DEVICES)
def test_an_optimizer_made_in_the_block_steps_device_memory(device, optimizer, waits):
    """Verdict: a race where a side stream snapshots the weights that the step
    on main writes, unordered; clean once the side stream waits. (Making an
    optimizer imports torch's compiler, which derives a class from ``torch.Event``.)"""
    with streamfuzz.checked(device=device, collect=True) as check:
        layer = torch.nn.Linear(4, 4, device="cuda")
        opt = optimizer(layer.parameters(), lr=0.1)
        layer(torch.ones(2, 4, device="cuda")).sum().backward()
        opt.step()
        side = torch.cuda.Stream()
        if waits:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            snapshot = layer.weight.detach().clone()
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del snapshot


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_stream_and_event_types_derived_in_the_block_are_simulated(device, waits):
    """Verdict: a race where a lane stream reads what main wrote, with no wait
    for main's event; clean once it waits. The lane and the event are of
    classes the block derives from ``torch.cuda.Stream`` and ``torch.Event``."""
    with streamfuzz.checked(device=device, collect=True) as check:
        class Lane(torch.cuda.Stream):  # torch's constructor takes the arguments
            def __init__(self, priority: int = 0) -> None:
                super().__init__()
                self.label = "copy"

        class Marker(torch.Event):
            def __init__(self, enable_timing: bool = False) -> None:
                super().__init__()
                self.label = "ready"

        lane, ready = Lane(priority=-1), Marker(enable_timing=True)
        assert isinstance(lane, Lane) and isinstance(lane, torch.cuda.Stream)
        assert isinstance(lane, torch.Stream) and lane.label == "copy" and lane.priority == -1
        assert isinstance(ready, Marker) and isinstance(ready, torch.Event)
        assert ready.label == "ready" and issubclass(Marker, torch.Event)
        assert not isinstance(torch.cuda.current_stream(), Lane)

        class Timer(torch.cuda.Event):
            pass

        class Queue(torch.Stream):
            pass

        timer, queue = Timer(enable_timing=True), Queue()
        assert isinstance(timer, Timer) and isinstance(timer, torch.cuda.Event)
        assert isinstance(queue, Queue) and isinstance(queue, torch.Stream)
        assert queue != lane and queue != torch.cuda.current_stream()
        x = torch.ones(4, device="cuda")
        ready.record()
        if waits:
            lane.wait_event(ready)
        with torch.cuda.stream(lane):
            y = x * 2
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del y


# -- the device module ------------------------------------------------------------------
def _overlap_step(waits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Engine code that picks its stream API for whatever accelerator there is."""
    module = torch.get_device_module()
    accelerator = torch.accelerator.current_accelerator()
    x = torch.ones(4, device=accelerator)
    side = module.Stream()
    if waits:
        side.wait_stream(module.current_stream())
    with module.stream(side):
        return x, x * 2


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_the_device_module_of_the_accelerator_is_torch_cuda(device, waits):
    """Verdict: a race where the side stream that ``torch.get_device_module()``
    made reads what main wrote, unordered; clean once it waits."""
    with streamfuzz.checked(device=device, collect=True) as check:
        kept = _overlap_step(waits)
        modules = [torch.get_device_module(), torch.get_device_module("cuda"),
                   torch.get_device_module(torch.device("cuda", 0))]
        accelerators = [torch._C._get_accelerator(), torch.accelerator.current_accelerator()]
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    assert all(m is torch.cuda for m in modules), modules
    assert [a.type for a in accelerators] == ["cuda", "cuda"]
    del kept


# -- stream contexts --------------------------------------------------------------------
@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_a_stored_stream_context_enters_again(device, waits):
    """Verdict: a race where the second entry of a stored ``torch.cuda.stream(side)``
    reads main's second write, unordered; clean once side waits. Entered
    again inside itself, it keeps one saved stream, as torch's does: its
    outer exit then leaves side current."""
    with streamfuzz.checked(device=device, collect=True) as check:
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        on_side = torch.cuda.stream(side)
        assert isinstance(on_side, torch.cuda.StreamContext)
        x = torch.ones(4, device="cuda")
        side.wait_stream(main)
        with on_side:
            first = x * 2
        assert torch.cuda.current_stream() == main
        main.wait_stream(side)
        x.add_(1)
        if waits:
            side.wait_stream(main)
        with on_side:
            second = x * 2
            with on_side:
                assert torch.cuda.current_stream() == side
            assert torch.cuda.current_stream() == side
        after_nested = torch.cuda.current_stream()
        torch.cuda.set_stream(main)
        torch.cuda.synchronize()
    assert after_nested == side
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del first, second


# -- external streams -------------------------------------------------------------------
@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU, pytest.mark.xfail(
        strict=False, reason="on an H100 (2026-12-07) the CUDA block's ExternalStream "
                             "failed this probe; its cause is not yet seen")])])
def test_an_external_stream_is_the_stream_its_handle_names(device, waits):
    """Verdict: a race where work on ``ExternalStream(side.cuda_stream)`` (a
    library's handle to ``side``) reads main's write, unordered; clean once
    ``side`` itself waits for main: they are one stream."""
    with streamfuzz.checked(device=device, collect=True) as check:
        side = torch.cuda.Stream()
        theirs = torch.cuda.ExternalStream(side.cuda_stream)
        again = torch.cuda.Stream(stream_id=side.stream_id, device_index=side.device_index,
                                  device_type=side.device_type)  # torch's own way back
        assert isinstance(theirs, torch.cuda.ExternalStream)
        assert isinstance(theirs, torch.cuda.Stream) and theirs == side == again
        assert theirs.cuda_stream == side.cuda_stream and hash(theirs) == hash(side)
        x = torch.ones(4, device="cuda")
        if waits:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(theirs):
            y = x * 2
        torch.cuda.current_stream().wait_stream(side)
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del y


@pytest.mark.parametrize("waits", [False, True])
def test_an_external_stream_of_a_handle_made_elsewhere_is_a_stream_of_its_own(waits):
    """Verdict: a race where a stream another library made (a handle no
    simulated stream has) reads main's write, unordered; clean once it waits.
    Every ``ExternalStream`` of that handle is that one stream."""
    with streamfuzz.checked(device="cpu", collect=True) as check:
        handle = 0x7F00_0000_1230
        lib = torch.cuda.ExternalStream(handle)
        assert lib == torch.cuda.ExternalStream(handle) and lib.cuda_stream == handle
        assert lib != torch.cuda.current_stream() and lib != torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        if waits:
            torch.cuda.ExternalStream(handle).wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(lib):
            y = x * 2
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    assert "lib reads it" in "".join(f.message for f in check.findings) or waits
    del y


# -- random state and memory statistics ------------------------------------------------
def _checkpointed_dropout(layer: torch.nn.Module, x: torch.Tensor, checkpoint: bool) -> None:
    torch.cuda.manual_seed(0)

    def block(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(layer(t), 0.5, training=True)

    out = (torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if checkpoint
           else block(x))
    out.sum().backward()


@pytest.mark.parametrize("waits", [False, True])
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, GPU, pytest.mark.xfail(
        raises=SystemError, strict=True,
        reason="the CUDA adapter's GPU-trace hook fails in autograd's device thread while "
               "checkpointing recomputes a dropout (H100, 2026-12-07): a known gap")])])
def test_activation_checkpointing_replays_the_device_random_state(device, waits):
    """Verdict: a race where a side stream reads the gradient that the
    checkpointed backward wrote on main, unordered; clean once it waits. The
    recomputed dropout draws the forward's mask: checkpointing saves and
    restores ``torch.cuda``'s random state, so its gradient is the plain one."""
    with torch.random.fork_rng(devices=[]), \
            streamfuzz.checked(device=device, collect=True) as check:
        layer = torch.nn.Linear(64, 64, device="cuda")
        x = torch.ones(8, 64, device="cuda", requires_grad=True)
        _checkpointed_dropout(layer, x, checkpoint=False)
        plain, x.grad = x.grad, None
        _checkpointed_dropout(layer, x, checkpoint=True)
        side = torch.cuda.Stream()
        if waits:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            copied = x.grad.clone()
        torch.cuda.current_stream().wait_stream(side)
        assert torch.equal(plain, x.grad) and torch.cuda.initial_seed() == 0
        state = torch.cuda.get_rng_state()
        drawn = torch.rand(4, device="cuda")
        torch.cuda.set_rng_state_all([state])
        assert torch.equal(drawn, torch.rand(4, device="cuda"))
        assert torch.equal(torch.cuda.get_rng_state_all()[0], torch.cuda.get_rng_state())
    assert _kinds(check) == ([] if waits else ["race"]), check.findings
    del copied


@pytest.mark.parametrize("device", DEVICES)
def test_memory_statistics_count_live_device_memory(device):
    """Verdict: clean. ``memory_allocated`` follows the device memory the block
    holds, as the caching allocator counts it (each block rounded up to 512
    bytes), through allocations, frees and ``resize_``; the peaks and what is
    reserved hold it."""
    with streamfuzz.checked(device=device, collect=True) as check:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        x = torch.empty(1 << 20, device="cuda")
        small = torch.ones(3, device="cuda")
        assert torch.cuda.memory_allocated() - before == (4 << 20) + 512
        peak = torch.cuda.max_memory_allocated()
        assert peak >= before + (4 << 20) + 512
        x.untyped_storage().resize_(0)
        assert torch.cuda.memory_allocated() - before == 512
        x.untyped_storage().resize_(1 << 20)
        assert torch.cuda.memory_allocated() - before == (1 << 20) + 512
        del x, small
        assert torch.cuda.memory_allocated() == before
        assert torch.cuda.max_memory_allocated() == peak
        reserved = torch.cuda.memory_reserved()
        assert reserved >= peak and torch.cuda.max_memory_reserved() >= reserved
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total - reserved
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == before
        assert stats["allocated_bytes.all.peak"] == peak
        assert stats["reserved_bytes.all.current"] == reserved
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == before
    assert check.findings == []


# -- streams and events made before the block ------------------------------------------
@functools.cache
def _copy_stream(device: str) -> torch.cuda.Stream:
    """A module-level cache of streams, made in the first block that asks."""
    return torch.cuda.Stream()


def _scale_on_copy_stream(device: str, sync: bool) -> torch.Tensor:
    s = _copy_stream(device)
    x = torch.ones(1024, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 2
    if sync:
        s.synchronize()
    del x  # freed: safe once the host knows the copy stream is done with it
    return y


@pytest.mark.parametrize("device", DEVICES)
def test_a_stream_cached_from_an_earlier_block_is_the_current_blocks(device):
    """Verdicts, block by block: clean (the stream is made), clean (its
    synchronize is seen in the second block), lifetime (no synchronize)."""
    verdicts, messages, distinct = [], [], []
    for sync in (True, True, False):
        with streamfuzz.checked(device=device, collect=True) as check:
            _scale_on_copy_stream(device, sync)
            distinct.append(torch.cuda.Stream() != _copy_stream(device))
        verdicts.append(_kinds(check))
        messages += [f.message for f in check.findings]
    assert verdicts == [[], [], ["lifetime"]], messages
    assert all(distinct)  # a new stream is never taken for one of an earlier block
    # Not assigned to a name where it was made: named after its file and line.
    assert "while stream test_sim_fidelity.py:" in messages[0], messages


@functools.cache
def _producer(device: str) -> tuple[torch.cuda.Stream, torch.cuda.Event]:
    side = torch.cuda.Stream()
    ready = torch.cuda.Event()
    return side, ready


@pytest.mark.parametrize("device", DEVICES)
def test_an_event_cached_from_an_earlier_block_is_the_current_blocks(device):
    """Verdicts, block by block: clean, clean (main waits for the cached event,
    recorded in this block), race (main does not wait)."""
    verdicts = []
    for wait in (True, True, False):
        with streamfuzz.checked(device=device, collect=True) as check:
            side, ready = _producer(device)
            with torch.cuda.stream(side):
                x = torch.ones(4, device="cuda")
                ready.record()
            if wait:
                torch.cuda.current_stream().wait_event(ready)
            y = x * 2
        verdicts.append(_kinds(check))
    assert verdicts == [[], [], ["race"]]
    del x, y


_by_device: dict[str, torch.cuda.Stream] = {}


def _stream_for(device: torch.device) -> torch.cuda.Stream:
    """One copy stream per device, as an engine's cache keyed by ``str(device)``."""
    key = str(device)
    if key not in _by_device:
        _by_device[key] = torch.cuda.Stream()
    return _by_device[key]


@pytest.mark.parametrize("device", DEVICES)
def test_a_cache_of_streams_keyed_by_str_device_sees_one_device(device):
    """Verdict: clean; the copy and the wait for it are on one stream."""
    _by_device.clear()
    with streamfuzz.checked(device=device, collect=True) as check:
        dst, src = torch.empty(4, device="cuda"), torch.ones(4, device="cuda")
        copy = _stream_for(dst.device)
        copy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy):
            dst.copy_(src)
        here = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.current_stream().wait_stream(_stream_for(here))
        total = dst.sum()
    assert list(_by_device) == ["cuda:0"]
    assert check.findings == []
    del total


def test_a_simulated_stream_used_after_its_block_raises_one_line():
    """Verdict: ``NoSimulation`` at each use, never a sync nobody sees."""
    with streamfuzz.checked(device="cpu", collect=True):
        side, done = torch.cuda.Stream(), torch.cuda.Event()
    for call in (side.synchronize, side.query, lambda: side.wait_stream(side),
                 done.synchronize, done.record, done.query):
        with pytest.raises(NoSimulation) as err:
            call()
        assert "\n" not in str(err.value) and "checked(device=\"cpu\")" in str(err.value)


def test_waiting_for_what_is_not_a_stream_fails_in_the_callers_line():
    """Verdict: a ``TypeError`` at the user's ``wait_stream`` (torch fails there
    too), never an error inside the checker's oracles."""
    with pytest.raises(TypeError, match=r"wait_stream\(\) takes a stream, not object"), \
            streamfuzz.checked(device="cpu"):
        torch.cuda.Stream().wait_stream(object())


@pytest.mark.parametrize("enter", [lambda x: torch.cuda.stream(x).__enter__(),
                                   lambda x: torch.cuda.set_stream(x)],
                         ids=["stream", "set_stream"])
def test_entering_what_is_not_a_stream_fails_in_the_callers_line(enter):
    """Verdict: a ``TypeError`` at the user's ``torch.cuda.stream(x)`` or
    ``set_stream(x)`` (torch fails there too), never an error inside the lifetime
    oracle when the next op asks for the current stream's id."""
    with pytest.raises(TypeError, match=r"takes a stream, not object"), \
            streamfuzz.checked(device="cpu"):
        enter(object())


# -- what is not simulated -----------------------------------------------------------
def test_what_is_not_simulated_names_the_call_and_how_the_block_runs_on_a_gpu():
    """Verdict: one ``NotSimulated`` line; under ``checked()`` it names
    ``checked(device="cuda")``, in a fuzz target the ``--device`` flag."""
    with pytest.raises(NotSimulated) as err, streamfuzz.checked(device="cpu", collect=True):
        torch.cuda.memory_snapshot()
    text = str(err.value)
    assert "\n" not in text and text.startswith("torch.cuda.memory_snapshot is not simulated")
    assert 'checked(device="cuda")' in text and "--device" not in text
    with pytest.raises(NotSimulated) as err, SimStreams().session():
        torch.cuda.memory_snapshot()
    assert "--device cuda" in str(err.value) and "checked(" not in str(err.value)


# -- stream names ----------------------------------------------------------------------
class _Loader:
    def __init__(self) -> None:
        self.copy_stream = torch.cuda.Stream()


@pytest.mark.parametrize("device", DEVICES)
def test_a_stream_is_named_after_what_it_was_assigned_to_or_by_the_user(device):
    """Verdict: one race per stream (each reads, unordered, what main wrote),
    each naming its stream: an attribute, the user's name, a comprehension's."""
    with streamfuzz.checked(device=device, collect=True) as check:
        loader = _Loader()
        quant = torch.cuda.Stream()
        check.name(quant, "quant")
        lanes = [torch.cuda.Stream() for _ in range(2)]
        kept = []
        for s in (loader.copy_stream, quant, *lanes):
            kept.append(torch.ones(4, device="cuda"))
            with torch.cuda.stream(s):
                kept[-1].sum()
    text = "\n".join(f.message for f in check.findings)
    assert _kinds(check) == ["race"] * 4, text
    for name in ("copy_stream", "quant", r"lanes\[0\]", r"lanes\[1\]"):
        assert re.search(rf"(^|\s){name} reads it", text, re.M), (name, text)
    assert "main's write" in text and "side" not in text


# -- fuzz targets ----------------------------------------------------------------------
LIFETIME = RunOptions(oracles={Oracle.LIFETIME})


def test_a_target_keeping_its_streams_for_the_process_is_judged_on_them(cpu_pool,
                                                                        ci_settings):
    """Verdicts over many examples of one rank process: the correct handler on
    streams cached at its first example is clean; the pre-fix one is found."""
    clean = driver.fuzz(cpu_pool, "tests.cuda_handlers:CachedStreamsMainGather", ci_settings,
                        max_examples=30, seed=0, options=LIFETIME)
    assert clean.failure is None, clean.failure
    found = driver.fuzz(cpu_pool, "tests.cuda_handlers:CachedStreamsPreFix", ci_settings,
                        max_examples=30, seed=0, options=LIFETIME)
    assert found.failure is not None and found.failure.kind == "lifetime", found.failure
    assert "while stream side may still use it" in found.failure.message


class _HandleOnly:
    """What the CUDA adapter reads of a ``torch.cuda.Stream``: its handle."""

    handles = iter(range(0xA0, 0x100))

    def __init__(self, device: object = None, priority: int = 0) -> None:
        self.cuda_stream = next(self.handles)


def test_on_cuda_a_stream_is_named_by_its_site_or_the_user(monkeypatch):
    """The CUDA adapter's names, without a GPU: the same rule as on CPU."""
    from streamfuzz.fuzz.oracles.lifetime import LifetimeModel, TensorTracker
    from streamfuzz.fuzz.oracles.lifetime_cuda import CudaLifetimeChecker
    from streamfuzz.fuzz.streams import CudaStreams

    monkeypatch.setattr(torch.cuda, "Stream", _HandleOnly)
    streams = CudaStreams(torch.device("cuda", 0))
    copy_stream = streams.Stream()
    lanes = [streams.Stream() for _ in range(2)]
    quant = streams.Stream()
    checker = CudaLifetimeChecker.__new__(CudaLifetimeChecker)  # no GPU: the naming part
    TensorTracker.__init__(checker, LifetimeModel(0, {0x1: "main"}), 0)
    checker.streams = streams
    checker.name_stream(quant, "quant")
    names = [checker.model.name_of(checker._sid(s.cuda_stream))
             for s in (copy_stream, *lanes, quant)]
    assert names == ["copy_stream", "lanes[0]", "lanes[1]", "quant"]
    assert checker.model.name_of(checker._sid(0xFFFF)) == "stream0xffff"  # made elsewhere


def test_a_copy_to_the_device_in_one_thread_does_not_make_another_threads_tensors_device_memory():
    """Verdict: a tensor another thread makes on the host (a DataLoader's pin
    thread) while this one copies to the device is host memory, and pins."""
    import threading

    from streamfuzz.fuzz.sim import memory as sim_memory
    from streamfuzz.fuzz.sim.stream_types import ACTIVE

    made: dict[str, torch.Tensor] = {}
    ready, done = threading.Event(), threading.Event()

    def pin_thread() -> None:
        ready.wait()
        made["host"] = torch.ones(4)
        made["pinned"] = made["host"].pin_memory()
        done.set()

    with streamfuzz.checked(device="cpu", collect=True) as check:
        memory = ACTIVE[-1].memory
        worker = threading.Thread(target=pin_thread)
        worker.start()

        def copy_while_the_other_thread_makes(t: torch.Tensor) -> torch.Tensor:
            ready.set()
            done.wait(30)
            return t.clone()

        on_device = sim_memory._making(memory, sim_memory.DEVICE_KIND,
                                       copy_while_the_other_thread_makes, torch.ones(4))
        worker.join()
        assert not made["host"].is_cuda and made["pinned"].is_pinned()
        assert on_device.is_cuda
    assert check.findings == []
