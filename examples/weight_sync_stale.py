"""Stale weights from vLLM's packed NCCL weight broadcast, on one GPU, no fuzzer.

``packed_nccl_broadcast_producer`` (vllm/distributed/weight_transfer/
packed_tensor.py) packs the parameters with ``torch.cat`` on its own buffer
streams, which never wait on the caller's stream. A trainer that calls it (as
``NCCLWeightTransferEngine.send_weights`` -> ``_broadcast`` does with
``packed=True``) right after its optimizer step, while the step's kernels are
still queued on the caller's stream, can therefore broadcast the parameters'
old bytes.

Here the optimizer step is one ``fill_`` per parameter, queued on the default
stream behind a ``torch.cuda._sleep`` (a kernel that is still running when the
producer is called). The group stands in for ``PyNcclCommunicator``: its
``broadcast`` clones the packed buffer on the current stream, where NCCL would
read it. Each trial counts the elements whose bytes are not the step's values.

    python examples/weight_sync_stale.py [--trials 20] [--cycles 1000000]

Needs a CUDA GPU and an installed vLLM (the producer is imported from it,
unchanged). Exit status 1 when stale bytes were sent without a synchronize.
"""

from __future__ import annotations

import argparse
import sys

import torch


class CloningGroup:
    """One-GPU stand-in for the transfer group: keeps what NCCL would have sent."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def broadcast(self, tensor: torch.Tensor, src: int = 0, stream: object = None) -> None:
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            self.sent.append(tensor.clone())


def trial(producer: object, defaults: tuple[int, int], *, cycles: int, sync_first: bool,
          params: int, numel: int) -> int:
    """One optimizer step then one send; returns how many elements were stale."""
    weights = [torch.zeros(numel, device="cuda") for _ in range(params)]
    torch.cuda.synchronize()
    if cycles:
        torch.cuda._sleep(cycles)  # the step's earlier kernels, still running
    for i, w in enumerate(weights):
        w.fill_(float(i + 1))  # the optimizer's write, on the default stream
    if sync_first:
        torch.cuda.synchronize()
    group = CloningGroup()
    buffer_size_bytes, num_buffers = defaults
    producer(iterator=iter([(f"w{i}", w) for i, w in enumerate(weights)]), group=group, src=0,
             post_iter_func=lambda item: item[1], buffer_size_bytes=buffer_size_bytes,
             num_buffers=num_buffers)
    torch.cuda.synchronize()
    sent = torch.cat(group.sent).view(torch.float32)
    return int((sent != torch.cat(weights)).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--cycles", type=int, default=1_000_000,
                    help="GPU cycles the default stream is busy before the write (~0.5 ms)")
    ap.add_argument("--params", type=int, default=4)
    ap.add_argument("--numel", type=int, default=64 * 1024)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("weight_sync_stale: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import vllm
        from vllm.distributed.weight_transfer import packed_tensor
    except ImportError as exc:
        print(f"weight_sync_stale: needs an installed vLLM ({exc})", file=sys.stderr)
        return 2
    producer = packed_tensor.packed_nccl_broadcast_producer
    defaults = (packed_tensor.DEFAULT_PACKED_BUFFER_SIZE_BYTES,
                packed_tensor.DEFAULT_PACKED_NUM_BUFFERS)
    total = args.params * args.numel
    print(f"vLLM {vllm.__version__}, {torch.cuda.get_device_name()}, {args.params} float32 "
          f"parameters of {args.numel} elements, buffer {defaults[0]} B x {defaults[1]}")
    stale_runs = 0
    for label, cycles, sync_first in (("kernel in flight", args.cycles, False),
                                      ("kernel in flight, synchronize first", args.cycles, True),
                                      ("no kernel in flight", 0, False)):
        counts = [trial(producer, defaults, cycles=cycles, sync_first=sync_first,
                        params=args.params, numel=args.numel) for _ in range(args.trials)]
        bad = sum(c > 0 for c in counts)
        print(f"  {label}: {bad} of {args.trials} trials sent stale bytes "
              f"(stale elements per trial: max {max(counts)} of {total})")
        if label == "kernel in flight":
            stale_runs = bad
    return 1 if stale_runs else 0


if __name__ == "__main__":
    sys.exit(main())
