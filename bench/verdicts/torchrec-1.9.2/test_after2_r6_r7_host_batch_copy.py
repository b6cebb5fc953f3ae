"""torchrec 1.9.2, ranks 6 and 7 after the rules of issue 49 item 1:
``TrainPipelineBase._copy_batch_to_gpu`` (train_pipelines.py l.365) and
``DataLoadingThread.run`` (utils.py l.790).

The scan reads the batch as last written on the current stream, and the
memcpy stream's copy of it as unordered with that write. Both take the data
loader's host batch and only copy it to the device on the memcpy stream
(``_to_device`` / ``batch.to(device, non_blocking=...)``): no stream wrote the
host batch, and the consumer waits for the memcpy stream before it reads the
copy (``_wait_for_batch``). Driven so, with a pinned host batch: clean; where
the current stream itself fills the pinned batch (a device-to-host copy just
before, what the scan's reading assumes), the copy is flagged. The
same shape on a worker thread is the rule "a thread's input read only as a
copy to the device"; here the batch is the function's own argument, or what
the thread's loop takes from the loader itself, which that rule does not cover.

Hand edits: the batch is a small ``Pipelineable`` whose ``to`` copies its one
tensor, as torchrec's batches do for each of theirs; ``_copy_batch_to_gpu``
runs on an object with the four attributes it reads, as a
``TrainPipelineBase`` sets them (its constructor needs a sharded model).
"""

import torch

from bench.verdicts import _kit

REL = "torchrec-1.9.2"
PIPELINES = "torchrec/distributed/train_pipeline/train_pipelines.py"
UTILS = "torchrec/distributed/train_pipeline/utils.py"


def _host_batch(module):
    batch_class = _kit.dense_batch_class(module.Pipelineable)
    return batch_class(torch.arange(64, dtype=torch.float32).pin_memory())


def _copy_batch_to_gpu(filled_on_device=False):
    module = _kit.release(REL, PIPELINES).module
    device = torch.ones(1, device="cuda").device
    memcpy = torch.cuda.Stream()
    pipeline = _kit.Obj(_enable_inplace_copy_batch=False, _memcpy_stream=memcpy,
                        _device=device, _stream_context=torch.cuda.stream)
    batch = _host_batch(module)
    if filled_on_device:  # what the scan's reading assumes: the current stream wrote it
        batch.dense.copy_(torch.ones(64, device="cuda"), non_blocking=True)
    module.TrainPipelineBase._copy_batch_to_gpu(pipeline, batch)
    torch.cuda.current_stream().wait_stream(memcpy)  # _wait_for_batch
    pipeline._cur_batch.record_stream(torch.cuda.current_stream())
    return pipeline._cur_batch.dense.sum()


def _data_loading_thread():
    module = _kit.release(REL, UTILS).module
    device = torch.ones(1, device="cuda").device
    loader = iter([_host_batch(module), _host_batch(module)])
    thread = module.DataLoadingThread(device, loader, to_device_non_blocking=True)
    thread.start()
    sums = []
    for _ in range(2):
        batch = thread.get_next_batch()
        torch.cuda.current_stream().wait_stream(thread._memcpy_stream)  # _wait_for_batch
        batch.record_stream(torch.cuda.current_stream())
        sums.append(batch.dense.sum())
    assert thread.get_next_batch() is None  # the loader ran out: the thread's loop ended
    # (no join: the class's ``_stop`` flag shadows the method ``Thread.join`` calls)
    return sums


def test_r6_copy_batch_to_gpu_as_the_pipeline_calls_it_clean():
    assert _kit.findings(_copy_batch_to_gpu) == []


def test_r6_flagged_where_the_current_stream_wrote_the_host_batch():
    assert any("race" in f for f in _kit.findings(_copy_batch_to_gpu, filled_on_device=True))


def test_r7_data_loading_thread_as_the_pipeline_drives_it_clean():
    assert _kit.findings(_data_loading_thread) == []
