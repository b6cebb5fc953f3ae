"""The GPU trace callbacks a c10d op's launch makes, in order, on a one-rank NCCL
group: what the CUDA lifetime oracle reads NCCL's stream from
(``streamfuzz.fuzz.oracles.lifetime_cuda``). Prints one line per callback, streams and
events by name. Needs a GPU; for ``bench/gpu_goals.sh``."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.cuda import _gpu_trace as trace


def main() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    names: dict[int, str] = {}
    seen: list[str] = []

    def name(kind: str, handle: int) -> str:
        return names.setdefault(handle, f"{kind}{sum(v.startswith(kind) for v in names.values())}")

    trace.register_callback_for_event_record(
        lambda e, s: seen.append(f"record {name('event', e)} on {name('stream', s)}"))
    trace.register_callback_for_event_wait(
        lambda e, s: seen.append(f"wait {name('stream', s)} for {name('event', e)}"))
    trace.register_callback_for_event_synchronization(
        lambda e: seen.append(f"host sync {name('event', e)}"))
    torch._C._activate_gpu_trace()
    main_stream = torch.cuda.current_stream().cuda_stream
    names[main_stream] = "stream-main"
    x = torch.ones(1 << 16, device="cuda")
    for label, body in (
            ("blocking broadcast", lambda: dist.broadcast(x, src=0)),
            ("async broadcast", lambda: dist.broadcast(x, src=0, async_op=True)),
            ("async broadcast, wait()", lambda: dist.broadcast(x, src=0, async_op=True).wait()),
            ("async broadcast, future wait()",
             lambda: dist.broadcast(x, src=0, async_op=True).get_future().wait()),
            ("all_reduce async, wait()",
             lambda: dist.all_reduce(x, async_op=True).wait())):
        torch.cuda.synchronize()
        seen.clear()
        body()
        print(f"{label}: {'; '.join(seen) or 'no callbacks'}", flush=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
