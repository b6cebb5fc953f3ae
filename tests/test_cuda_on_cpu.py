"""CUDA on CPU: plain torch.cuda code on simulated streams, and nothing left
patched once the example is over."""

import pytest
import torch

from streamfuzz.fuzz import driver, targets
from streamfuzz.fuzz.draft.scenario import Scenario
from streamfuzz.fuzz.options import Oracle, RunOptions
from streamfuzz.fuzz.sim import cuda_on_cpu
from streamfuzz.fuzz.sim.cuda_on_cpu import NotSimulated
from streamfuzz.fuzz.streams import SimEvent, SimStream, SimStreams
from tests.helpers import one_step

LIFETIME = RunOptions(oracles={Oracle.LIFETIME})


def _names(module):
    return {n: v for n, v in vars(module).items() if not n.startswith("__")}


def test_cuda_devices_become_cpu_tensors_that_stand_for_device_memory():
    api = SimStreams()
    with api.session():
        mem = api.memory
        made = [torch.empty(3, device="cuda"), torch.zeros(2, device=torch.device("cuda", 0)),
                torch.tensor([1, 2], device="cuda:0"), torch.arange(4, device=api.device),
                torch.full((2,), 7, device="cuda")]
        # CPU memory underneath, standing for device memory, and answering as such.
        assert all(t.untyped_storage().device.type == "cpu" and mem.kind(t) == "device"
                   and t.device == torch.device("cuda", 0) for t in made)
        host = torch.tensor([1, 2])
        assert mem.kind(host) == "pageable" and not host.is_pinned()
        pinned = host.pin_memory()
        assert mem.kind(pinned) == "pinned" and pinned.is_pinned()
        assert mem.kind(torch.empty(2, pin_memory=True)) == "pinned"
        for dev in (host.cuda(), host.to("cuda"), pinned.to("cuda", non_blocking=True),
                    host.to(device="cuda"), host.to(made[0])):
            assert mem.kind(dev) == "device"
            assert dev.untyped_storage().data_ptr() != host.untyped_storage().data_ptr()
        d = made[2]
        assert d.cuda() is d and d.to("cuda") is d
        assert mem.kind(d + 1) == "device" and mem.kind(d[:1]) == "device"
        assert mem.kind(d.cpu()) == "pageable" and mem.kind(d.to("cpu")) == "pageable"
        assert mem.kind(d.to("cpu", non_blocking=True)) == "pinned"  # as torch pins it
        assert d.tolist() == [1, 2] and d.cpu().tolist() == [1, 2]


def test_torch_cuda_and_accelerator_run_on_the_simulated_streams():
    api = SimStreams()
    seen = []
    api.listeners.append(lambda what, *args: seen.append(what))
    with api.session():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.current_device() == 0
        torch.cuda.set_device(0)
        side = torch.cuda.Stream()
        assert isinstance(side, SimStream) and isinstance(side, torch.cuda.Stream)
        assert torch.cuda.current_stream() is api.main
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() is side
            assert torch.accelerator.current_stream() is side
            side.wait_stream(api.main)
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        assert isinstance(ev, SimEvent) and ev.query()
        api.main.wait_event(ev)
        torch.cuda.set_stream(side)
        assert torch.cuda.current_stream() is side
        torch.accelerator.set_stream(api.main)
        torch.cuda.synchronize()
        torch.accelerator.synchronize()
        assert ev.elapsed_time(ev) == 0.0
        t = torch.ones(2, device="cuda")
        t.record_stream(side)
    assert {"new_stream", "wait_stream", "record_event", "wait_event", "sync_device",
            "record_stream"} <= set(seen)


def test_the_device_generic_stream_and_event_are_simulated_on_a_cuda_device():
    api = SimStreams()
    seen = []
    api.listeners.append(lambda what, *args: seen.append(what))
    real = torch.Stream
    with api.session():
        for side in (torch.Stream(device="cuda"), torch.Stream("cuda:0", priority=-1),
                     torch.Stream(), torch.Stream(device=torch.accelerator.current_accelerator())):
            assert isinstance(side, SimStream) and isinstance(side, torch.Stream)
            with torch.cuda.stream(side):
                assert torch.cuda.current_stream() is side
        assert issubclass(SimStream, torch.Stream)
        ev = torch.Event(device="cuda")
        ev.record(side)
        assert isinstance(ev, SimEvent)
        cpu = torch.Stream(device="cpu")  # torch's own
        assert not isinstance(cpu, SimStream) and isinstance(cpu, torch.Stream)
        with pytest.raises(NotSimulated):
            torch.Stream(device="cuda:1")
    assert torch.Stream is real
    assert seen.count("new_stream") == 4


def test_device_queries_answer_for_one_hopper_class_card():
    # Engine code picks kernels and buffer sizes by capability and memory at
    # start-up (vLLM calls get_device_capability in well over a hundred places).
    api = SimStreams()
    with api.session():
        assert torch.cuda.get_device_capability() == (9, 0)
        assert torch.cuda.get_device_capability("cuda:0") == (9, 0)
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor) == torch.cuda.get_device_capability(0)
        assert props.total_memory > 2**30 and props.multi_processor_count > 0
        assert torch.cuda.get_device_name(torch.device("cuda", 0)) == props.name
        for call in (torch.cuda.get_device_capability, torch.cuda.get_device_properties,
                     torch.cuda.get_device_name):
            with pytest.raises(NotSimulated):
                call(1)


def test_streams_answer_for_their_priority_and_device():
    api = SimStreams()
    with api.session():
        least, greatest = torch.cuda.Stream.priority_range()
        assert least == 0 and greatest < 0
        assert torch.cuda.Stream(priority=-1).priority == -1
        assert torch.cuda.Stream(priority=-100).priority == greatest  # clamped, as CUDA does
        assert torch.cuda.current_stream().priority == 0
        side = torch.cuda.Stream()
        assert side.device == torch.device("cuda", 0)
        # Made on the stream's device: device memory, as on a GPU.
        assert api.memory.kind(torch.zeros(2, device=side.device)) == "device"
        assert torch.cuda.is_bf16_supported() and torch.cuda.get_arch_list() == ["sm_90"]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass


def test_nvtx_annotations_run_and_order_nothing():
    # Engine code wraps its stream work in NVTX ranges; a CPU-only torch raises
    # for them, the simulation lets them through as the annotations they are.
    api = SimStreams()
    with api.session():
        assert torch.cuda.nvtx.range_push("outer") == 0
        assert torch.cuda.nvtx.range_push("inner") == 1
        assert torch.cuda.nvtx.range_pop() == 1 and torch.cuda.nvtx.range_pop() == 0
        with torch.cuda.nvtx.range("block %d", 1):
            torch.cuda.nvtx.mark("here")
            torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("r"))


def test_what_is_not_simulated_says_so_in_one_line():
    api = SimStreams()
    with api.session():
        for call in (torch.cuda.CUDAGraph, lambda: torch.cuda.graph(None),
                     torch.cuda.memory_snapshot, lambda: torch.cuda.set_device(1),
                     lambda: torch.cuda._sleep(10)):
            with pytest.raises(NotSimulated) as err:
                call()
            assert "\n" not in str(err.value) and "not simulated on --device cpu" in str(
                err.value)
    assert str(err.value) == ("torch.cuda._sleep is not simulated on --device cpu (see "
                              "docs/cuda-on-cpu.md); run this target with --device cuda")


def test_every_patch_is_restored_after_the_session_even_on_error():
    cuda, accel = _names(torch.cuda), _names(torch.accelerator)
    graphs, nvtx = _names(torch.cuda.graphs), _names(torch.cuda.nvtx)
    generic = (torch.Stream, torch.Event)
    real_gpu = torch.cuda.is_available()
    with pytest.raises(ZeroDivisionError), SimStreams().session():
        assert torch.cuda.is_available()
        raise ZeroDivisionError
    assert _names(torch.cuda) == cuda and _names(torch.accelerator) == accel
    assert _names(torch.cuda.graphs) == graphs and _names(torch.cuda.nvtx) == nvtx
    assert (torch.Stream, torch.Event) == generic
    assert torch.cuda.is_available() == real_gpu
    if not real_gpu:
        with pytest.raises((RuntimeError, AssertionError)):  # torch's own "not compiled" error
            torch.empty(1, device="cuda")  # the device mode is gone too
    else:
        assert torch.empty(1, device="cuda").device.type == "cuda"  # a real one, not the mode's
    assert torch.empty(2, device="cpu").tolist() is not None
    assert cuda_on_cpu.DEVICE.type == "cuda"


def test_a_device_generic_handler_finds_pre_fix_on_cpu(cpu_pool):
    v = driver.evaluate(cpu_pool, "tests.cuda_handlers:GenericStreamPreFix", one_step(),
                        LIFETIME)
    assert v.first.kind == "lifetime" and v.first.message.startswith("idx_mapping"), v.summary()


def test_an_unmodified_torch_cuda_handler_finds_pre_fix_on_cpu(cpu_pool, ci_settings):
    v = driver.evaluate(cpu_pool, "tests.cuda_handlers:PlainPreFix", one_step(), LIFETIME)
    assert v.first.kind == "lifetime" and v.first.message.startswith("idx_mapping")
    assert "cuda_handlers.py" in v.first.message
    res = driver.fuzz(cpu_pool, "tests.cuda_handlers:PlainPreFix", ci_settings,
                      max_examples=200, seed=0, options=LIFETIME)
    assert res.failure is not None and res.failure.kind == "lifetime"
    clean = driver.fuzz(cpu_pool, "tests.cuda_handlers:PlainMainGather", ci_settings,
                        max_examples=30, seed=0,
                        options=RunOptions(oracles={Oracle.LIFETIME, Oracle.VALUE}))
    assert clean.failure is None


def test_targets_written_against_ctx_streams_still_work(cpu_pool):
    scn = Scenario(world_size=2, max_num_reqs=3, num_spec_steps=2,
                   steps=(one_step().steps[0],) * 2)
    spec = "streamfuzz.fuzz.draft.targets.pp_draft_streams:"
    assert driver.evaluate(cpu_pool, spec + "pre_fix", scn, LIFETIME).first.kind == "lifetime"
    assert driver.evaluate(cpu_pool, spec + "pr_fix", scn, LIFETIME).first.kind == "race"
    assert driver.evaluate(cpu_pool, spec + "main_gather", scn,
                           RunOptions(oracles={Oracle.VALUE, Oracle.LIFETIME})).ok
    assert driver.evaluate(cpu_pool, "tests.targets:streams_receiver_no_wait", scn,
                           LIFETIME).first.kind == "race"


def test_a_target_needing_cuda_graphs_gets_one_line(cpu_pool):
    # Its handler makes a graph when built: no example can run, a setup error.
    with pytest.raises(targets.TargetError) as info:
        driver.evaluate(cpu_pool, "tests.cuda_handlers:UsesGraphs", one_step(), LIFETIME)
    assert "torch.cuda.CUDAGraph is not simulated on --device cpu" in str(info.value)
    assert "its factory raises on the smallest scenario" in str(info.value)
    assert "\n" not in str(info.value)
