"""torchrec 1.9.2, rank 10: ``AsyncInplaceCopyMixin._submit_inplace_copy._work`` (l.1085).

The scan reads ``batch`` as last written on the submitter's stream (what a
thread did not make, it takes as made there). The batch is the data loader's
host batch: the worker copies it to the device under the stream the main
thread captured (``alloc_stream``), and the main thread's training stream is
that same stream, so the copy and its consumer are one stream's work in
order. Driven as the pipeline does (a pinned host batch submitted to the
mixin's real one-worker executor, the future's result read on the training
stream): clean.

Hand edits: the batch is a small ``Pipelineable`` whose ``to`` copies its one
tensor, as torchrec's batches do for each of theirs.
"""

import torch

import streamfuzz
from bench.verdicts import _kit

REL = "torchrec-1.9.2"
FILE = "torchrec/distributed/train_pipeline/utils.py"


def _step():
    module = _kit.release(REL, FILE).module
    batch_class = _kit.dense_batch_class(module.Pipelineable)
    mixin = module.AsyncInplaceCopyMixin()
    device = torch.ones(1, device="cuda").device
    mixin._setup_async_inplace_copy(True, device)  # the pipeline passes its indexed device
    host = batch_class(torch.arange(64, dtype=torch.float32).pin_memory())  # the data loader's
    future = mixin._submit_inplace_copy(host, device, torch.cuda.Stream())
    on_device = future.result()
    out = on_device.dense.sum()  # the training stream consumes the batch
    mixin._shutdown_async_inplace_copy()
    return out


def test_as_the_pipeline_submits_it_clean():
    with streamfuzz.checked(collect=True) as check:
        _step()
    assert [str(f) for f in check.findings] == []
