"""A plain two-rank program, as ``torchrun`` starts it (no streamfuzz import), for
``tests/test_check_command.py``: rank 0 broadcasts on a side stream, and main
reads the result with no wait unless ``--fixed``."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
side = torch.cuda.Stream()
x = torch.full((8,), float(dist.get_rank()), device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    dist.broadcast(x, src=0)
if "--fixed" in sys.argv:
    torch.cuda.current_stream().wait_stream(side)
print(dist.get_rank(), float((x * 2).sum()))
dist.destroy_process_group()
