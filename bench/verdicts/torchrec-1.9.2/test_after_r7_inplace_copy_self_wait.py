"""torchrec 1.9.2, rank 7 after the rules: ``EvalPipelineCPUSparse._inplace_copy_to_gpu`` (l.519).

The memcpy stream's wait is ``self._memcpy_stream.wait_stream(<device>.current_stream())``
taken *inside* ``self._stream_context(self._memcpy_stream)``: there the current
stream is the memcpy stream itself, so the stream waits on itself and orders
nothing. The GPU buffers are allocated on the training stream
(``torch.empty_like``) and the memcpy stream writes them unordered with that
stream's earlier work on the same blocks. The fixed twin takes the current
stream before entering the context.

Driven as the pipeline's stage 2 calls it from ``fill_pipeline`` and, with
``pipeline_depth == 1``, from each step's ``_sparse_forward`` (with depth 2,
``progress`` makes the memcpy stream wait for the current stream before the
call, which covers it): the previous step's output, read on the training
stream and dropped, leaves its block to the next allocation of that stream;
the buffer the function allocates gets it, and the memcpy stream writes it.
The release is flagged; the twin is clean.

Hand edits: ``KeyedTensor`` and ``LazyNoWait`` are small classes with what the
function reads (the real ones need fbgemm), values on pinned host memory; the
batch is a small object whose ``to`` returns itself (its dense copy is not the
finding).
"""

import torch

from bench.verdicts import _kit

REL = "torchrec-1.9.2"
FILE = "torchrec/distributed/train_pipeline/experimental_pipelines.py"
OLD = ("            with self._stream_context(self._memcpy_stream):\n"
       "                if self._memcpy_stream:\n"
       "                    self._memcpy_stream.wait_stream(\n"
       "                        torch.get_device_module(self._device).current_stream()\n"
       "                    )\n")
NEW = ("            _training = torch.get_device_module(self._device).current_stream()\n"
       "            with self._stream_context(self._memcpy_stream):\n"
       "                if self._memcpy_stream:\n"
       "                    self._memcpy_stream.wait_stream(_training)\n")


class _Batch:
    def to(self, *args, **kwargs):
        return self


class _KeyedTensor:
    """torchrec's ``KeyedTensor`` as the function reads it (the real one needs fbgemm)."""

    def __init__(self, keys, length_per_key, values):
        self._keys, self._lengths, self._values = keys, length_per_key, values

    def keys(self):
        return self._keys

    def length_per_key(self):
        return self._lengths

    def values(self):
        return self._values


class _LazyNoWait:
    def __init__(self, obj):
        self._obj = obj


def _step(module):
    module.KeyedTensor, module.LazyNoWait = _KeyedTensor, _LazyNoWait
    cls = module.EvalPipelineCPUSparse
    pipe = cls.__new__(cls)
    pipe._device = torch.ones(1, device="cuda").device
    pipe._memcpy_stream = torch.cuda.Stream()
    pipe._stream_context = torch.cuda.stream
    values = torch.ones(16, 4).pin_memory()
    kt = module.KeyedTensor(keys=["f"], length_per_key=[4], values=values)
    context = _kit.Obj(index=0, embedding_a2a_requests={"ebc": module.LazyNoWait(kt)},
                       gpu_embedding_outputs={})
    previous = torch.zeros(16, 4, device="cuda")
    previous.add_(1.0)
    previous.sum()  # the last step's kernels on the training stream, still queued
    del previous    # its block goes back to the training stream's pool
    pipe._inplace_copy_to_gpu(_Batch(), context)
    torch.cuda.current_stream().wait_stream(pipe._memcpy_stream)  # the consumer's wait
    return context.gpu_embedding_outputs



def test_release_flagged():
    found = _kit.findings(_step, _kit.release(REL, FILE).module)
    assert found, found


def test_fixed_twin_clean():
    assert _kit.findings(_step, _kit.twin(REL, FILE, OLD, NEW).module) == []
