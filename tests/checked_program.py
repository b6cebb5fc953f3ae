"""A plain program, as a user has it (no streamfuzz import), for
``tests/test_check_command.py``: ``--fixed`` keeps the index alive with
``record_stream``; ``--child spawn|fork`` runs the same step in a child
process too; ``--exit N`` ends with status N."""

import argparse
import multiprocessing as mp
import sys

import torch


def step(fixed: bool) -> None:
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    idx = torch.arange(8, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        doubled = idx * 2
    if fixed:
        idx.record_stream(side)
    del idx
    main.wait_stream(side)
    assert doubled.shape == (8,)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--child", choices=("spawn", "fork"))
    p.add_argument("--only-child", action="store_true")
    p.add_argument("--exit", type=int, default=0)
    args = p.parse_args()
    if not args.only_child:
        step(args.fixed)
    if args.child:
        proc = mp.get_context(args.child).Process(target=step, args=(args.fixed,))
        proc.start()
        proc.join()
        print(f"child exit {proc.exitcode}")
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
