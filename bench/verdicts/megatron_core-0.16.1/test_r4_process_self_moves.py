"""megatron-core 0.16.1, rank 4 of its scan after the rules of issue 49's second
reading: ``PipelineExecutor.process_self_moves``
(resharding/nvshmem_copy_service/core/pipeline_executor.py l.260).

``RemoteCopyService.run`` (nvshmem_copy_service/service.py) ends with
``process_self_moves``, which copies every registered send whose destination
is this PE into its receive buffer on ``torch_copy_stream``, with no wait for
the current stream; it synchronizes that stream on the host after. Nothing
before it in ``run()`` orders the current stream: the barriers and ``sync()``
are on the NVSHMEM send stream. Driven through the service's own API
(``register_send`` and ``register_receive`` to its own PE, then ``run()``),
with the source written on the current stream just before.

The release cannot reach the copy: its first statement per self-move,
``PELogger.debug("...%d...", task_id, size)`` (l.255), passes printf-style
arguments to a ``debug(cls, msg)`` that takes one, and raises ``TypeError``
before any copy is launched (so does ``PELogger.info`` after the loop). And
megatron's own path never hands it a self-move: ``NVSHMEMCopyService`` keeps
same-rank transfers out of the remote service (rank 3 is that path's copy).
So the missing wait is latent: with a logger that takes the arguments the
calls pass, the copy is flagged, and the fixed twin (the copy stream waiting
for the current one first) is clean.

Hand edits: the service is built without ``init()`` (NVSHMEM, cuda.core
streams): its resources are initialized on PE 0 of 2, the send stream a plain
stream whose ``sync()`` synchronizes it, the executor the release's own with a
plain stream as its copy stream; ``schedule()`` (which gathers plans over
``torch.distributed`` and builds cupy pointer arrays) is replaced by the
schedule it makes for same-PE traffic only: one iteration with neither a send
nor a receive (same-PE batches are skipped in ``_prepare_iter_schedules``).
``nvshmem.core``'s barrier and quiet are stood in by the loader (no tensors).
For the latent hazard only, ``PELogger`` takes printf-style arguments.
"""

import pytest
import torch

import streamfuzz
from bench.verdicts import _kit

REL = "megatron_core-0.16.1"
FILE = "megatron/core/resharding/nvshmem_copy_service/core/pipeline_executor.py"
SERVICE = "megatron/core/resharding/nvshmem_copy_service/service.py"
FIX = ("        with torch.cuda.stream(self.torch_copy_stream):\n",
       "        self.torch_copy_stream.wait_stream(torch.cuda.current_stream())\n"
       "        with torch.cuda.stream(self.torch_copy_stream):\n")
DEV = torch.device("cuda", 0)


def _service(executor_module):
    module = _kit.release(REL, SERVICE).module
    send_stream = torch.cuda.Stream()
    service = module.RemoteCopyService.__new__(module.RemoteCopyService)
    service.gpu_resources = _kit.Obj(initialized=True, my_pe=0, n_pes=2, device=DEV,
                                     send_stream=_kit.Obj(sync=send_stream.synchronize))
    service.send_requests, service.receive_requests = [], []
    executor = executor_module.PipelineExecutor(None, None, my_pe=0)
    copy_stream = torch.cuda.Stream()
    executor.set_streams(None, None, service.gpu_resources.send_stream, None,
                         None, None, copy_stream)
    service.pipeline_executor = executor
    return service


def _printf_logger(module):
    quiet = staticmethod(lambda msg, *args: None)
    module.PELogger = type("PELogger", (), {"debug": quiet, "info": quiet})
    return module


def _self_move(loaded, printf_logger=True):
    service = _service(_printf_logger(loaded.module) if printf_logger else loaded.module)
    src = torch.arange(64, dtype=torch.float32, device=DEV)
    src.mul_(2.0)  # the caller's last write, on the current stream
    dst = torch.empty(64, dtype=torch.float32, device=DEV)
    nbytes = src.numel() * src.element_size()
    service.register_send(task_id=3, src_tensor=src.view(torch.uint8), src_pos=0,
                          size=nbytes, dest_pe=0)
    service.register_receive(task_id=3, dest_tensor=dst.view(torch.uint8), dest_pos=0,
                             size=nbytes, src_pe=0)
    service.iter_schedules, service.num_iterations = [{"send": None, "recv": None}], 1
    service.run()
    return dst.sum()


def test_r4_release_raises_before_its_first_copy():
    with pytest.raises(TypeError, match="debug"), streamfuzz.checked():
        _self_move(_kit.release(REL, FILE), printf_logger=False)


def test_r4_self_move_with_a_printf_logger_flagged():
    found = _kit.findings(_self_move, _kit.release(REL, FILE))
    assert any("read-after-write" in f and "aten.mul_" in f for f in found), found


def test_r4_fixed_twin_clean():
    assert _kit.findings(_self_move, _kit.twin(REL, FILE, *FIX)) == []


def test_r4_refit_path_registers_no_self_move():
    nvshmem = _kit.release(REL, "megatron/core/resharding/copy_services/nvshmem_copy_service.py")
    service = nvshmem.module.NVSHMEMCopyService.__new__(nvshmem.module.NVSHMEMCopyService)
    service.rank, service._initialized = 0, True
    service._local_send_ops, service._local_recv_ops = {}, {}
    with streamfuzz.checked():
        service._remote = _service(_kit.release(REL, FILE).module)
        tensor = torch.zeros(8, device=DEV)
        service.submit_send_with_id(1, tensor, 0)
        service.submit_recv_with_id(1, torch.empty_like(tensor), 0)
    assert service._remote.send_requests == [] and service._remote.receive_requests == []
    assert list(service._local_send_ops) == [1] and list(service._local_recv_ops) == [1]
