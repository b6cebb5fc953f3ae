"""LMCache 0.5.6, rank 1: ``MessagingFuture.to_cuda_future`` (l.213) calls
``to_device_future(device)`` without ``event_backend=``.

``event_backend`` is no event: it is the platform's IPC backend, and
``DeviceMessagingFuture.__init__`` resolves it when it is left out
(``get_event_ipc_backend(device)``). Either way the device future orders its
consumer through the server's imported event (``wait_on_stream``).

Driven as an adapter consumes a retrieve: the server's work writes a buffer on
its stream and hands back an event handle; the client's future is made with
and without the argument, ``wait_on_stream(current_stream)``, then the current
stream reads the buffer. Both clean, and with the import's wait left out the
read is flagged (the ordering is the event's, which both paths use).

Hand edits: ``to_cuda_future`` is called through ``__wrapped__`` (its
deprecation wrapper's log fails on a log level the loader stood in); the IPC
backend is a small object whose handles are the events
themselves (no CUDA IPC on CPU); ``get_event_ipc_backend`` returns it, as the
platform registry would.
"""

import pytest
import torch

from bench.verdicts import _kit

REL = "lmcache-0.5.6"
FILE = "lmcache/v1/multiprocess/futures.py"


class _Backend:
    def __init__(self, wait=True):
        self.events, self.wait = {}, wait

    def check_event_support(self, device):
        return None

    def import_event(self, handle, device):
        return self.events[handle]

    def wait_event(self, event, stream):
        if self.wait:
            stream.wait_event(event)


def _consume(pass_backend, wait=True):
    module = _kit.release(REL, FILE).module
    backend = _Backend(wait)
    module.get_event_ipc_backend = lambda device: backend
    server = torch.cuda.Stream()
    buffer = torch.zeros(32, device="cuda")
    server.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(server):
        buffer.add_(1.0)  # the server's transfer into the client's buffer
        done = torch.cuda.Event()
        done.record(server)
    backend.events[b"h"] = done
    raw = module.MessagingFuture()
    raw.set_result((b"h", "ok"))
    device = buffer.device
    # to_cuda_future's own body: its deprecation wrapper only logs
    to_cuda_future = module.MessagingFuture.to_cuda_future.__wrapped__
    fut = raw.to_device_future(device, backend) if pass_backend else to_cuda_future(raw, device)
    fut.wait_on_stream(torch.cuda.current_stream())
    out = buffer.sum()
    buffer.record_stream(server)
    return out



@pytest.mark.parametrize("pass_backend", [False, True])
def test_with_and_without_the_backend_clean(pass_backend):
    assert _kit.findings(_consume, pass_backend) == []


def test_without_the_events_wait_flagged():
    assert any("read-after-write" in f for f in _kit.findings(_consume, False, False))
