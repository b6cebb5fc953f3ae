"""Gates and the pointer-reuse signal on a real GPU (skipped without one)."""

import time

import pytest
import torch

from streamfuzz.fuzz import driver
from streamfuzz.fuzz.bench import crafted
from streamfuzz.fuzz.draft.scenario import Churn, Delay, Scenario, Step
from streamfuzz.fuzz.host import probe_gpus
from streamfuzz.fuzz.options import Hold, Oracle, RunOptions
from streamfuzz.fuzz.ranks import RankPool
from tests.helpers import parent_pid

GATES = RunOptions(oracles={Oracle.VALUE, Oracle.REUSE}, hold=Hold.GATE)
"""What a forced interleaving shows without the lifetime oracle, which would
find these bugs from the order of events, held or not."""

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.fixture(scope="module", params=["wait", "ptx", "triton"])
def gates(request):
    """Every gate test on each kind: the stream wait ranks load first, the PTX kernel and
    Triton's, which they fall back to."""
    from streamfuzz.fuzz.gates import Gates, GateUnavailable

    try:
        gates = Gates.create(torch.device("cuda", 0), bound_ms=200, kinds=(request.param,))
    except GateUnavailable as exc:
        pytest.fail(f"{request.param} gates unavailable on this GPU: {exc}")
    assert gates.kind == request.param
    # Load the kernels the tests queue behind gates: a first launch under lazy
    # module loading waits for the held gate (see streamfuzz.fuzz.gates).
    torch.cuda._sleep(1)
    torch.zeros(1, device="cuda").fill_(7).clone()
    torch.zeros(4, device="cuda").sum().item()
    torch.cuda.synchronize()
    return gates


def test_gate_holds_until_the_host_opens_it(gates):
    s = torch.cuda.Stream()
    g = gates.hold(s)
    after = torch.cuda.Event()
    after.record(s)
    time.sleep(0.02)
    assert not after.query()
    g.release()
    after.synchronize()
    assert not g.timed_out
    gates.reset()


def test_gate_opened_from_another_stream_orders_after_that_stream(gates):
    held, other = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(1, device="cuda")
    g = gates.hold(held)
    with torch.cuda.stream(other):
        torch.cuda._sleep(2_000_000)
        x.fill_(7)
    g.release_after(other)
    with torch.cuda.stream(held):
        seen = x.clone()  # runs only after other's fill
    torch.cuda.synchronize()
    assert seen.item() == 7 and not g.timed_out
    gates.reset()


def test_a_gate_held_from_a_thread_that_never_touched_cuda(gates):
    import threading

    s = torch.cuda.Stream()
    got = {}
    t = threading.Thread(target=lambda: got.update(g=gates.hold(s)))
    t.start()
    t.join()
    after = torch.cuda.Event()
    after.record(s)
    time.sleep(0.02)
    assert not after.query()
    got["g"].release()
    after.synchronize()
    assert not got["g"].timed_out
    gates.reset()


def test_a_gate_nobody_opens_times_out_instead_of_hanging(gates):
    s = torch.cuda.Stream()
    g = gates.hold(s)
    after = torch.cuda.Event()
    after.record(s)
    time.sleep(1.0)  # five times the bound, and nothing waits: no poll, no sync
    assert after.query() and g.timed_out and not g.opened
    gates.reset()


def test_a_timed_hold_waits_its_time_running_nothing_and_is_no_timeout(gates):
    s = torch.cuda.Stream()
    cycles = int(0.15 * gates._kernel.cycles_per_s) if gates.kind == "wait" else 1
    if not gates.hold_for(s, cycles):
        assert gates.kind != "wait"  # only the stream wait holds without running
        return
    after = torch.cuda.Event()
    after.record(s)
    time.sleep(0.02)
    assert not after.query()
    t = time.monotonic()
    after.synchronize()  # a host sync waits it out, as it would a spin
    assert 0.05 < time.monotonic() - t < 1.0
    assert not gates.finish_example()


def test_a_host_polling_gated_work_in_a_loop_opens_the_gate(gates):
    s = torch.cuda.Stream()
    g = gates.hold(s)
    after = torch.cuda.Event()
    after.record(s)
    assert not after.query()  # one "not done": the gate holds
    t = time.monotonic()
    while not after.query():  # the second poll in a row opens it
        assert time.monotonic() - t < 0.1, "the poll loop waited for the gate's bound"
    assert g.opened and g.opened_early == "the host polling it in a loop"
    torch.cuda.synchronize()
    assert not g.timed_out
    gates.reset()


def test_the_opening_streams_wait_on_gated_work_opens_the_gate(gates):
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    g = gates.hold(side, main)  # main is to open it, later
    with torch.cuda.stream(side):  # kernels the fixture loaded: no first launch behind the gate
        x = torch.zeros(4, device="cuda").fill_(2)
    main.wait_stream(side)  # main waits for side's work behind the gate: opens now
    assert g.opened and g.opened_early == "a wait of its opening stream"
    t = time.monotonic()
    assert x.sum().item() == 8  # the host waits for main, which waits for side
    assert time.monotonic() - t < 0.1 and not g.timed_out
    gates.reset()


def _sync_on_held(kind, s):
    """Make the host wait for work queued on the held stream ``s``, as ``kind`` does."""
    with torch.cuda.stream(s):
        x = torch.zeros(4, device="cuda").fill_(7)
    if kind == "stream":
        s.synchronize()
    elif kind == "event":
        e = torch.cuda.Event()
        e.record(s)
        e.synchronize()
    elif kind == "device":
        torch.cuda.synchronize()
    elif kind == "item":
        with torch.cuda.stream(s):
            assert x.sum().item() == 28
    elif kind == "tolist":
        with torch.cuda.stream(s):
            assert x.tolist() == [7.0] * 4
    elif kind == "blocking copy":
        with torch.cuda.stream(s):
            assert x.cpu().sum() == 28
    elif kind == "pinned event":
        pinned = torch.empty(4, pin_memory=True)
        with torch.cuda.stream(s):
            pinned.copy_(x, non_blocking=True)
            e = torch.cuda.current_stream().record_event()
        e.synchronize()
        assert pinned.tolist() == [7.0] * 4
    elif kind == "waiting stream":
        other = torch.cuda.Stream()
        other.wait_stream(s)
        other.synchronize()
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["stream", "event", "device", "item", "tolist",
                                  "blocking copy", "pinned event", "waiting stream"])
def test_a_host_sync_on_a_held_stream_opens_its_gate_first(gates, kind):
    # Without this the host waits out the bound and the gate reports a timeout.
    assert gates.hooked
    s = torch.cuda.Stream()
    before = gates.opened_by_sync
    g = gates.hold(s)
    _sync_on_held(kind, s)
    torch.cuda.synchronize()
    assert g.opened and not g.timed_out and gates.opened_by_sync == before + 1
    gates.reset()


def test_a_gate_opened_from_a_held_stream_is_opened_with_it(gates):
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    before = gates.opened_by_sync
    a = gates.hold(first)
    b = gates.hold(second)
    b.release_after(first)  # second resumes when first gets there: behind a
    second.synchronize()
    assert not a.timed_out and not b.timed_out and gates.opened_by_sync == before + 1
    gates.reset()


def test_a_host_sync_on_another_stream_leaves_the_gate_closed(gates):
    held, other = torch.cuda.Stream(), torch.cuda.Stream()
    before = gates.opened_by_sync
    g = gates.hold(held)
    _sync_on_held("stream", other)
    _sync_on_held("item", other)
    assert not g.opened and gates.opened_by_sync == before
    g.release()
    torch.cuda.synchronize()
    gates.reset()


@pytest.fixture(scope="module")
def gpu_pool():
    if probe_gpus() < 1:
        pytest.skip("needs a CUDA GPU")
    with RankPool(1, "cuda", timeout=60.0) as pool:
        assert pool.info[0].gates == "wait", pool.info[0].gates
        yield pool


def test_cuda_ranks_fork_from_a_zygote_that_never_started_cuda(gpu_pool):
    # The fixture's rank made its gates in a forked process: the zygote
    # counted the GPUs without starting CUDA.
    forker = gpu_pool._zygote
    assert forker is not None and forker.alive and forker.forks
    assert [parent_pid(p) for p in gpu_pool.pids] == [forker.proc.pid]
    first = gpu_pool.pids
    gpu_pool.restart()
    assert gpu_pool.pids != first and [parent_pid(p) for p in gpu_pool.pids] == [forker.proc.pid]
    assert gpu_pool.info[0].gates == "wait", gpu_pool.info[0].gates


def test_gates_force_the_pre_fix_reuse_every_time(gpu_pool):
    scn = crafted("reuse", 1)
    kinds = [driver.evaluate(gpu_pool, "pre-fix", scn, GATES) for _ in range(20)]
    assert all(not v.ok and v.first.kind == "reuse" and "gate" in v.held for v in kinds)


def test_reuse_is_reported_even_when_the_values_match(gpu_pool):
    # One request in slot 0; the main-stream churn writes 0 into its block: the
    # gather reads the same index, the values are right, the reuse is still wrong.
    step = Step(idx_mapping=(0,), final=(True,), num_sampled=(1,), num_rejected=(0,),
                churn=tuple(Churn("main", 1, "int64", 0, True) for _ in range(4)),
                delays=(Delay("pre_call", "side", 0, until="after_churn"),))
    scn = Scenario(world_size=1, max_num_reqs=4, steps=(step,))
    v = driver.evaluate(gpu_pool, "pre-fix", scn, GATES)
    assert [f.kind for f in v.failures] == ["reuse"], v.summary()
    assert driver.evaluate(gpu_pool, "pr-fix", scn, GATES).ok


def test_a_gate_timed_out_by_a_first_kernel_launch_is_run_again(gpu_pool):
    # The first example waits on a module load behind the held gate, which
    # times out; the driver runs it again and the forced reuse shows.
    v = driver.evaluate(gpu_pool, "tests.targets:first_launch", crafted("reuse", 1),
                        GATES)
    assert not v.ok and v.first.kind == "reuse", v.summary()
    assert "rerun" in v.held, v.held


def test_gates_force_the_pr_fix_write_after_read_every_time(gpu_pool):
    scn = crafted("war", 1)
    verdicts = [driver.evaluate(gpu_pool, "pr-fix", scn, GATES) for _ in range(20)]
    assert all(not v.ok and v.first.kind == "value" for v in verdicts)


@pytest.mark.parametrize("bug", ["reuse", "war"])
def test_main_gather_is_clean_under_the_same_gates(gpu_pool, bug):
    for _ in range(20):
        v = driver.evaluate(gpu_pool, "main-gather", crafted(bug, 1), GATES)
        assert v.ok and v.held == ["gate"], v.summary()


def _held_during_host_syncs():
    # main held before the call (the sender's .item() waits for it) and side
    # held before the call until after the churn (side.synchronize() waits for it).
    step = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(1, 1),
                num_rejected=(0, 1), delays=(Delay("pre_call", "main", 0, until="after_call"),
                                             Delay("pre_call", "side", 0, until="after_churn")))
    return Scenario(world_size=1, max_num_reqs=3, num_spec_steps=2, steps=(step, step))


@pytest.mark.parametrize("options", [GATES, RunOptions(hold=Hold.GATE)], ids=["gates", "all"])
def test_host_syncing_handler_never_waits_out_a_gate(gpu_pool, options):
    # Were a host sync to wait for a held gate, each run would say
    # gate-timeout and be run again (held: rerun).
    driver.evaluate(gpu_pool, "main-gather-synced", _held_during_host_syncs(), options)
    for _ in range(10):  # after a first run, which may load kernels while a gate holds
        v = driver.evaluate(gpu_pool, "main-gather-synced", _held_during_host_syncs(), options)
        assert v.ok and v.held == ["gate"], v.summary()


def test_the_oracles_read_the_current_stream_as_torch_does():
    from streamfuzz.fuzz.dispatch_mode import _RAW_STREAM, current_stream_handle

    assert _RAW_STREAM is not None  # the raw reader, not the fallback through Stream objects
    side = torch.cuda.Stream()
    dev = torch.device("cuda", torch.cuda.current_device())
    for s in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(s):
            assert current_stream_handle(dev) == s.cuda_stream
            assert current_stream_handle(torch.device("cuda")) == s.cuda_stream


def test_no_gate_times_out_early(gates):
    # Hundreds of gates, each opened from the host a millisecond in: the bound
    # is 200 ms, so any timeout here is the clock lying, not the gate waiting.
    early = 0
    s = torch.cuda.Stream()
    for _ in range(300):
        g = gates.hold(s)
        time.sleep(0.001)
        g.release()
        s.synchronize()
        early += g.timed_out
        gates.reset()
    assert early == 0, f"{early} of 300 gates reported a timeout within about 1 ms"


def _two_steps():
    step = Step(idx_mapping=(1, 0), final=(True, True), num_sampled=(1, 1), num_rejected=(0, 1))
    return Scenario(world_size=1, max_num_reqs=3, num_spec_steps=2, steps=(step, step))


@pytest.mark.parametrize(("target", "says"), [
    ("host-read-unsynced", "the host reads it (Tensor.tolist"),
    ("host-rewrites-staging", "the host writes it")])
def test_the_cuda_lifetime_oracle_sees_the_host_as_a_party(gpu_pool, target, says):
    v = driver.evaluate(gpu_pool, target, _two_steps(), RunOptions(oracles={Oracle.LIFETIME}))
    assert not v.ok and v.first.kind == "race" and says in v.first.message, v.summary()


@pytest.mark.parametrize("target", ["HostReadSynced", "StagingSynced", "StagingBlockingCopy",
                                    "PlainMainGather"])
def test_host_synced_pinned_memory_and_plain_torch_cuda_are_clean_on_cuda(gpu_pool, target):
    v = driver.evaluate(gpu_pool, f"tests.cuda_handlers:{target}", _two_steps(),
                        RunOptions(oracles={Oracle.VALUE, Oracle.LIFETIME}))
    assert v.ok, v.summary()


def test_plain_torch_cuda_pre_fix_is_found_on_cuda(gpu_pool):
    v = driver.evaluate(gpu_pool, "tests.cuda_handlers:PlainPreFix", _two_steps(),
                        RunOptions(oracles={Oracle.LIFETIME}))
    assert not v.ok and v.first.kind == "lifetime" and "idx_mapping" in v.first.message, \
        v.summary()


def test_a_race_made_in_a_thread_is_found_on_real_streams():
    import streamfuzz
    from tests.test_threads import _copy_out_of, _in_thread

    for wait in (False, True):
        with streamfuzz.checked(device="cuda", collect=True) as check:
            x = torch.arange(1 << 16, device="cuda") * 2
            ready = torch.cuda.Event()
            ready.record()
            out = []
            _in_thread(lambda: _copy_out_of(x, out, ready if wait else None))  # noqa: B023
            out[0].sum()
        races = [f for f in check.findings if f.kind == "race"]
        if wait:
            assert check.findings == [], check.findings
        else:
            assert races and "unordered with main's write" in races[0].message, check.findings
            assert "_copy_out_of" in races[0].message


def test_the_runner_stages_batches_in_registered_host_memory():
    from streamfuzz.fuzz.draft.runner import _Staging

    dev = torch.device("cuda", 0)
    staging = _Staging.begin(dev)
    assert staging is not None, "cudaHostRegister failed: batches are pinned one by one"
    a = staging.put(torch.arange(5, dtype=torch.int64))
    b = staging.put(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    assert a.is_pinned() and b.is_pinned() and b.data_ptr() % 16 == 0
    on_dev = [a.to(dev, non_blocking=True), b.to(dev, non_blocking=True)]
    torch.cuda.synchronize(dev)
    staging.done()
    assert on_dev[0].tolist() == [0, 1, 2, 3, 4] and on_dev[1].tolist() == [[1, 2], [3, 4]]


def test_an_async_collective_runs_on_nccls_stream_until_waited_for():
    # The same forms and verdicts as on the CPU simulation (tests/test_checked.py):
    # NCCL's own stream is read from the events its launch records.
    from tests.test_checked import async_collective_findings, check_async_collective_findings

    check_async_collective_findings(async_collective_findings("cuda"))


@pytest.mark.parametrize("early", ["1", "context", "0"])
def test_a_runs_first_cuda_rank_starts_cuda_and_nccl_beside_its_imports(tmp_path, early):
    import json
    import os
    import subprocess
    import sys

    from streamfuzz.fuzz import zygote
    from tests.helpers import ROOT

    report = tmp_path / "r.json"
    out = subprocess.run(
        [sys.executable, "-m", "streamfuzz", "run", "--device", "cuda", "--world-size", "1",
         "--target", "pre-fix", "--max-examples", "20", "--seed", "0", "--profile", "ci",
         "--shrink-budget", "1", "--corpus", str(tmp_path / "corpus"), "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, **{zygote.EARLY_ENV: early}))
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(report.read_text())
    assert [f["kind"] for f in data["failures"]] == ["lifetime"]
    phases = data["rank_start_s"]
    assert ("early_context" in phases) == (early != "0"), phases
    assert ("early_nccl" in phases) == (early == "1"), phases
    assert ("early_idle" in phases) == (early != "0"), phases


def test_worlds_sharing_the_gpu_run_under_a_private_mps_server(tmp_path):
    import json
    import shutil
    import subprocess
    import sys

    from streamfuzz.fuzz import mps
    from tests.helpers import ROOT

    if shutil.which(mps.CONTROL) is None:
        pytest.skip(f"{mps.CONTROL} is not on PATH")
    report = tmp_path / "r.json"
    out = subprocess.run(
        [sys.executable, "-m", "streamfuzz", "run", "--device", "cuda", "--world-size", "1",
         "--worlds", "2", "--mps", "on", "--target", "main-gather", "--target", "pre-fix",
         "--max-examples", "60", "--seed", "0", "--profile", "ci", "--shrink-budget", "1",
         "--corpus", str(tmp_path / "corpus"), "--report", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(report.read_text())
    assert data["gpu_sharing"] == "a private MPS server"
    assert {t["target"]: bool(t["failure"]) for t in data["targets"]} == {
        "main-gather": False, "pre-fix": True}
    left = subprocess.run(["pgrep", "-f", f"{mps.CONTROL} -f"], capture_output=True, text=True)
    assert not left.stdout.strip(), "the campaign's control daemon outlived it"
