import ctypes, os, sys, time, json, traceback
import torch, triton, triton.language as tl
sys.path.insert(0, ".")
from fuzz.gates import Gates
print("env", {k: v for k, v in os.environ.items() if k.startswith(("PYTORCH", "CUDA", "NCCL", "TORCH"))})
dev = torch.device("cuda", 0)
g = Gates.create(dev, bound_ms=200)
print("kind", g.kind)

@triton.jit
def opener(slot_ptr):
    tl.atomic_xchg(slot_ptr, 1, sem="release", scope="sys")

class P:
    dtype = torch.int32
    def __init__(s, a): s.a = a
    def data_ptr(s): return s.a

lib = ctypes.CDLL("libcuda.so.1")
wv = getattr(lib, "cuStreamWriteValue32_v2", None) or lib.cuStreamWriteValue32
wv.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]

def rel_copy(gate, s): gate.release_after(s)
def rel_triton(gate, s):
    with torch.cuda.stream(s):
        opener[(1,)](P(g._base + 16 * gate.slot))
def rel_cu(gate, s):
    r = wv(ctypes.c_void_p(s.cuda_stream), g._base + 16 * gate.slot, 1, 0)
    assert r == 0, r

for name, fn in [("copy", rel_copy), ("triton", rel_triton), ("cuwrite", rel_cu)]:
    for prior in (False, True):
        res = []
        for _ in range(5):
            held, other = torch.cuda.Stream(), torch.cuda.Stream()
            x = torch.zeros(1, device="cuda")
            gate = g.hold(held)
            with torch.cuda.stream(other):
                if prior:
                    torch.cuda._sleep(2_000_000)
                x.fill_(7)
            t = time.perf_counter()
            try:
                fn(gate, other)
            except Exception as e:
                res.append(repr(e)[:100]); gate.release(); torch.cuda.synchronize(); g.reset(); continue
            with torch.cuda.stream(held):
                seen = x.clone()
            torch.cuda.synchronize()
            res.append((seen.item(), gate.timed_out, round((time.perf_counter() - t) * 1e3, 2)))
            g.reset()
        print(name, "prior" if prior else "idle", res, flush=True)
# also: main (default) stream held, opened from other, and other held opened from main
for name, fn in [("copy", rel_copy), ("triton", rel_triton), ("cuwrite", rel_cu)]:
    res = []
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    for _ in range(3):
        gate = g.hold(side)
        t = time.perf_counter()
        torch.cuda._sleep(1_000_000)
        fn(gate, main)
        torch.cuda.synchronize()
        res.append((gate.timed_out, round((time.perf_counter() - t) * 1e3, 2)))
        g.reset()
    print("side held, opened from main:", name, res, flush=True)

# reuse: in-process 1-rank world
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
import torch.distributed as dist
dist.init_process_group("nccl", init_method="env://", device_id=dev)
grp = dist.new_group(backend="nccl")
from fuzz import targets
from fuzz.bench import crafted
from fuzz.oracles import reuse
from fuzz.runner import run_scenario
from fuzz.streams import CudaStreams
from fuzz.targets import TargetContext
orig_check, orig_note = reuse.ReuseWatch.check, reuse.ReuseWatch._note
def check(self, t, what):
    s = t.untyped_storage()
    print("  alloc", what, hex(s.data_ptr()), s.nbytes(), "live", [(hex(e[0]), e[4], e[2].query()) for e in self._used])
    return orig_check(self, t, what)
def note(self, op, ts, stream):
    print("  note", op, [hex(t.untyped_storage().data_ptr()) for t in ts], stream)
    return orig_note(self, op, ts, stream)
reuse.ReuseWatch.check, reuse.ReuseWatch._note = check, note
fac = targets.load("pre-fix")
for hold in ("gate", "spin"):
    for i in range(2):
        scn = crafted("reuse", 1)
        ctx = TargetContext(rank=0, world_size=1, last_rank=0, device=dev, group=grp,
                            max_num_reqs=scn.max_num_reqs, num_spec_steps=scn.num_spec_steps,
                            streams=CudaStreams(dev, g))
        obs = run_scenario(scn, fac, ctx, {"hold": hold, "oracles": ("value", "reuse")})
        print(hold, i, "held", obs["held"], "findings", [f["kind"] for f in obs["findings"]], flush=True)
dist.destroy_process_group()
