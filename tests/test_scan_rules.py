"""``streamfuzz scan``'s rules about code shapes, each in a hazard form that must be
reported and a safe form that must not.

Each pair is small and written here; the shapes are those of published bugs and of
false alarms on engine releases, with names of our own, so that a rule learned here
holds for code the scan has never seen.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from streamfuzz.fuzz.scan import scan
from streamfuzz.fuzz.scan.hazards import Finding, Hazard
from streamfuzz.fuzz.scan.sources import open_source
from tests.helpers import ROOT


@dataclass(frozen=True)
class Rule:
    hazard: str  # source whose function must be reported (as ``cls``, on ``tensor``)
    safe: str  # its twin, in which that function must have no finding at all
    cls: Hazard
    function: str
    tensor: str = ""  # a tensor the finding must name, where it matters


# a value made on a side stream by a helper its caller runs there, put in a context
# object's container, and taken out and used by another object on its own stream
_HANDED = '''
    import torch

    class Lookup:
        def __init__(self, table):
            self.table = table
            self.side = torch.cuda.Stream()

        def start(self, ctx, name, ids):
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                _launch(self.table, ctx, name, ids)

    def _launch(table, ctx, name, ids):
        rows = table.lookup(ids)
        ctx.pending[name] = rows

    class Consumer:
        def __init__(self, ctx, side):
            self._ctx = ctx
            self._side = side

        def forward(self, name):
            torch.cuda.current_stream().wait_stream(self._side)
            rows = self._ctx.pending.pop(name)
            out = rows.values()
            return out.sum()
    '''

# a host buffer rewritten each call by a function with no stream words and copied to
# the device by its own object's non-blocking helper, outside the section whose event
# sync covers the copies made inside it
_REWRITTEN = '''
    import contextlib
    import torch

    class HostDeviceBuffer:
        def __init__(self, n):
            self.cpu = torch.zeros(n, dtype=torch.bool, pin_memory=True)
            self.gpu = torch.zeros(n, dtype=torch.bool, device="cuda")
            self.np = self.cpu.numpy()

        def to_device(self, n):
            return self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)

    class Runner:
        def __init__(self, n):
            self.ready = torch.cuda.Event()
            self.ids = HostDeviceBuffer(n)
            self.mask = HostDeviceBuffer(n)

        @contextlib.contextmanager
        def prepare(self):
            self.ready.synchronize()
            try:
                yield
            finally:
                self.ready.record()

        def step(self, batch):
            with self.prepare():
                ids = self.fill_ids(batch)
            mask = self.gather(batch)
            return ids, mask

        def fill_ids(self, batch):
            self.ids.np[: len(batch)] = batch
            return self.ids.to_device(len(batch))

        def gather(self, batch):
            mask = self.mask.cpu
            mask[: len(batch)] = False
            for i, x in enumerate(batch):
                if x < 0:
                    mask[i] = True
            return self.mask.to_device(len(batch))
    '''


RULES: dict[str, Rule] = {
    "streams-in-a-dict-keyed-by-literals": Rule('''
        import torch

        class Pipe:
            def __init__(self):
                self._streams = {"copy": torch.cuda.Stream(), "compute": torch.cuda.Stream()}

            def step(self, x):
                main = torch.cuda.current_stream()
                self._streams["copy"].wait_stream(main)
                self._streams["compute"].wait_stream(main)
                with torch.cuda.stream(self._streams["copy"]):
                    staged = x.clone()
                with torch.cuda.stream(self._streams["compute"]):
                    out = staged + 1
                main.wait_stream(self._streams["compute"])
                staged.record_stream(self._streams["compute"])
                x.record_stream(self._streams["copy"])
                out.record_stream(main)
                return out
        ''', '''
        import torch

        class Pipe:
            def __init__(self):
                self._streams = {"copy": torch.cuda.Stream(), "compute": torch.cuda.Stream()}

            def step(self, x):
                main = torch.cuda.current_stream()
                self._streams["copy"].wait_stream(main)
                self._streams["compute"].wait_stream(main)
                with torch.cuda.stream(self._streams["copy"]):
                    staged = x.clone()
                self._streams["compute"].wait_stream(self._streams["copy"])
                with torch.cuda.stream(self._streams["compute"]):
                    out = staged + 1
                main.wait_stream(self._streams["compute"])
                staged.record_stream(self._streams["compute"])
                x.record_stream(self._streams["copy"])
                out.record_stream(main)
                return out
        ''', Hazard.UNORDERED, "Pipe.step", "staged"),
    "streams-in-a-list-by-index": Rule('''
        import torch

        def two_phase(x, streams):
            main = torch.cuda.current_stream()
            for s in streams:
                s.wait_stream(main)
            with torch.cuda.stream(streams[0]):
                y = x.mul(2)
            with torch.cuda.stream(streams[1]):
                z = y.add(1)
            main.wait_stream(streams[1])
            y.record_stream(streams[1])
            z.record_stream(main)
            return z
        ''', '''
        import torch

        def two_phase(x, streams):
            main = torch.cuda.current_stream()
            for s in streams:
                s.wait_stream(main)
            with torch.cuda.stream(streams[0]):
                y = x.mul(2)
            streams[1].wait_stream(streams[0])
            with torch.cuda.stream(streams[1]):
                z = y.add(1)
            main.wait_stream(streams[1])
            y.record_stream(streams[1])
            z.record_stream(main)
            return z
        ''', Hazard.UNORDERED, "two_phase", "y"),
    "a-list-of-named-streams": Rule('''
        import torch

        class Pipe:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
                self.compute_stream = torch.cuda.Stream()

            def step(self, x):
                cur = torch.cuda.current_stream()
                streams = [self.copy_stream, self.compute_stream]
                with torch.cuda.stream(streams[0]):
                    y = x.clone()
                cur.wait_stream(self.copy_stream)
                y.record_stream(cur)
                x.record_stream(streams[0])
                return y
        ''', '''
        import torch

        class Pipe:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
                self.compute_stream = torch.cuda.Stream()

            def step(self, x):
                cur = torch.cuda.current_stream()
                streams = [self.copy_stream, self.compute_stream]
                self.copy_stream.wait_stream(cur)
                with torch.cuda.stream(streams[0]):
                    y = x.clone()
                cur.wait_stream(self.copy_stream)
                y.record_stream(cur)
                x.record_stream(streams[0])
                return y
        ''', Hazard.UNORDERED, "Pipe.step", "x"),
    "streams-unpacked-from-a-container": Rule('''
        import torch

        class Pipe:
            def __init__(self):
                self._streams = (torch.cuda.Stream(), torch.cuda.Stream())

            def step(self, x):
                cur = torch.cuda.current_stream()
                load_s, run_s = self._streams
                with torch.cuda.stream(self._streams[0]):
                    y = x.clone()
                cur.wait_stream(load_s)
                y.record_stream(cur)
                x.record_stream(load_s)
                return y
        ''', '''
        import torch

        class Pipe:
            def __init__(self):
                self._streams = (torch.cuda.Stream(), torch.cuda.Stream())

            def step(self, x):
                cur = torch.cuda.current_stream()
                load_s, run_s = self._streams
                load_s.wait_stream(cur)
                with torch.cuda.stream(self._streams[0]):
                    y = x.clone()
                cur.wait_stream(load_s)
                y.record_stream(cur)
                x.record_stream(load_s)
                return y
        ''', Hazard.UNORDERED, "Pipe.step", "x"),
    "a-dict-of-streams-by-any-name": Rule('''
        import torch

        class Pipe:
            def __init__(self):
                self._pool = {"h2d": torch.cuda.Stream(), "d2h": torch.cuda.Stream()}

            def up(self, x, out):
                self._pool["d2h"].wait_stream(torch.cuda.current_stream())  # the other one
                with torch.cuda.stream(self._pool["h2d"]):
                    out.copy_(x, non_blocking=True)
                x.record_stream(self._pool["h2d"])
                out.record_stream(self._pool["h2d"])
        ''', '''
        import torch

        class Pipe:
            def __init__(self):
                self._pool = {"h2d": torch.cuda.Stream(), "d2h": torch.cuda.Stream()}

            def up(self, x, out):
                self._pool["h2d"].wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self._pool["h2d"]):
                    out.copy_(x, non_blocking=True)
                x.record_stream(self._pool["h2d"])
                out.record_stream(self._pool["h2d"])
        ''', Hazard.UNORDERED, "Pipe.up", "x"),
    "a-stream-context-of-another-package": Rule('''
        import torch

        def save(io, x, host):
            with io.copy_stream_ctx():
                host.copy_(x, non_blocking=True)
        ''', '''
        import torch

        def save(io, x, host):
            host.copy_(x, non_blocking=True)
        ''', Hazard.UNORDERED, "save", "x"),
    "set-to-none-in-another-method": Rule('''
        import torch

        class Drafts:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
                self.ids_cpu = torch.empty(64, dtype=torch.int64, pin_memory=True)

            def copy_out(self, ids):
                self.ids = ids
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.copy_stream):
                    self.ids_cpu.copy_(self.ids, non_blocking=True)

            def reset(self):
                self.ids = None
        ''', '''
        import torch

        class Drafts:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
                self.ids_cpu = torch.empty(64, dtype=torch.int64, pin_memory=True)

            def copy_out(self, ids):
                self.ids = ids
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.copy_stream):
                    self.ids_cpu.copy_(self.ids, non_blocking=True)

            def reset(self):
                torch.cuda.current_stream().wait_stream(self.copy_stream)
                self.ids = None
        ''', Hazard.LIFETIME, "Drafts.reset", "self.ids"),
    "an-attribute-made-only-when-unset": Rule('''
        import torch

        class Noise:
            def __init__(self):
                self.stream = torch.cuda.Stream()

            def fork(self, n):
                self.noise = torch.empty(n, device="cuda")
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.noise.uniform_()
        ''', '''
        import torch

        class Noise:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.noise = None

            def fork(self, n):
                if self.noise is None:
                    self.noise = torch.empty(n, device="cuda")
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.noise.uniform_()
        ''', Hazard.LIFETIME, "Noise.fork", "self.noise"),
    "a-pinned-buffer-made-fresh-each-time-round": Rule('''
        import torch

        def upload(chunks, n, device):
            staging = torch.empty(n, dtype=torch.int32, pin_memory=True)
            out = []
            for c in chunks:
                staging.copy_(c)
                out.append(staging.to(device, non_blocking=True))
            return out
        ''', '''
        import torch

        def upload(chunks, n, device):
            out = []
            for c in chunks:
                staging = torch.empty(n, dtype=torch.int32, pin_memory=True)
                staging.copy_(c)
                out.append(staging.to(device, non_blocking=True))
            return out
        ''', Hazard.PINNED_REWRITE, "upload", "staging"),
    "an-identity-test-of-an-item-reads-nothing": Rule('''
        import torch

        class Aux:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.buf = torch.zeros(2, 8, device="cuda")

            def fork(self, x, i):
                total = self.buf[i].sum()
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.buf[i].copy_(x)
                x.record_stream(self.stream)
                return total
        ''', '''
        import torch

        class Aux:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.buf = torch.zeros(2, 8, device="cuda")

            def fork(self, x, i):
                empty = self.buf[i] is None
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.buf[i].copy_(x)
                x.record_stream(self.stream)
                return empty
        ''', Hazard.UNORDERED, "Aux.fork", "self.buf"),
    "a-saved-current-stream-passed-inside-another-streams-context": Rule('''
        import torch

        def _lookup(x: torch.Tensor, source_stream, target_stream):
            source_stream.wait_stream(torch.cuda.current_stream())
            x.record_stream(source_stream)
            with torch.cuda.stream(source_stream):
                kjt = x * 2
            torch.cuda.current_stream().wait_stream(source_stream)
            kjt.record_stream(target_stream)
            return kjt.sum()

        def start(x, side, source):
            current = torch.cuda.current_stream()
            with torch.cuda.stream(side):
                _lookup(x, source, target_stream=current)
        ''', '''
        import torch

        def _lookup(x: torch.Tensor, source_stream, target_stream):
            source_stream.wait_stream(torch.cuda.current_stream())
            x.record_stream(source_stream)
            with torch.cuda.stream(source_stream):
                kjt = x * 2
            torch.cuda.current_stream().wait_stream(source_stream)
            kjt.record_stream(target_stream)
            return kjt.sum()

        def start(x, side, source):
            current = torch.cuda.current_stream()
            _lookup(x, source, target_stream=current)
        ''', Hazard.LIFETIME, "_lookup", "kjt"),
    "free-through-helpers-in-another-method": Rule('''
        import torch

        def _free_storage(t):
            t.untyped_storage().resize_(0)

        class Offloader:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.buf = None

            def start(self, x):
                self.buf = torch.empty_like(x)
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.buf.copy_(x)

            def finish(self):
                self._drop()

            def _drop(self):
                self._release()

            def _release(self):
                _free_storage(self.buf)
        ''', '''
        import torch

        def _free_storage(t):
            t.untyped_storage().resize_(0)

        class Offloader:
            def __init__(self):
                self.stream = torch.cuda.Stream()
                self.buf = None

            def start(self, x):
                self.buf = torch.empty_like(x)
                self.stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.stream):
                    self.buf.copy_(x)
                self.buf.record_stream(self.stream)

            def finish(self):
                self._drop()

            def _drop(self):
                self._release()

            def _release(self):
                _free_storage(self.buf)
        ''', Hazard.LIFETIME, "Offloader._release", "self.buf"),
    "del-in-another-method": Rule('''
        import torch

        class Stash:
            def __init__(self):
                self.side = torch.cuda.Stream()

            def save(self, x):
                self.side.wait_stream(torch.cuda.current_stream())
                self.host = torch.empty(x.shape, device="cpu", pin_memory=True)
                self.dev = x.clone()
                with torch.cuda.stream(self.side):
                    self.host.copy_(self.dev, non_blocking=True)

            def drop(self):
                del self.dev
        ''', '''
        import torch

        class Stash:
            def __init__(self):
                self.side = torch.cuda.Stream()

            def save(self, x):
                self.side.wait_stream(torch.cuda.current_stream())
                self.host = torch.empty(x.shape, device="cpu", pin_memory=True)
                self.dev = x.clone()
                with torch.cuda.stream(self.side):
                    self.host.copy_(self.dev, non_blocking=True)

            def drop(self):
                torch.cuda.current_stream().wait_stream(self.side)
                del self.dev
        ''', Hazard.LIFETIME, "Stash.drop", "self.dev"),
    "record-stream-then-resize-is-a-free": Rule('''
        import torch

        def stash(x, side):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                host = x.to("cpu", non_blocking=True)
            x.untyped_storage().resize_(0)
            return host
        ''', '''
        import torch

        def stash(x, side):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                host = x.to("cpu", non_blocking=True)
            x.record_stream(side)
            x.untyped_storage().resize_(0)
            return host
        ''', Hazard.LIFETIME, "stash", "x"),
    "event-recorded-on-a-saved-current-stream": Rule('''
        import torch

        class Handler:
            def __init__(self):
                self.main = torch.cuda.current_stream()
                self.comm = torch.cuda.Stream()

            def send(self, table, idx_mapping):
                with torch.cuda.stream(self.comm):
                    rows = table[idx_mapping]
                    self._bcast(rows)
                table.record_stream(self.comm)
                idx_mapping.record_stream(self.comm)
        ''', '''
        import torch

        class Handler:
            def __init__(self):
                self.main = torch.cuda.current_stream()
                self.comm = torch.cuda.Stream()

            def send(self, table, idx_mapping):
                ready = torch.cuda.Event()
                ready.record(self.main)
                self.comm.wait_event(ready)
                with torch.cuda.stream(self.comm):
                    rows = table[idx_mapping]
                    self._bcast(rows)
                table.record_stream(self.comm)
                idx_mapping.record_stream(self.comm)
        ''', Hazard.UNORDERED, "Handler.send", "table"),
    "buffers-made-in-a-list-on-the-side-stream": Rule('''
        import torch

        class Receiver:
            def __init__(self):
                self.main = torch.cuda.current_stream()
                self.side = torch.cuda.Stream()
                self.parked = []

            def receive(self, n):
                got = [torch.empty((n,), device="cuda"), torch.empty((n, 4), device="cuda")]
                with torch.cuda.stream(self.side):
                    for t in got:
                        self._bcast(t)
                        t.record_stream(self.main)
                    done = torch.cuda.Event()
                    done.record(self.side)
                self.parked.append((got, done))
        ''', '''
        import torch

        class Receiver:
            def __init__(self):
                self.main = torch.cuda.current_stream()
                self.side = torch.cuda.Stream()
                self.parked = []

            def receive(self, n):
                with torch.cuda.stream(self.side):
                    got = [torch.empty((n,), device="cuda"),
                           torch.empty((n, 4), device="cuda")]
                    for t in got:
                        self._bcast(t)
                        t.record_stream(self.main)
                    done = torch.cuda.Event()
                    done.record(self.side)
                self.parked.append((got, done))
        ''', Hazard.UNORDERED, "Receiver.receive", "got"),
    "stream-context-returned-by-a-method": Rule('''
        import torch

        class Copier:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()

            def _copy_ctx(self):
                return torch.cuda.stream(self.copy_stream)

            def save(self, x, host):
                with self._copy_ctx():
                    host.copy_(x, non_blocking=True)
                x.record_stream(self.copy_stream)
                host.record_stream(self.copy_stream)
        ''', '''
        import torch

        class Copier:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()

            def _copy_ctx(self):
                return torch.cuda.stream(self.copy_stream)

            def save(self, x, host):
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with self._copy_ctx():
                    host.copy_(x, non_blocking=True)
                x.record_stream(self.copy_stream)
                host.record_stream(self.copy_stream)
        ''', Hazard.UNORDERED, "Copier.save", "x"),
    "a-platforms-stream-switch-context-manager": Rule('''
        from contextlib import contextmanager

        import torch

        @contextmanager
        def switch_stream(stream):
            prev = torch.cuda.current_stream()
            torch.cuda.set_stream(stream)
            try:
                yield
            finally:
                torch.cuda.set_stream(prev)

        def offload(x, side):
            with switch_stream(side):
                host = x.to("cpu", non_blocking=True)
            x.record_stream(side)
            return host
        ''', '''
        from contextlib import contextmanager

        import torch

        @contextmanager
        def switch_stream(stream):
            prev = torch.cuda.current_stream()
            torch.cuda.set_stream(stream)
            try:
                yield
            finally:
                torch.cuda.set_stream(prev)

        def offload(x, side):
            side.wait_stream(torch.cuda.current_stream())
            with switch_stream(side):
                host = x.to("cpu", non_blocking=True)
            x.record_stream(side)
            return host
        ''', Hazard.UNORDERED, "offload", "x"),
    "set-stream-in-the-function-itself": Rule('''
        import torch

        def offload(x, side):
            prev = torch.cuda.current_stream()
            torch.cuda.set_stream(side)
            host = x.to("cpu", non_blocking=True)
            torch.cuda.set_stream(prev)
            x.record_stream(side)
            return host
        ''', '''
        import torch

        def offload(x, side):
            prev = torch.cuda.current_stream()
            side.wait_stream(prev)
            torch.cuda.set_stream(side)
            host = x.to("cpu", non_blocking=True)
            torch.cuda.set_stream(prev)
            x.record_stream(side)
            return host
        ''', Hazard.UNORDERED, "offload", "x"),
    "a-wait-inside-the-helper-that-returns-the-stream": Rule('''
        import torch

        class Loader:
            def __init__(self):
                self.side_stream = torch.cuda.Stream()

            def _side(self):
                return self.side_stream

            def load(self, src, dst):
                with torch.cuda.stream(self._side()):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(self.side_stream)
                dst.record_stream(self.side_stream)
        ''', '''
        import torch

        class Loader:
            def __init__(self):
                self.side_stream = torch.cuda.Stream()

            def _side(self):
                self.side_stream.wait_stream(torch.cuda.current_stream())
                return self.side_stream

            def load(self, src, dst):
                with torch.cuda.stream(self._side()):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(self.side_stream)
                dst.record_stream(self.side_stream)
        ''', Hazard.UNORDERED, "Loader.load", "src"),
    "a-stream-bound-from-a-helpers-result": Rule('''
        import torch

        class Loader:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()

            def _pick(self):
                return self.copy_stream

            def load(self, src, dst):
                s = self._pick()
                with torch.cuda.stream(s):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(s)
                dst.record_stream(s)
        ''', '''
        import torch

        class Loader:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()

            def _pick(self):
                return self.copy_stream

            def load(self, src, dst):
                s = self._pick()
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(s)
                dst.record_stream(s)
        ''', Hazard.UNORDERED, "Loader.load", "src"),
    "a-stream-given-by-a-call-of-another-package": Rule('''
        import torch
        from elsewhere import get_copy_stream

        def stage(x, out):
            with torch.cuda.stream(get_copy_stream()):
                out.copy_(x, non_blocking=True)
            x.record_stream(get_copy_stream())
            out.record_stream(get_copy_stream())
        ''', '''
        import torch
        from elsewhere import get_copy_stream

        def stage(x, out):
            get_copy_stream().wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(get_copy_stream()):
                out.copy_(x, non_blocking=True)
            x.record_stream(get_copy_stream())
            out.record_stream(get_copy_stream())
        ''', Hazard.UNORDERED, "stage", "x"),
    "a-wait-done-by-every-caller": Rule('''
        import torch

        class Offload:
            def __init__(self):
                self.d2h = torch.cuda.Stream()

            def _copy_out(self, src, dst):
                with torch.cuda.stream(self.d2h):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(self.d2h)
                dst.record_stream(self.d2h)

            def save(self, src, dst):
                self.d2h.wait_stream(torch.cuda.current_stream())
                self._copy_out(src, dst)

            def save_all(self, pairs):
                for src, dst in pairs:
                    self._copy_out(src, dst)
        ''', '''
        import torch

        class Offload:
            def __init__(self):
                self.d2h = torch.cuda.Stream()

            def _copy_out(self, src, dst):
                with torch.cuda.stream(self.d2h):
                    dst.copy_(src, non_blocking=True)
                src.record_stream(self.d2h)
                dst.record_stream(self.d2h)

            def save(self, src, dst):
                self.d2h.wait_stream(torch.cuda.current_stream())
                self._copy_out(src, dst)

            def save_all(self, pairs):
                self.d2h.wait_stream(torch.cuda.current_stream())
                for src, dst in pairs:
                    self._copy_out(src, dst)
        ''', Hazard.UNORDERED, "Offload._copy_out", "src"),
    "a-stream-parameter-every-caller-passes-the-current-stream": Rule('''
        import torch

        def _launch(x, out, stream):
            with torch.cuda.stream(stream):
                out.copy_(x)

        def run(x, out):
            _launch(x, out, torch.cuda.current_stream())

        def run_aside(x, out):
            side = torch.cuda.Stream()
            _launch(x, out, stream=side)
        ''', '''
        import torch

        def _launch(x, out, stream):
            with torch.cuda.stream(stream):
                out.copy_(x)

        def run(x, out):
            _launch(x, out, torch.cuda.current_stream())

        def run_here(x, out):
            cur = torch.cuda.current_stream()
            _launch(x, out, stream=cur)
        ''', Hazard.UNORDERED, "_launch", "x"),
    "a-previous-calls-trailing-wait": Rule('''
        import torch

        class Ring:
            def __init__(self):
                self.side = torch.cuda.Stream()
                self.buf = torch.zeros(8, device="cuda")

            def step(self, x):
                with torch.cuda.stream(self.side):
                    y = self.buf * 2
                torch.cuda.current_stream().wait_stream(self.side)
                y.record_stream(torch.cuda.current_stream())
                self.buf.copy_(x)
                return y
        ''', '''
        import torch

        class Ring:
            def __init__(self):
                self.side = torch.cuda.Stream()
                self.buf = torch.zeros(8, device="cuda")

            def step(self, x):
                with torch.cuda.stream(self.side):
                    y = self.buf * 2
                torch.cuda.current_stream().wait_stream(self.side)
                y.record_stream(torch.cuda.current_stream())
                self.buf.copy_(x)
                self.side.wait_stream(torch.cuda.current_stream())
                return y
        ''', Hazard.UNORDERED, "Ring.step", "self.buf"),
    "a-collectives-future-waited": Rule('''
        import torch.distributed as dist

        def reduce(grad):
            work = dist.all_reduce(grad, async_op=True)
            fut = work.get_future()
            grad.mul_(0.5)
            fut.wait()
        ''', '''
        import torch.distributed as dist

        def reduce(grad):
            work = dist.all_reduce(grad, async_op=True)
            fut = work.get_future()
            fut.wait()
            grad.mul_(0.5)
        ''', Hazard.ASYNC_COLLECTIVE, "reduce", "grad"),
    "async-work-waited-in-another-method": Rule('''
        import torch.distributed as dist

        class Reducer:
            def __init__(self):
                self.pending = []

            def start(self, grad):
                dist.all_reduce(grad, async_op=True)
                self.pending.append(grad)

            def finish(self):
                for work, grad in self.pending:
                    work.wait()
                    grad.mul_(0.5)
        ''', '''
        import torch.distributed as dist

        class Reducer:
            def __init__(self):
                self.pending = []

            def start(self, grad):
                work = dist.all_reduce(grad, async_op=True)
                self.pending.append((work, grad))

            def finish(self):
                for work, grad in self.pending:
                    work.wait()
                    grad.mul_(0.5)
        ''', Hazard.ASYNC_COLLECTIVE, "Reducer.start"),
    "disjoint-chunks-of-one-tensor": Rule('''
        import torch

        def fill(buf, a, b, side):
            lo, hi = buf.chunk(2)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                lo.copy_(a)
            lo.add_(b)
            torch.cuda.current_stream().wait_stream(side)
            a.record_stream(side)
            buf.record_stream(side)
        ''', '''
        import torch

        def fill(buf, a, b, side):
            lo, hi = buf.chunk(2)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                lo.copy_(a)
            hi.add_(b)
            torch.cuda.current_stream().wait_stream(side)
            a.record_stream(side)
            buf.record_stream(side)
        ''', Hazard.UNORDERED, "fill", "buf"),
    "the-two-sides-of-one-cut": Rule('''
        import torch

        def fill(buf, a, b, n, side):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                buf[:n].copy_(a)
            buf[:n].copy_(b)
            torch.cuda.current_stream().wait_stream(side)
            a.record_stream(side)
            buf.record_stream(side)
        ''', '''
        import torch

        def fill(buf, a, b, n, side):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                buf[:n].copy_(a)
            buf[n:].copy_(b)
            torch.cuda.current_stream().wait_stream(side)
            a.record_stream(side)
            buf.record_stream(side)
        ''', Hazard.UNORDERED, "fill", "buf"),
    "a-stream-and-its-buffer-chosen-in-one-branch": Rule('''
        import torch

        class Dual:
            def __init__(self):
                self.side = torch.cuda.Stream()
                self.side_buf = torch.zeros(8, device="cuda")
                self.main_buf = torch.zeros(8, device="cuda")

            def put(self, x, aside):
                if aside:
                    stream, buf = self.side, self.side_buf
                else:
                    stream, buf = torch.cuda.current_stream(), self.main_buf
                with torch.cuda.stream(stream):
                    buf.copy_(x)
                x.record_stream(stream)
        ''', '''
        import torch

        class Dual:
            def __init__(self):
                self.side = torch.cuda.Stream()
                self.side_buf = torch.zeros(8, device="cuda")
                self.main_buf = torch.zeros(8, device="cuda")

            def put(self, x, aside):
                if aside:
                    stream, buf = self.side, self.side_buf
                else:
                    stream, buf = torch.cuda.current_stream(), self.main_buf
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    buf.copy_(x)
                x.record_stream(stream)
        ''', Hazard.UNORDERED, "Dual.put", "self.side_buf"),
    # a platform's switch helper, given the stream a getter call returns (vllm-ascend #13397)
    "a-switch-helper-given-a-stream-getter-call": Rule('''
        from contextlib import nullcontext
        import torch

        _SIDE = None

        def side_stream():
            global _SIDE
            if _SIDE is None:
                _SIDE = torch.cuda.Stream()
            return _SIDE

        def switch_to(target, *, enabled=True):
            if not enabled:
                return nullcontext()
            return torch.cuda.stream(target)

        def noisy_argmax(probs):
            with switch_to(side_stream()):
                noise = torch.empty_like(probs)
                noise.exponential_()
            torch.cuda.current_stream().wait_stream(side_stream())
            return probs.div_(noise).argmax(dim=-1)
        ''', '''
        from contextlib import nullcontext
        import torch

        _SIDE = None

        def side_stream():
            global _SIDE
            if _SIDE is None:
                _SIDE = torch.cuda.Stream()
            return _SIDE

        def switch_to(target, *, enabled=True):
            if not enabled:
                return nullcontext()
            return torch.cuda.stream(target)

        def noisy_argmax(probs):
            with switch_to(side_stream()):
                noise = torch.empty_like(probs)
                noise.exponential_()
            torch.cuda.current_stream().wait_stream(side_stream())
            noise.record_stream(torch.cuda.current_stream())
            return probs.div_(noise).argmax(dim=-1)
        ''', Hazard.LIFETIME, "noisy_argmax", "noise"),
    # the same, the switch imported from a platform module the scan does not read
    "a-foreign-stream-switch-given-a-stream": Rule('''
        import torch
        from .platform import stream_switch

        def noisy_argmax(probs, side_stream):
            with stream_switch(side_stream):
                noise = torch.rand_like(probs)
            torch.cuda.current_stream().wait_stream(side_stream)
            return probs.div_(noise).argmax(dim=-1)
        ''', '''
        import torch
        from .platform import stream_switch

        def noisy_argmax(probs, side_stream):
            with stream_switch(side_stream):
                noise = torch.rand_like(probs)
            torch.cuda.current_stream().wait_stream(side_stream)
            noise.record_stream(torch.cuda.current_stream())
            return probs.div_(noise).argmax(dim=-1)
        ''', Hazard.LIFETIME, "noisy_argmax", "noise"),
    # `empty_like(x)` on a side stream takes x's shape: no kernel reads x there
    "a-tensor-made-like-another-reads-none-of-it": Rule('''
        import torch

        def jitter(x, side):
            with torch.cuda.stream(side):
                noise = x.clone()
                noise.uniform_()
            torch.cuda.current_stream().wait_stream(side)
            noise.record_stream(torch.cuda.current_stream())
            return x + noise
        ''', '''
        import torch

        def jitter(x, side):
            with torch.cuda.stream(side):
                noise = torch.empty_like(x)
                noise.uniform_()
                extra = x.new_empty(4)
                extra.zero_()
            torch.cuda.current_stream().wait_stream(side)
            noise.record_stream(torch.cuda.current_stream())
            extra.record_stream(torch.cuda.current_stream())
            return x + noise + extra
        ''', Hazard.UNORDERED, "jitter", "x"),
    # what layers return on one side stream, taken by work on another (TensorRT-LLM #15265)
    "a-layer-output-handed-between-side-streams": Rule('''
        import torch

        class Prologue:
            def __init__(self):
                self.aux = torch.cuda.Stream()
                self.indexer = torch.cuda.Stream()
                self.start = torch.cuda.Event()
                self.aux_done = torch.cuda.Event()
                self.idx_done = torch.cuda.Event()

            def run(self, x, proj, pick, attend):
                self.start.record()
                with torch.cuda.stream(self.aux):
                    self.start.wait()
                    weights = proj(x)
                    self.aux_done.record()
                with torch.cuda.stream(self.indexer):
                    self.start.wait()
                    self.aux_done.wait()
                    top = pick(x, weights)
                    self.idx_done.record()
                self.idx_done.wait()
                return attend(x, top)
        ''', '''
        import torch

        class Prologue:
            def __init__(self):
                self.aux = torch.cuda.Stream()
                self.indexer = torch.cuda.Stream()
                self.start = torch.cuda.Event()
                self.aux_done = torch.cuda.Event()
                self.idx_done = torch.cuda.Event()

            def run(self, x, proj, pick, attend):
                self.start.record()
                with torch.cuda.stream(self.aux):
                    self.start.wait()
                    weights = proj(x)
                    self.aux_done.record()
                with torch.cuda.stream(self.indexer):
                    self.start.wait()
                    self.aux_done.wait()
                    top = pick(x, weights)
                    self.idx_done.record()
                weights.record_stream(self.indexer)
                top.record_stream(torch.cuda.current_stream())
                self.idx_done.wait()
                return attend(x, top)
        ''', Hazard.LIFETIME, "Prologue.run", "weights"),
    # handles kept in a list and waited in a loop after it; each pass of the launching
    # loop launches a new collective on a new tensor (vLLM's `broadcast_tensor_dict`)
    "collectives-launched-in-a-loop-and-waited-after-it": Rule('''
        import torch
        import torch.distributed as dist

        def exchange(outgoing, shapes, group):
            handles = []
            for tensor in outgoing:
                if tensor.numel() == 0:
                    continue
                handles.append(dist.broadcast(tensor, src=0, group=group, async_op=True))
            received = {}
            for key, shape in shapes:
                tensor = torch.empty(shape, device="cuda")
                handle = dist.broadcast(tensor, src=1, group=group, async_op=True)
                handles.append(handle)
                received[key] = tensor
            return received
        ''', '''
        import torch
        import torch.distributed as dist

        def exchange(outgoing, shapes, group):
            handles = []
            for tensor in outgoing:
                if tensor.numel() == 0:
                    continue
                handles.append(dist.broadcast(tensor, src=0, group=group, async_op=True))
            received = {}
            for key, shape in shapes:
                tensor = torch.empty(shape, device="cuda")
                handle = dist.broadcast(tensor, src=1, group=group, async_op=True)
                handles.append(handle)
                received[key] = tensor
            for handle in handles:
                handle.wait()
            return received
        ''', Hazard.ASYNC_COLLECTIVE, "exchange"),
    # host memory, known by its name, by the helper that made it, or by `pin_memory()`:
    # the host computes on it; no stream reads it
    "a-tensor-named-for-the-host-is-read-by-no-stream": Rule('''
        import torch

        def refresh(update_stream, handles, get_ctx):
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    lens = get_ctx().lens
                    launch_update(handle, lens.cumsum(0))
        ''', '''
        import torch

        def refresh(update_stream, handles, get_ctx):
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    lens_cpu = get_ctx().lens_cpu
                    launch_update(handle, lens_cpu.cumsum(0))
        ''', Hazard.UNORDERED, "refresh", "lens"),
    "a-tensor-a-host-helper-made-is-read-by-no-stream": Rule('''
        import torch

        def refresh(update_stream, handles, ctx):
            lens = ctx.lens_tensor()
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    launch_update(handle, lens.cumsum(0))
        ''', '''
        import torch

        def refresh(update_stream, handles, ctx):
            lens = ctx.lens_to_cpu()
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    launch_update(handle, lens.cumsum(0))
        ''', Hazard.UNORDERED, "refresh", "lens"),
    "a-pinned-copy-is-read-by-no-stream": Rule('''
        import torch

        def refresh(update_stream, handles, ctx):
            lens = ctx.lens_tensor().contiguous()
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    launch_update(handle, lens.cumsum(0))
        ''', '''
        import torch

        def refresh(update_stream, handles, ctx):
            lens = ctx.lens_tensor().pin_memory()
            with torch.cuda.stream(update_stream):
                for handle in handles:
                    launch_update(handle, lens.cumsum(0))
        ''', Hazard.UNORDERED, "refresh", "lens"),
    # a host tensor's copy to the device (`.npu()`, `.xpu()`) is device memory again
    "a-host-tensors-device-copy-is-device-memory": Rule('''
        import torch

        def noisy_argmax(probs, side_stream):
            with torch.cuda.stream(side_stream):
                noise = torch.empty_like(probs).cpu()
                fill_on_host(noise)
                noise = noise.npu()
            torch.cuda.current_stream().wait_stream(side_stream)
            return probs.div_(noise).argmax(dim=-1)
        ''', '''
        import torch

        def noisy_argmax(probs, side_stream):
            with torch.cuda.stream(side_stream):
                noise = torch.empty_like(probs).cpu()
                fill_on_host(noise)
                noise = noise.npu()
            torch.cuda.current_stream().wait_stream(side_stream)
            noise.record_stream(torch.cuda.current_stream())
            return probs.div_(noise).argmax(dim=-1)
        ''', Hazard.LIFETIME, "noisy_argmax", "noise"),
    "an-argument-named-for-an-event-that-is-none": Rule('''
        import torch

        class Backend:
            def launch(self, src, dst, ready_event=None):
                if ready_event is not None:
                    self.stream.wait_event(ready_event)
                with torch.cuda.stream(self.stream):
                    dst.copy_(src, non_blocking=True)

        class Worker:
            def load(self):
                self.backend.launch(self.cpu, self.gpu)

            def store(self):
                self.done.record(torch.cuda.current_stream())
                self.backend.launch(self.gpu, self.cpu, ready_event=self.done)
        ''', '''
        import torch

        class Backend:
            def launch(self, src, dst, event_backend=None):
                if event_backend is None:
                    event_backend = default_backend()
                self.stream.wait_event(event_backend.import_event(self.handle))
                with torch.cuda.stream(self.stream):
                    dst.copy_(src, non_blocking=True)

        class Worker:
            def load(self):
                self.backend.launch(self.cpu, self.gpu)

            def store(self):
                self.backend.launch(self.gpu, self.cpu, event_backend=self.ipc)
        ''', Hazard.UNORDERED, "Worker.load"),
    "a-wait-in-both-branches-of-the-callees-closure": Rule('''
        import torch

        class Stash:
            def stash(self, tensors, sync_event=None, delay=False):
                if delay and sync_event is None:
                    sync_event = torch.cuda.Event()
                    sync_event.record(torch.cuda.current_stream())

                def execute():
                    if sync_event is not None:
                        self.d2h.wait_event(sync_event)
                    with torch.cuda.stream(self.d2h):
                        for t in tensors:
                            self.host.copy_(t, non_blocking=True)
                return execute

            def embeddings(self, tensors):
                return self.stash(tensors)

            def optimizer(self, tensors, sync_event):
                return self.stash(tensors, sync_event=sync_event)
        ''', '''
        import torch

        class Stash:
            def stash(self, tensors, sync_event=None, delay=False):
                if delay and sync_event is None:
                    sync_event = torch.cuda.Event()
                    sync_event.record(torch.cuda.current_stream())

                def execute():
                    if sync_event is not None:
                        self.d2h.wait_event(sync_event)
                    else:
                        self.d2h.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(self.d2h):
                        for t in tensors:
                            self.host.copy_(t, non_blocking=True)
                return execute

            def embeddings(self, tensors):
                return self.stash(tensors)

            def optimizer(self, tensors, sync_event):
                return self.stash(tensors, sync_event=sync_event)
        ''', Hazard.UNORDERED, "Stash.embeddings"),
    "an-ordering-argument-only-another-thread-passes": Rule('''
        from typing import Optional

        import torch

        class Restore:
            def stash(self):
                def restore(sync_event=None):
                    if sync_event is not None:
                        self.h2d.wait_event(sync_event)
                    with torch.cuda.stream(self.h2d):
                        self.weights.copy_(self.host, non_blocking=True)
                self.callbacks.append(restore)

            def restore_all(self, sync_event: Optional[torch.cuda.Event] = None):
                while self.callbacks:
                    self.callbacks.pop()(sync_event)

            def restore_now(self):
                self.restore_all()

            def restore_threaded(self):
                sync_event = torch.cuda.Event()
                sync_event.record(torch.cuda.current_stream())

                def _work():
                    self.restore_all(sync_event=sync_event)
                _work()
        ''', '''
        from typing import Optional

        import torch

        class Restore:
            def stash(self):
                def restore(sync_event=None):
                    if sync_event is not None:
                        self.h2d.wait_event(sync_event)
                    else:
                        self.h2d.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(self.h2d):
                        self.weights.copy_(self.host, non_blocking=True)
                self.callbacks.append(restore)

            def restore_all(self, sync_event: Optional[torch.cuda.Event] = None):
                while self.callbacks:
                    self.callbacks.pop()(sync_event)

            def restore_now(self):
                self.restore_all()

            def restore_threaded(self):
                sync_event = torch.cuda.Event()
                sync_event.record(torch.cuda.current_stream())

                def _work():
                    self.restore_all(sync_event=sync_event)
                return self.pool_submit(_work)
        ''',
        Hazard.UNORDERED, "Restore.restore_now"),
    "an-event-a-call-makes-on-a-side-stream-is-no-tensor": Rule('''
        import torch

        def retrieve(backend, ctx, device):
            ctx.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(ctx.stream):
                scratch = backend.create_buffer(device)
                backend.record_event(scratch, ctx.stream)
            return backend.export_event(scratch, device)
        ''', '''
        import torch

        def retrieve(backend, ctx, device):
            ctx.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(ctx.stream):
                event = backend.create_event(device)
                backend.record_event(event, ctx.stream)
            return backend.export_event(event, device)
        ''',
        Hazard.LIFETIME, "retrieve", "scratch"),
    # a gradient hook's side stream told to wait for the default stream: the caller's
    # current stream (autograd's, a loop's own) may be another one
    "a-wait-on-the-default-stream-orders-not-the-callers": Rule('''
        import torch

        class Bucket:
            def __init__(self):
                self.reduce_stream = torch.cuda.Stream()
                self.flat = torch.empty(1 << 20, device="cuda")

            def add_grad(self, grad):
                self.reduce_stream.wait_stream(torch.cuda.default_stream())
                with torch.cuda.stream(self.reduce_stream):
                    self.flat[: grad.numel()].copy_(grad.view(-1))
                grad.record_stream(self.reduce_stream)
        ''', '''
        import torch

        class Bucket:
            def __init__(self):
                self.reduce_stream = torch.cuda.Stream()
                self.flat = torch.empty(1 << 20, device="cuda")

            def add_grad(self, grad):
                self.reduce_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.reduce_stream):
                    self.flat[: grad.numel()].copy_(grad.view(-1))
                grad.record_stream(self.reduce_stream)
        ''', Hazard.UNORDERED, "Bucket.add_grad", "grad"),
    # a step's non_blocking device-to-host copy into the object, read by the host in the
    # next step's method with no sync (async scheduling avoids syncs on purpose); the
    # NumPy view kept beside the pinned tensor is the same memory
    "a-d2h-copy-read-by-another-method": Rule('''
        import torch

        class Runner:
            def __init__(self):
                self.accepted_cpu = torch.empty(64, dtype=torch.int32, pin_memory=True)
                self.accepted_np = self.accepted_cpu.numpy()
                self.accepted = torch.zeros(64, dtype=torch.int32, device="cuda")

            def after_step(self, n):
                self.accepted[:n] = 1
                self.accepted_cpu[:n].copy_(self.accepted[:n], non_blocking=True)

            def build_metadata(self, n):
                counts = self.accepted_np[:n]
                return int(counts.max())
        ''', '''
        import torch

        class Runner:
            def __init__(self):
                self.accepted_cpu = torch.empty(64, dtype=torch.int32, pin_memory=True)
                self.accepted_np = self.accepted_cpu.numpy()
                self.accepted = torch.zeros(64, dtype=torch.int32, device="cuda")
                self.copied = torch.cuda.Event()

            def after_step(self, n):
                self.accepted[:n] = 1
                self.accepted_cpu[:n].copy_(self.accepted[:n], non_blocking=True)
                self.copied.record()

            def build_metadata(self, n):
                self.copied.synchronize()
                counts = self.accepted_np[:n]
                return int(counts.max())
        ''', Hazard.UNSYNCED_D2H, "Runner.build_metadata", "self.accepted_cpu"),
    # the caller syncs an event a helper recorded during the last step's input prep,
    # before the copy was queued: that sync does not cover the copy (a device sync does)
    "a-d2h-copy-and-a-helpers-earlier-event": Rule('''
        import contextlib
        import torch

        class Runner:
            def __init__(self):
                self.accepted_cpu = torch.empty(64, dtype=torch.int32, pin_memory=True)
                self.accepted = torch.zeros(64, dtype=torch.int32, device="cuda")
                self.prep_done = torch.cuda.Event()

            @contextlib.contextmanager
            def prep(self):
                self.prep_done.synchronize()
                yield
                self.prep_done.record()

            def step(self, n):
                with self.prep():
                    meta = self.build_metadata(n)
                self.accepted[:n] = 1
                self.accepted_cpu[:n].copy_(self.accepted[:n], non_blocking=True)
                return meta

            def build_metadata(self, n):
                return self.accepted_cpu[:n].tolist()
        ''', '''
        import contextlib
        import torch

        class Runner:
            def __init__(self):
                self.accepted_cpu = torch.empty(64, dtype=torch.int32, pin_memory=True)
                self.accepted = torch.zeros(64, dtype=torch.int32, device="cuda")
                self.prep_done = torch.cuda.Event()

            @contextlib.contextmanager
            def prep(self):
                self.prep_done.synchronize()
                yield
                self.prep_done.record()

            def step(self, n):
                torch.cuda.current_stream().synchronize()
                with self.prep():
                    meta = self.build_metadata(n)
                self.accepted[:n] = 1
                self.accepted_cpu[:n].copy_(self.accepted[:n], non_blocking=True)
                return meta

            def build_metadata(self, n):
                return self.accepted_cpu[:n].tolist()
        ''', Hazard.UNSYNCED_D2H, "Runner.build_metadata", "self.accepted_cpu"),
    # torchrec #2598's shape: the taker records the value for its own stream
    "a-value-handed-through-an-objects-container": Rule(
        _HANDED, _HANDED.replace(
            "            rows = self._ctx.pending.pop(name)\n",
            "            rows = self._ctx.pending.pop(name)\n"
            "            rows.record_stream(torch.cuda.current_stream())\n"),
        Hazard.LIFETIME, "Consumer.forward", "rows"),
    # the same hand-off where the helper runs on the caller's own stream: no other stream
    "a-value-put-in-a-container-on-the-takers-stream": Rule(
        _HANDED, _HANDED.replace(
            "            with torch.cuda.stream(self.side):\n"
            "                _launch(self.table, ctx, name, ids)\n",
            "            _launch(self.table, ctx, name, ids)\n"),
        Hazard.LIFETIME, "Consumer.forward", "rows"),
    # what the side stream's helper puts in the container is an event it records there:
    # no tensor's block is handed over
    "an-event-put-in-a-container-is-no-tensor": Rule(
        _HANDED, _HANDED.replace(
            "        ctx.pending[name] = rows\n",
            "        done = torch.cuda.Event()\n"
            "        done.record()\n"
            "        ctx.pending[name] = done\n"),
        Hazard.LIFETIME, "Consumer.forward", "rows"),
    # the taker's own container of that name is another container: no hand-off
    "a-container-of-the-takers-own-object-is-another-one": Rule(
        _HANDED, _HANDED.replace(
            "            rows = self._ctx.pending.pop(name)\n",
            "            rows = self.pending.pop(name)\n"),
        Hazard.LIFETIME, "Consumer.forward", "rows"),
    # vLLM #31841's shape, fixed as upstream did: two buffers used in turn
    "a-host-buffer-rewritten-outside-the-section-its-helper-copies": Rule(
        _REWRITTEN, _REWRITTEN.replace(
            "            self.mask = HostDeviceBuffer(n)\n",
            "            self.masks = [HostDeviceBuffer(n), HostDeviceBuffer(n)]\n"
            "            self.turn = 0\n").replace(
            "            mask = self.mask.cpu\n",
            "            self.turn = 1 - self.turn\n"
            "            buf = self.masks[self.turn]\n"
            "            mask = buf.cpu\n").replace(
            "            return self.mask.to_device(len(batch))\n",
            "            return buf.to_device(len(batch))\n"),
        Hazard.PINNED_REWRITE, "Runner.gather", "self.mask.cpu"),
    # ... or fixed by running it inside the section, as the step's other buffers are
    "a-host-buffer-rewritten-inside-the-section-its-helper-copies": Rule(
        _REWRITTEN, _REWRITTEN.replace(
            "                ids = self.fill_ids(batch)\n"
            "            mask = self.gather(batch)\n",
            "                ids = self.fill_ids(batch)\n"
            "                mask = self.gather(batch)\n"),
        Hazard.PINNED_REWRITE, "Runner.gather", "self.mask.cpu"),
    # a temporary view set on another tensor's storage (`tmp.set_(w.untyped_storage())`,
    # to copy into it without touching its autograd version): the record_stream of the
    # tensor that owns the storage keeps the view's bytes alive too
    "record-stream-on-the-tensor-a-view-is-set-on": Rule('''
        import torch

        class Restore:
            def __init__(self):
                self.h2d = torch.cuda.Stream()

            def restore(self, w, host):
                self.h2d.wait_stream(torch.cuda.current_stream())
                tmp = torch.empty_like(w)
                with torch.cuda.stream(self.h2d):
                    tmp.copy_(host, non_blocking=True)
                w.record_stream(self.h2d)
        ''', '''
        import torch

        class Restore:
            def __init__(self):
                self.h2d = torch.cuda.Stream()

            def restore(self, w, host):
                self.h2d.wait_stream(torch.cuda.current_stream())
                tmp = torch.tensor([], dtype=w.dtype, device=w.device)
                tmp.set_(w.untyped_storage(), w.storage_offset(), w.shape, w.stride())
                with torch.cuda.stream(self.h2d):
                    tmp.copy_(host, non_blocking=True)
                w.record_stream(self.h2d)
        ''', Hazard.LIFETIME, "Restore.restore", "tmp"),
    # record_stream in a loop over a set of the consumer streams built here: each of
    # them is recorded (the hazard leaves the current stream out of the set)
    "record-stream-in-a-loop-over-a-set-of-streams": Rule('''
        import torch

        def hand_over(x, side, target):
            current = torch.cuda.current_stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                y = x * 2
            x.record_stream(side)
            current.wait_stream(side)
            target.wait_stream(side)
            consumer_streams = {s for s in (target,) if s is not None}
            for stream in consumer_streams:
                y.record_stream(stream)
            out = y + 1
            with torch.cuda.stream(target):
                out_target = y * 3
            return out, out_target
        ''', '''
        import torch

        def hand_over(x, side, target):
            current = torch.cuda.current_stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                y = x * 2
            x.record_stream(side)
            current.wait_stream(side)
            target.wait_stream(side)
            consumer_streams = {s for s in (current, target) if s is not None}
            for stream in consumer_streams:
                y.record_stream(stream)
            out = y + 1
            with torch.cuda.stream(target):
                out_target = y * 3
            return out, out_target
        ''', Hazard.LIFETIME, "hand_over", "y"),
    # a worker thread that only copies its input to the device (a loader's host batch),
    # here through a helper, under the stream its submitter captured: no stream reads
    # the submitter's writes there; a kernel that reads the input on the device does
    "a-threads-input-read-only-as-a-copy-to-the-device": Rule('''
        import torch

        def _to_device(batch, device):
            assert isinstance(batch, torch.Tensor), f"{type(batch)} is no tensor"
            return batch.float().to(device, non_blocking=True)

        class Loader:
            def submit(self, batch, device):
                alloc_stream = torch.cuda.current_stream(device)

                def _work():
                    with torch.cuda.stream(alloc_stream):
                        return _to_device(batch, device)
                return self.pool.submit(_work)
        ''', '''
        import torch

        def _to_device(batch, device):
            assert isinstance(batch, torch.Tensor), f"{type(batch)} is no tensor"
            return batch.to(device, non_blocking=True)

        class Loader:
            def submit(self, batch, device):
                alloc_stream = torch.cuda.current_stream(device)

                def _work():
                    with torch.cuda.stream(alloc_stream):
                        return _to_device(batch, device)
                return self.pool.submit(_work)
        ''', Hazard.UNORDERED, "Loader.submit._work", "batch"),
    # the side stream waits for the current one before the object is constructed: a
    # construction is a call of the class's __init__
    "a-wait-before-a-construction-covers-init": Rule('''
        import torch

        class Exchange:
            def __init__(self, buf, side):
                self.done = torch.cuda.Event()
                with torch.cuda.stream(side):
                    buf.mul_(2)
                    self.done.record(side)
                buf.record_stream(side)
                self.buf = buf

        def launch(buf, side):
            return Exchange(buf, side)
        ''', '''
        import torch

        class Exchange:
            def __init__(self, buf, side):
                self.done = torch.cuda.Event()
                with torch.cuda.stream(side):
                    buf.mul_(2)
                    self.done.record(side)
                buf.record_stream(side)
                self.buf = buf

        def launch(buf, side):
            side.wait_stream(torch.cuda.current_stream())
            return Exchange(buf, side)
        ''', Hazard.UNORDERED, "Exchange.__init__", "buf"),
    # a device sync under an `if` on the loop index, run in a later pass of a loop that
    # has that pass wherever the side stream's use ran (the hazard's sync needs a third
    # pass, which a loop of one layer does not have)
    "a-sync-in-a-later-pass-of-the-loop": Rule('''
        import torch

        class Layers:
            def __init__(self):
                self.load_stream = torch.cuda.Stream()

            def load(self, n, host):
                pos = torch.zeros(64, device="cuda")
                self.load_stream.wait_stream(torch.cuda.current_stream())
                for i in range(n + 2):
                    if i > 1 and i <= n:
                        torch.cuda.synchronize()
                    if i < n:
                        with torch.cuda.stream(self.load_stream):
                            if i == 0:
                                pos.copy_(host, non_blocking=True)
                    yield
        ''', '''
        import torch

        class Layers:
            def __init__(self):
                self.load_stream = torch.cuda.Stream()

            def load(self, n, host):
                pos = torch.zeros(64, device="cuda")
                self.load_stream.wait_stream(torch.cuda.current_stream())
                for i in range(n + 2):
                    if i > 0 and i <= n:
                        torch.cuda.synchronize()
                    if i < n:
                        with torch.cuda.stream(self.load_stream):
                            if i == 0:
                                pos.copy_(host, non_blocking=True)
                    yield
        ''', Hazard.LIFETIME, "Layers.load", "pos"),
    # a device module's synchronize (torch.xpu's, torch.musa's) waits for the whole
    # device, as torch.cuda.synchronize() does
    "a-device-modules-synchronize-waits-for-the-device": Rule('''
        import torch

        def fetch(counts):
            counts_cpu = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
            counts_cpu.copy_(counts, non_blocking=True)
            return counts_cpu.tolist()
        ''', '''
        import torch

        def fetch(counts):
            counts_cpu = torch.empty(counts.shape, dtype=counts.dtype, pin_memory=True)
            counts_cpu.copy_(counts, non_blocking=True)
            torch.xpu.synchronize()
            return counts_cpu.tolist()
        ''', Hazard.UNSYNCED_D2H, "fetch", "counts_cpu"),
    # an object's staging buffer, made at construction and written only under the
    # object's own stream (through a helper that stream's context calls): no other
    # stream wrote it; the hazard also zeroes it on the caller's stream elsewhere
    "a-buffer-touched-only-under-its-objects-stream": Rule('''
        import torch

        class Context:
            def __init__(self, n):
                self.stream = torch.cuda.Stream()
                self.ids_buffer_ = torch.empty(n, dtype=torch.long, device="cuda")

            def stage(self, ids_cpu):
                self.ids_buffer_[: len(ids_cpu)].copy_(ids_cpu, non_blocking=True)

        class Store:
            def store(self, key, ids_cpu):
                ctx = self.lookup(key)
                with torch.cuda.stream(ctx.stream):
                    ctx.stage(ids_cpu)

        def reset(ctx):
            ctx.ids_buffer_.zero_()
        ''', '''
        import torch

        class Context:
            def __init__(self, n):
                self.stream = torch.cuda.Stream()
                self.ids_buffer_ = torch.empty(n, dtype=torch.long, device="cuda")

            def stage(self, ids_cpu):
                self.ids_buffer_[: len(ids_cpu)].copy_(ids_cpu, non_blocking=True)

        class Store:
            def store(self, key, ids_cpu):
                ctx = self.lookup(key)
                with torch.cuda.stream(ctx.stream):
                    ctx.stage(ids_cpu)
        ''', Hazard.UNORDERED, "Store.store", "ctx.ids_buffer_"),
    # a Python dict's .copy() taken on a side stream: no kernel reads anything
    # (torch.Tensor has no .copy()); its hazard twin clones a tensor there
    "a-dicts-copy-on-a-side-stream-reads-no-tensor": Rule('''
        import torch

        class Pipeline:
            def __init__(self, n):
                self.side = torch.cuda.Stream()
                self.next_ids = torch.empty(n, device="cuda")

            def advance(self, ids):
                self.next_ids.copy_(ids)
                with torch.cuda.stream(self.side):
                    self.ids = self.next_ids.clone()
        ''', '''
        import torch

        class Pipeline:
            def __init__(self, n):
                self.side = torch.cuda.Stream()
                self.next_contexts = {}

            def advance(self, name, ctx):
                self.next_contexts[name] = ctx
                with torch.cuda.stream(self.side):
                    self.contexts = self.next_contexts.copy()
                    self.next_contexts.clear()
        ''', Hazard.UNORDERED, "Pipeline.advance"),
    # tensors still being written by a copy stream, put into a record of the package
    # (a dataclass, or a class whose __init__ only stores): the construction reads
    # nothing; its hazard twin converts one on the current stream first
    "a-record-built-from-tensors-reads-none-of-them": Rule('''
        from dataclasses import dataclass
        import torch

        @dataclass
        class Inputs:
            dense: torch.Tensor
            labels: torch.Tensor

        class Plain:
            def __init__(self, dense):
                self.dense = dense

        def to_device(dense_cpu, labels_cpu, copy_stream):
            dense = torch.empty_like(dense_cpu, device="cuda")
            labels = torch.empty_like(labels_cpu, device="cuda")
            copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                dense.copy_(dense_cpu, non_blocking=True)
                labels.copy_(labels_cpu, non_blocking=True)
                dense.record_stream(copy_stream)
                labels.record_stream(copy_stream)
            return Inputs(dense=dense.float(), labels=labels), Plain(dense)
        ''', '''
        from dataclasses import dataclass
        import torch

        @dataclass
        class Inputs:
            dense: torch.Tensor
            labels: torch.Tensor

        class Plain:
            def __init__(self, dense):
                self.dense = dense

        def to_device(dense_cpu, labels_cpu, copy_stream):
            dense = torch.empty_like(dense_cpu, device="cuda")
            labels = torch.empty_like(labels_cpu, device="cuda")
            copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                dense.copy_(dense_cpu, non_blocking=True)
                labels.copy_(labels_cpu, non_blocking=True)
                dense.record_stream(copy_stream)
                labels.record_stream(copy_stream)
            return Inputs(dense=dense, labels=labels), Plain(dense)
        ''', Hazard.UNORDERED, "to_device"),
    # a value taken out of a context's container (filled by another object's side
    # stream) and handed to the caller inside a holder that only stores it: the
    # caller's use, with no record_stream (torchrec's CPU eval forward)
    "a-taken-value-returned-in-a-holder-is-handed-to-the-caller": Rule('''
        import torch

        class LazyNoWait:
            def __init__(self, obj):
                self._obj = obj

        class Stage:
            def __init__(self, ctx):
                self._context = ctx
                self._memcpy_stream = torch.cuda.Stream()

            def copy_to_gpu(self, name, emb_cpu):
                with torch.cuda.stream(self._memcpy_stream):
                    out = emb_cpu.to("cuda", non_blocking=True)
                    self._context.gpu_outputs[name] = out

        class Forward:
            def __init__(self, ctx, name):
                self._context = ctx
                self._name = name

            def __call__(self):
                embeddings = self._context.gpu_outputs.pop(self._name)
                return LazyNoWait(embeddings)
        ''', '''
        import torch

        class LazyNoWait:
            def __init__(self, obj):
                self._obj = obj

        class Stage:
            def __init__(self, ctx):
                self._context = ctx
                self._memcpy_stream = torch.cuda.Stream()

            def copy_to_gpu(self, name, emb_cpu):
                with torch.cuda.stream(self._memcpy_stream):
                    out = emb_cpu.to("cuda", non_blocking=True)
                    self._context.gpu_outputs[name] = out

        class Forward:
            def __init__(self, ctx, name):
                self._context = ctx
                self._name = name

            def __call__(self):
                embeddings = self._context.gpu_outputs.pop(self._name)
                embeddings.record_stream(torch.cuda.current_stream())
                return LazyNoWait(embeddings)
        ''', Hazard.LIFETIME, "Forward.__call__"),
    # ``stream.record_event(ev)`` records ``ev`` (as ``ev.record(stream)`` does): a wait
    # on it is ordered after what the stream did before that record, and no later work
    "a-stream-records-the-event-it-is-given": Rule('''
        import torch

        def scale(x, out, side, ready):
            torch.cuda.current_stream().record_event(ready)
            x.mul_(2)
            with torch.cuda.stream(side):
                side.wait_event(ready)
                out.copy_(x)
            torch.cuda.current_stream().wait_stream(side)
        ''', '''
        import torch

        def scale(x, out, side, ready):
            x.mul_(2)
            torch.cuda.current_stream().record_event(ready)
            with torch.cuda.stream(side):
                side.wait_event(ready)
                out.copy_(x)
            torch.cuda.current_stream().wait_stream(side)
        ''', Hazard.EARLY_EVENT, "scale", "x"),
    # the allocating stream waits for the side stream's work in the same branch as that
    # work, after it: wherever the side work ran, the wait ran too
    "a-join-back-in-the-branch-of-the-side-work": Rule('''
        import torch
        import torch.distributed as dist

        def reduce(x, side, done_event, group=None, join=True):
            part = torch.empty_like(x)
            part.copy_(x)
            if group is not None:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    dist.all_reduce(part, group=group)
                    done_event.record(side)
            if join:
                torch.cuda.current_stream().wait_event(done_event)
            return x
        ''', '''
        import torch
        import torch.distributed as dist

        def reduce(x, side, done_event, group=None, join=True):
            part = torch.empty_like(x)
            part.copy_(x)
            if group is not None:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    dist.all_reduce(part, group=group)
                    done_event.record(side)
                torch.cuda.current_stream().wait_event(done_event)
            return x
        ''', Hazard.LIFETIME, "reduce", "part"),
    # a caller's wait in the branch that also holds the call is on every path to it
    "a-callers-wait-in-the-branch-that-holds-the-call": Rule('''
        import torch

        class Offload:
            def __init__(self):
                self.d2h = torch.cuda.Stream()

            def _flush(self, items):
                with torch.cuda.stream(self.d2h):
                    for src, dst in items:
                        dst.copy_(src, non_blocking=True)
                        src.record_stream(self.d2h)

            def commit(self, group, items, last):
                if group == 0:
                    self.d2h.wait_stream(torch.cuda.current_stream())
                if group == last:
                    self._flush(items)
        ''', '''
        import torch

        class Offload:
            def __init__(self):
                self.d2h = torch.cuda.Stream()

            def _flush(self, items):
                with torch.cuda.stream(self.d2h):
                    for src, dst in items:
                        dst.copy_(src, non_blocking=True)
                        src.record_stream(self.d2h)

            def commit(self, group, items, last):
                if group == 0:
                    self.d2h.wait_stream(torch.cuda.current_stream())
                    self._flush(items)
                if group == last:
                    self.d2h.wait_stream(torch.cuda.current_stream())
                    torch.cuda.current_stream().wait_stream(self.d2h)
                    if items:
                        self._flush(items)
        ''', Hazard.UNORDERED, "Offload._flush", "src"),
    # a new thread's current stream is the default stream; a submitter that enters and
    # sets no stream (nor does any caller of it) runs there too: one stream
    "a-thread-submitted-from-the-default-stream": Rule('''
        import concurrent.futures
        import torch

        class Saver:
            def __init__(self):
                self.side = torch.cuda.Stream()

            def save(self, named):
                def offload(name, t):
                    return name, t.to("cpu", non_blocking=True)

                with torch.cuda.stream(self.side):
                    named = {n: t * 2 for n, t in named.items()}
                    with concurrent.futures.ThreadPoolExecutor(4) as pool:
                        futures = [pool.submit(offload, n, t) for n, t in named.items()]
                torch.cuda.synchronize()
                return dict(f.result() for f in futures)
        ''', '''
        import concurrent.futures
        import torch

        class Saver:
            def save(self, named):
                def offload(name, t):
                    return name, t.to("cpu", non_blocking=True)

                named = {n: t * 2 for n, t in named.items()}
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    futures = [pool.submit(offload, n, t) for n, t in named.items()]
                torch.cuda.synchronize()
                return dict(f.result() for f in futures)
        ''', Hazard.UNORDERED, "Saver.save.offload", "t"),
    # a blocking copy to the host waits for the current stream, so an earlier
    # non-blocking copy on that stream has landed when the host reads it
    "a-blocking-copy-to-the-host-after-a-non-blocking-one": Rule('''
        import torch

        def splits(local_counts, global_counts, n):
            inp = local_counts.view(n, -1).sum(dim=1).to("cpu", non_blocking=True)
            out = global_counts.view(n, -1).sum(dim=1).to("cpu", non_blocking=True)
            return inp.tolist(), out
        ''', '''
        import torch

        def splits(local_counts, global_counts, n):
            inp = local_counts.view(n, -1).sum(dim=1).to("cpu", non_blocking=True)
            out = global_counts.view(n, -1).sum(dim=1).to(torch.device("cpu"), non_blocking=False)
            return inp.tolist(), out.tolist()
        ''', Hazard.UNSYNCED_D2H, "splits", "inp"),
    # an optional argument named for an event that is a host thread's sync object
    # (annotated so, tested with ``is_set()``, or handed to a parameter that is one)
    # orders no stream: leaving it out is no missing wait
    "an-optional-event-that-is-a-threads": Rule('''
        import torch

        def _load(x, side, done_event=None):
            side.wait_event(done_event)
            with torch.cuda.stream(side):
                x.mul_(2)

        def step(x, side, ev):
            _load(x, side, done_event=ev)

        def step_fast(x, side):
            _load(x, side)
        ''', '''
        import threading
        import torch

        def _load(x, side, done_event: threading.Event | None = None):
            if done_event is not None and done_event.is_set():
                return
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x.mul_(2)
            x.record_stream(side)

        def _retry(x, side, cancel_event=None):
            _load(x, side, done_event=cancel_event)
            x.record_stream(side)

        def step(x, side, ev):
            _retry(x, side, cancel_event=ev)

        def step_fast(x, side):
            _retry(x, side)
        ''', Hazard.UNORDERED, "step_fast"),
    # a global made by ``threading.Event()`` (or an ``Event`` imported from
    # ``threading``, ``asyncio`` or ``multiprocessing``) is a host thread's flag, not a
    # device event cached across callers
    "a-threads-event-kept-in-a-global-is-no-device-event": Rule('''
        import torch

        _done = torch.cuda.Event()

        def _prime():
            global _done
            _done = torch.cuda.Event()
        ''', '''
        import threading
        import multiprocessing as mp
        import torch

        _done = threading.Event()
        _stop = mp.Event()

        class Prefetch:
            ready = threading.Event()

        def _prime():
            global _done
            from asyncio import Event
            _done = Event()
            with torch.cuda.stream(torch.cuda.Stream()):
                pass
        ''', Hazard.CACHED_STREAM, "_done"),
    # another array framework's stream (MLX's ``mx.stream``, JAX's) orders no torch work:
    # a helper that returns one, or a ``with`` on one, switches no torch stream
    "another-frameworks-stream-is-no-torch-stream": Rule('''
        import torch

        _side = torch.cuda.Stream()

        def _generation_context():
            return torch.cuda.stream(_side)

        def iter_responses(responses):
            it = iter(responses)
            while True:
                with _generation_context():  # the generation stream
                    response = next(it)
                yield response
        ''', '''
        import paddle
        import torch

        def _generation_context():
            import mlx.core as mx
            from mlx_vlm.generate import generation_stream
            return mx.stream(generation_stream)

        def iter_responses(responses):
            it = iter(responses)
            while True:
                with _generation_context():  # the generation stream
                    response = next(it)
                with paddle.device.stream_guard(paddle.device.Stream()):
                    response = response + 1
                yield response
        ''', Hazard.LIFETIME, "iter_responses"),
    # a work handle bound again in a branch that asserts the first binding's branch was
    # not taken still holds the first work on that path: its wait there waits it
    "a-handle-bound-again-in-a-branch-asserted-exclusive": Rule('''
        import torch
        import torch.distributed as dist

        def backward(grad, weight, allreduce, scatter, out):
            grad_input = grad.matmul(weight)
            if allreduce:
                handle = dist.all_reduce(grad_input, async_op=True)
            if scatter:
                handle = dist.reduce_scatter_tensor(out, grad_input, async_op=True)
            grad_weight = grad.t().matmul(weight)
            if scatter:
                handle.wait()
                return out, grad_weight
            if allreduce:
                handle.wait()
            return grad_input, grad_weight
        ''', '''
        import torch
        import torch.distributed as dist

        def backward(grad, weight, allreduce, scatter, out):
            grad_input = grad.matmul(weight)
            if allreduce:
                handle = dist.all_reduce(grad_input, async_op=True)
            if scatter:
                assert not allreduce
                handle = dist.reduce_scatter_tensor(out, grad_input, async_op=True)
            grad_weight = grad.t().matmul(weight)
            if scatter:
                handle.wait()
                return out, grad_weight
            if allreduce:
                handle.wait()
            return grad_input, grad_weight
        ''', Hazard.ASYNC_COLLECTIVE, "backward"),
    # a wait guarded by "the current stream is not the side stream" holds on every
    # path: where the test is false the side stream is the current one, with nothing
    # to wait for (the test in the ``if`` or in a name bound to it just before)
    "a-wait-guarded-by-the-current-stream-being-another": Rule('''
        import torch

        class Dispatcher:
            def __init__(self):
                self.dtoh = torch.cuda.Stream()

            def to_host(self, splits):
                on_side = torch.cuda.current_stream() != self.dtoh
                if splits is not None:
                    self.dtoh.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.dtoh):
                    self.splits = splits.to("cpu", non_blocking=True)
                    splits.record_stream(self.dtoh)
                self.done = self.dtoh.record_event()
        ''', '''
        import torch

        class Dispatcher:
            def __init__(self):
                self.dtoh = torch.cuda.Stream()

            def to_host(self, splits):
                on_side = torch.cuda.current_stream() != self.dtoh
                if on_side:
                    self.dtoh.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.dtoh):
                    self.splits = splits.to("cpu", non_blocking=True)
                    splits.record_stream(self.dtoh)
                self.done = self.dtoh.record_event()

            def to_host_inline(self, counts):
                if self.dtoh is not torch.cuda.current_stream():
                    self.dtoh.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.dtoh):
                    self.counts = counts.to("cpu", non_blocking=True)
                    counts.record_stream(self.dtoh)
                self.done = self.dtoh.record_event()
        ''', Hazard.UNORDERED, "Dispatcher.to_host"),
    # a helper that only records an event on the stream it is given puts no work on
    # it: the work, and its order, are its callers'
    "a-helper-that-only-records-on-the-stream-it-is-given": Rule('''
        import torch

        class Group:
            def __init__(self):
                self._offload_event = torch.cuda.Event()

            def record_offload_event(self, stream):
                with torch.cuda.stream(stream):
                    _offload_all()
                self._offload_event.record(stream)
        ''', '''
        import torch

        class Group:
            def __init__(self):
                self._offload_event = torch.cuda.Event()

            def record_offload_event(self, stream):
                """Record the offload event."""
                self._offload_event.record(stream)
        ''', Hazard.UNORDERED, "Group.record_offload_event"),
    # a function that returns its async work (``return dist.batch_isend_irecv(ops)``)
    # hands it on: its caller waits
    "a-returned-work-is-handed-on": Rule('''
        import torch.distributed as dist

        def communicate_step(recv, send, peer):
            ops = [dist.P2POp(dist.irecv, recv, peer), dist.P2POp(dist.isend, send, peer)]
            dist.batch_isend_irecv(ops)
        ''', '''
        import torch.distributed as dist

        def communicate_step(recv, send, peer):
            ops = [dist.P2POp(dist.irecv, recv, peer), dist.P2POp(dist.isend, send, peer)]
            return dist.batch_isend_irecv(ops)
        ''', Hazard.ASYNC_COLLECTIVE, "communicate_step"),
    # a stream chosen in an if (a side stream that waits first, else the current one):
    # the wait holds wherever the side stream is the one used
    "a-wait-in-the-branch-that-chooses-the-side-stream": Rule('''
        import torch

        def run_reduction(store, overlap, grads):
            flat = torch.cat(grads)
            flat /= store.world_size
            if overlap:
                stream = store.comm_stream
                flat.record_stream(stream)
            else:
                stream = torch.cuda.current_stream()
                stream.wait_stream(store.comm_stream)
            with torch.cuda.stream(stream):
                store.reduce(flat)
        ''', '''
        import torch

        def run_reduction(store, overlap, grads):
            flat = torch.cat(grads)
            flat /= store.world_size
            if overlap:
                stream = store.comm_stream
                flat.record_stream(stream)
                stream.wait_stream(torch.cuda.current_stream())
            else:
                stream = torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                store.reduce(flat)
        ''', Hazard.UNORDERED, "run_reduction"),
    # a device module's query (``torch.cuda.memory_reserved()``, ``mem_get_info()``,
    # ``current_device()``) returns host numbers, not a tensor made on the stream
    "a-device-query-on-a-side-stream-makes-no-tensor": Rule('''
        import torch

        def record(block, x, side):
            current = torch.cuda.current_stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                before = block(x)
            current.wait_stream(side)
            return before.sum()
        ''', '''
        import torch

        def record(block, x, side):
            current = torch.cuda.current_stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                before = torch.cuda.memory_reserved()
                free, total = torch.cuda.mem_get_info()
                block(x)
            current.wait_stream(side)
            return max(0, torch.cuda.memory_reserved() - before) + free
        ''', Hazard.LIFETIME, "record"),
    # a helper that returns the current stream (``return torch.cuda.current_stream()``)
    # gives the current stream, also as the fallback of an ``or``
    "a-helper-that-returns-the-current-stream": Rule('''
        import torch

        class Prefetcher:
            def _compute(self):
                return torch.cuda.Stream()

            def forget(self, group, slot):
                compute = None
                compute = compute or self._compute()
                with torch.cuda.stream(compute):
                    group.weight = slot.clone()
                slot.zero_()
        ''', '''
        import torch

        class Prefetcher:
            def _compute(self):
                return torch.cuda.current_stream(self.device)

            def forget(self, group, slot):
                compute = None
                compute = compute or self._compute()
                with torch.cuda.stream(compute):
                    group.weight = slot.clone()
                slot.zero_()
        ''', Hazard.UNORDERED, "Prefetcher.forget"),
    # a dictionary looked up with a tensor as its key hashes the tensor's identity and
    # reads none of its bytes (a parameter annotated as a mapping, or a local dict)
    "a-dict-looked-up-by-a-tensor-key-reads-no-bytes": Rule('''
        import torch

        def grad_handle(grad, table: torch.Tensor, p: torch.Tensor, side):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                shard = grad.to("cuda")
                shard.add_(1)
                manager.move(shard, table[p])
            grad.record_stream(side)
            shard.record_stream(side)
        ''', '''
        from typing import Dict

        import torch

        def grad_handle(grad, devices: Dict, p: torch.Tensor, side):
            side.wait_stream(torch.cuda.current_stream())
            seen = {}
            with torch.cuda.stream(side):
                shard = grad.to("cuda")
                shard.add_(1)
                seen[p] = devices[p]
                manager.move(shard, devices[p], seen[p])
            grad.record_stream(side)
            shard.record_stream(side)
        ''', Hazard.LIFETIME, "grad_handle"),
    # a context manager of the package's own whose name has "stream" in it but which
    # enters no device stream (an HTTP response stream) switches no stream
    "an-own-context-manager-named-for-a-stream-that-enters-none": Rule('''
        import contextlib
        import torch

        @contextlib.contextmanager
        def open_stream_with_retry(stream_side):
            with torch.cuda.stream(stream_side):
                yield stream_side

        def fill(buf, payload, stream_side):
            buf.zero_()
            with open_stream_with_retry(stream_side):
                buf.add_(payload)
            torch.cuda.current_stream().wait_stream(stream_side)
        ''', '''
        import contextlib
        import torch

        @contextlib.contextmanager
        def open_stream_with_retry(stream_payload):
            response = post(stream_payload)
            try:
                yield response
            finally:
                response.close()

        def post(payload):
            return payload

        def fill(buf, payload, stream_payload):
            buf.zero_()
            with open_stream_with_retry(stream_payload):
                buf.add_(payload)
            torch.cuda.current_stream().synchronize()
        ''', Hazard.UNORDERED, "fill", "buf"),
    # a sync in a branch that returns covers no host read after the branch
    "a-sync-in-a-branch-left-covers-no-later-read": Rule('''
        import torch

        def counts(dev_counts, host_counts, exact):
            host_counts.copy_(dev_counts, non_blocking=True)
            if exact:
                torch.cuda.synchronize()
                return None
            return host_counts.tolist()
        ''', '''
        import torch

        def counts(dev_counts, host_counts, exact):
            host_counts.copy_(dev_counts, non_blocking=True)
            if exact:
                return dev_counts.cpu()
            torch.cuda.current_stream().synchronize()
            return host_counts.tolist()
        ''', Hazard.UNSYNCED_D2H, "counts", "host_counts"),
    # the same across methods: the copy left in flight by one method, read by another
    # after a branch that syncs and returns
    "a-sync-in-a-branch-left-covers-no-read-in-another-method": Rule('''
        import torch

        class Relay:
            def __init__(self, n):
                self.ring = torch.zeros(n, pin_memory=True)
                self.buf = torch.zeros(n, device="cuda")
                self.copy_stream = torch.cuda.Stream()

            def issue(self):
                with torch.cuda.stream(self.copy_stream):
                    self.ring.copy_(self.buf, non_blocking=True)

            def resolve(self, exact):
                if exact:
                    torch.cuda.synchronize()
                    return None
                return self.ring.tolist()
        ''', '''
        import torch

        class Relay:
            def __init__(self, n):
                self.ring = torch.zeros(n, pin_memory=True)
                self.buf = torch.zeros(n, device="cuda")
                self.copy_stream = torch.cuda.Stream()

            def issue(self):
                with torch.cuda.stream(self.copy_stream):
                    self.ring.copy_(self.buf, non_blocking=True)

            def resolve(self, exact):
                if exact:
                    return self.buf.cpu()
                self.copy_stream.synchronize()
                return self.ring.tolist()
        ''', Hazard.UNSYNCED_D2H, "Relay.resolve", "self.ring"),
    # a poll that leaves when the copy's event is not done (``if not done[i].query():
    # return``) is a sync past it; the events may be kept in a list
    "a-poll-that-leaves-when-not-done": Rule('''
        import torch

        class Relay:
            def __init__(self, n, depth):
                self.ring = [torch.zeros(n, pin_memory=True) for _ in range(depth)]
                self.buf = torch.zeros(n, device="cuda")
                self.done = [torch.cuda.Event() for _ in range(depth)]
                self.copy_stream = torch.cuda.Stream()

            def issue(self, slot):
                with torch.cuda.stream(self.copy_stream):
                    self.ring[slot].copy_(self.buf, non_blocking=True)
                    self.done[slot].record()

            def resolve(self, slot):
                if not self.done[slot].query():
                    print("pending")
                return self.ring[slot].tolist()
        ''', '''
        import torch

        class Relay:
            def __init__(self, n, depth):
                self.ring = [torch.zeros(n, pin_memory=True) for _ in range(depth)]
                self.buf = torch.zeros(n, device="cuda")
                self.done = [torch.cuda.Event() for _ in range(depth)]
                self.copy_stream = torch.cuda.Stream()

            def issue(self, slot):
                with torch.cuda.stream(self.copy_stream):
                    self.ring[slot].copy_(self.buf, non_blocking=True)
                    self.done[slot].record()

            def resolve(self, slot):
                if not self.done[slot].query():
                    return None
                return self.ring[slot].tolist()
        ''', Hazard.UNSYNCED_D2H, "Relay.resolve", "self.ring"),
    # a node's backward on its own stream frees the gradients it was handed by hand:
    # ``if grads:`` with ``for g in grads:`` tests a sequence (no tensor's truth),
    # iterating reads no storage, and ``untyped_storage()`` names the bytes it frees
    "a-sequence-tested-iterated-and-freed-by-storage": Rule('''
        import torch

        class Node:
            def __init__(self, stream, fn):
                self.stream = stream
                self.fn = fn

            def backward(self, *grads):
                with torch.cuda.stream(self.stream):
                    grads = self.fn(grads)
                if grads:
                    for g in grads:
                        g.mul_(0.5)
                        g.untyped_storage().resize_(0)
        ''', '''
        import torch

        class Node:
            def __init__(self, stream, fn):
                self.stream = stream
                self.fn = fn

            def backward(self, *grads):
                with torch.cuda.stream(self.stream):
                    grads = self.fn(grads)
                if grads:
                    for g in grads:
                        g.record_stream(self.stream)
                        g.untyped_storage().resize_(0)
        ''', Hazard.UNORDERED, "Node.backward", "grads"),
    # a package wrapper's ``(tensor, work)`` pair unpacked by name: the work is the part
    # named for a handle (else the last), waited for later; its group or mode arguments
    # are no tensors the collective reads
    "a-work-handle-unpacked-from-a-wrappers-pair": Rule('''
        import torch
        import torch.distributed as dist

        def reduce_scatter(x, dim, mode, async_op=False):
            out = torch.empty_like(x)
            work = dist.reduce_scatter_tensor(out, x, group=mode, async_op=async_op)
            return out, work

        def backward(ctx, grad, weight):
            input_grad = torch.matmul(grad, weight)
            input_grad, input_op = reduce_scatter(input_grad, 0, ctx.input_mode, async_op=True)
            bias, bias_op = reduce_scatter(grad.sum(0), 0, ctx.input_mode, async_op=True)
            return input_grad, bias
        ''', '''
        import torch
        import torch.distributed as dist

        def reduce_scatter(x, dim, mode, async_op=False):
            out = torch.empty_like(x)
            work = dist.reduce_scatter_tensor(out, x, group=mode, async_op=async_op)
            return out, work

        def backward(ctx, grad, weight):
            input_grad = torch.matmul(grad, weight)
            input_grad, input_op = reduce_scatter(input_grad, 0, ctx.input_mode, async_op=True)
            bias, bias_op = reduce_scatter(grad.sum(0), 0, ctx.input_mode, async_op=True)
            input_op.wait()
            bias_op.wait()
            return input_grad, bias
        ''', Hazard.ASYNC_COLLECTIVE, "backward"),
    # futures of async collectives handed to ``collect_all`` in a list are handed on
    "futures-collected-in-a-list-are-handed-on": Rule('''
        import torch
        import torch.distributed as dist

        def hook(bucket, group):
            flat = bucket.buffer()
            out = torch.empty_like(flat)
            scale = flat.abs().amax().reshape(1)
            scales = torch.empty(2, device=flat.device)
            fut0 = dist.all_to_all_single(out, flat, group=group, async_op=True).get_future()
            fut1 = dist.all_gather_into_tensor(scales, scale, group=group,
                                               async_op=True).get_future()
            return out
        ''', '''
        import torch
        import torch.distributed as dist

        def hook(bucket, group):
            flat = bucket.buffer()
            out = torch.empty_like(flat)
            scale = flat.abs().amax().reshape(1)
            scales = torch.empty(2, device=flat.device)
            fut0 = dist.all_to_all_single(out, flat, group=group, async_op=True).get_future()
            fut1 = dist.all_gather_into_tensor(scales, scale, group=group,
                                               async_op=True).get_future()
            return torch.futures.collect_all([fut0, fut1])
        ''', Hazard.ASYNC_COLLECTIVE, "hook"),
    # a sync under a test that what it syncs exists (``if self.ev is not None``) is on
    # every path: with no event there is no copy to wait for
    "a-sync-guarded-by-its-events-presence": Rule('''
        import torch

        class Runner:
            def __init__(self, n, spec):
                self.counts_cpu = torch.zeros(n, pin_memory=True)
                self.counts = torch.zeros(n, device="cuda")
                self.ev = torch.cuda.Event() if spec else None

            def after_step(self, n):
                self.counts_cpu[:n].copy_(self.counts[:n], non_blocking=True)
                self.ev.record()

            def build(self, n, exact):
                if exact:
                    self.ev.synchronize()
                return self.counts_cpu[:n].tolist()
        ''', '''
        import torch

        class Runner:
            def __init__(self, n, spec):
                self.counts_cpu = torch.zeros(n, pin_memory=True)
                self.counts = torch.zeros(n, device="cuda")
                self.ev = torch.cuda.Event() if spec else None

            def after_step(self, n):
                self.counts_cpu[:n].copy_(self.counts[:n], non_blocking=True)
                self.ev.record()

            def build(self, n, exact):
                if self.ev is not None:
                    self.ev.synchronize()
                return self.counts_cpu[:n].tolist()
        ''', Hazard.UNSYNCED_D2H, "Runner.build", "self.counts_cpu"),
    # a sync in the copy's own branch covers the read after that branch: every path
    # that made the copy synced it (a sync in another branch covers nothing)
    "a-sync-in-the-copys-own-branch": Rule('''
        import torch

        def frames(videos, exact):
            if videos.is_cuda:
                host = torch.empty(videos.shape, dtype=videos.dtype, pin_memory=True)
                host.copy_(videos, non_blocking=True)
                videos = host.numpy()
            if exact:
                torch.cuda.current_stream().synchronize()
            return list(videos)
        ''', '''
        import torch

        def frames(videos, exact):
            if videos.is_cuda:
                host = torch.empty(videos.shape, dtype=videos.dtype, pin_memory=True)
                host.copy_(videos, non_blocking=True)
                torch.cuda.current_stream().synchronize()
                videos = host.numpy()
            return list(videos)
        ''', Hazard.UNSYNCED_D2H, "frames"),
    # every caller of the function's only caller waits first: a wait two calls up
    "a-wait-by-every-caller-of-its-caller": Rule('''
        import torch

        class Offloader:
            def __init__(self):
                self.d2h_stream = torch.cuda.Stream()

            def _offload_group(self, group):
                with torch.cuda.stream(self.d2h_stream):
                    for name, t in group.items():
                        group[name] = t.to("cpu", non_blocking=True)
                        t.record_stream(self.d2h_stream)

            def offload(self, group, ready):
                if ready:
                    self._offload_group(group)

            def commit(self, group):
                self.d2h_stream.wait_stream(torch.cuda.current_stream())
                self.offload(group, True)

            def flush(self, group):
                self.offload(group, True)
        ''', '''
        import torch

        class Offloader:
            def __init__(self):
                self.d2h_stream = torch.cuda.Stream()

            def _offload_group(self, group):
                with torch.cuda.stream(self.d2h_stream):
                    for name, t in group.items():
                        group[name] = t.to("cpu", non_blocking=True)
                        t.record_stream(self.d2h_stream)

            def offload(self, group, ready):
                if ready:
                    self._offload_group(group)

            def commit(self, group):
                self.d2h_stream.wait_stream(torch.cuda.current_stream())
                self.offload(group, True)
        ''', Hazard.UNORDERED, "Offloader._offload_group"),
    # a wait under a test that the waiting stream exists: with no side stream the
    # context enters none, and the work stays on the current stream
    "a-wait-guarded-by-its-streams-presence": Rule('''
        import torch

        def reduce_grad(chunk, grad, reduce_stream, eager):
            chunk.add_(grad)
            if eager:
                reduce_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(reduce_stream):
                chunk.div_(8)
            torch.cuda.current_stream().wait_stream(reduce_stream)
        ''', '''
        import torch

        def reduce_grad(chunk, grad, reduce_stream, eager):
            chunk.add_(grad)
            if reduce_stream is not None:
                reduce_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(reduce_stream):
                chunk.div_(8)
            torch.cuda.current_stream().wait_stream(reduce_stream)
        ''', Hazard.UNORDERED, "reduce_grad", "chunk"),
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _scan(path: Path) -> list[Finding]:
    return scan(open_source(str(path))).active


def _of(found: list[Finding], rule: Rule) -> list[Finding]:
    return [f for f in found if f.hazard is rule.cls and f.function == rule.function
            and (not rule.tensor or rule.tensor in f.tensors)]


@pytest.mark.parametrize("name", sorted(RULES))
def test_hazard_form_reported_safe_form_not(tmp_path, name):
    rule = RULES[name]
    bad = _of(_scan(_write(tmp_path, "hazard.py", rule.hazard)), rule)
    assert bad, f"{name}: the hazard form was not reported as {rule.cls.value}"
    good = [f for f in _scan(_write(tmp_path, "safe.py", rule.safe))
            if f.function == rule.function]
    assert not good, f"{name}: the safe form was reported: {[f.what for f in good]}"


def test_the_readme_example_handler_is_clean():
    found = scan(open_source(str(ROOT / "examples" / "my_handler.py"))).active
    assert not [(f.site, f.what) for f in found]


def test_a_module_is_never_a_tensor(tmp_path):
    src = '''
        import torch

        def foreach_reduce(reduce_output, all_reduce_stream):
            with torch.cuda.stream(all_reduce_stream):
                grad = torch.as_strided(reduce_output, (4,), (1,))
                grad.add_(1)
            reduce_output.record_stream(all_reduce_stream)
        '''
    found = _scan(_write(tmp_path, "m.py", src))
    assert not [f for f in found if "torch" in f.tensors]
    assert [f.tensors for f in found if f.hazard is Hazard.UNORDERED] == [("reduce_output",)]


def test_the_table_keeps_the_sites_file_and_line(tmp_path):
    from streamfuzz.fuzz.scan.report import table

    deep = tmp_path.joinpath(*[f"package_level_{i}" for i in range(6)])
    deep.mkdir(parents=True)
    src = RULES["record-stream-then-resize-is-a-free"].hazard
    _write(deep, "a_rather_long_module_name_for_offload.py", src)
    result = scan(open_source(str(tmp_path)))
    site = result.active[0].site
    assert len(site) > 48
    row = table(result).splitlines()[2]
    assert "a_rather_long_module_name_for_offload.py:" + str(result.active[0].line) in row


def test_a_tensor_another_name_still_holds_is_not_freed_by_del(tmp_path):
    src = '''
        import torch

        def stage(x, side):
            side.wait_stream(torch.cuda.current_stream())
            buf = x.clone()
            with torch.cuda.stream(side):
                host = buf.to("cpu", non_blocking=True)
            keep = buf
            del buf
            return host, keep
        '''
    def lifetimes(name: str, text: str) -> list[tuple[str, ...]]:
        return [f.factors for f in _scan(_write(tmp_path, name, text))
                if f.hazard is Hazard.LIFETIME]

    # returned through the alias: kept beyond the call, not freed here
    assert lifetimes("alias.py", src) == [("kept",)]
    dropped = textwrap.dedent(src).replace("keep = buf\n", "").replace(", keep", "")
    assert lifetimes("dropped.py", dropped) == [("freed",)]
    # a view of itself bound to the same name drops nothing either
    viewed = textwrap.dedent(src).replace("keep = buf\n", "").replace(
        "del buf", "buf = buf.view(-1)").replace(", keep", ", buf")
    assert lifetimes("viewed.py", viewed) == [("kept",)]


_SCHEDULER = '''
    import torch

    class Scheduler:
        def __init__(self):
            self.forward_stream = torch.cuda.Stream()
            self.forward_ctx = torch.cuda.stream(self.forward_stream)

        def event_loop(self):
            while True:
                self.run_batch(self.next_batch())

        def run_batch(self, batch):
            with self.forward_ctx:
                self.forward_stream.wait_stream(torch.cuda.current_stream())
                self.model(batch)
    '''
_LOADER = '''
    import torch

    class Controller:
        def start_loading(self, host, device):
            start_event = torch.cuda.Event()
            start_event.record()
            self.transfers.submit(host, device, start_event=start_event)
    '''


def test_a_stream_another_loop_keeps_current_is_named_and_left_to_the_dynamic_check(tmp_path):
    from streamfuzz.fuzz.scan.owners import DYNAMIC_CHECK

    def unseen(name: str, loader: str) -> list[Finding]:
        tree = tmp_path / name
        tree.mkdir()
        _write(tree, "sched.py", _SCHEDULER)
        _write(tree, "cache.py", loader)
        return [f for f in _scan(tree) if "owner-unseen" in f.factors]

    found = unseen("plain", _LOADER)
    assert [(f.function, f.line) for f in found] == [("Controller.start_loading", 7)]
    assert "forward_stream" in found[0].what and DYNAMIC_CHECK in found[0].what
    assert found[0].score < 30  # below every finding the source decides
    # A loader that orders its work after the forward stream too names it: not this rule's.
    fenced = textwrap.dedent(_LOADER).replace(
        "start_event.record()", "start_event.record(self.scheduler.forward_stream)")
    assert unseen("fenced", fenced) == []


def test_docs_cite_only_files_in_the_repository():
    import re

    text = (ROOT / "docs" / "scan.md").read_text()
    cited = set(re.findall(r"`((?:\.\./|tests/|fuzz/|docs/|examples/)[\w./-]+\.(?:py|md))`",
                           text))
    assert cited, "the pattern no longer finds the doc's citations"
    assert [c for c in sorted(cited) if not (ROOT / "docs" / c).exists()
            and not (ROOT / c).exists()] == []


def test_an_event_another_method_waits_on_lowers_a_drop_across_methods(tmp_path):
    rule = RULES["set-to-none-in-another-method"]
    plain = _of(_scan(_write(tmp_path, "plain.py", rule.hazard)), rule)
    synced = '''
        import torch

        class Drafts:
            def __init__(self):
                self.copy_stream = torch.cuda.Stream()
                self.ids_cpu = torch.empty(64, dtype=torch.int64, pin_memory=True)
                self.copied = torch.cuda.Event()

            def copy_out(self, ids):
                self.ids = ids
                self.copy_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.copy_stream):
                    self.ids_cpu.copy_(self.ids, non_blocking=True)
                    self.copied.record()

            def take(self):
                self.copied.synchronize()
                return self.ids_cpu.tolist()

            def reset(self):
                self.ids = None
        '''
    handed = _of(_scan(_write(tmp_path, "synced.py", synced)), rule)
    assert [f.factors for f in plain] == [("freed", "object-state", "other-method")]
    assert [f.factors for f in handed] == [
        ("freed", "object-state", "other-method", "consumed-elsewhere")]
    assert handed[0].score < plain[0].score


def test_a_handle_another_method_waits_on_lowers_a_drop_across_methods(tmp_path):
    src = '''
        import torch
        import torch.distributed as dist

        class Sharded:
            def __init__(self):
                self.async_stream = torch.cuda.Stream()
                self.shard = torch.empty(8, device="cuda")

            def forward(self, x):
                self.async_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.async_stream):
                    self.pending = self._reduce_async()
                return x

            def _reduce_async(self):
                return dist.reduce_scatter_tensor(self.shard, self.shard, async_op=True)

            def settle(self):
                pass

            def release(self):
                self.shard.untyped_storage().resize_(0)
        '''
    def drops(name: str, text: str) -> list[tuple[str, ...]]:
        return [f.factors for f in _scan(_write(tmp_path, name, text))
                if f.function == "Sharded.release"]

    assert drops("plain.py", src) == [("freed", "object-state", "other-method")]
    waited = textwrap.dedent(src).replace("        pass\n", "        self.pending.wait()\n")
    assert drops("waited.py", waited) == [
        ("freed", "object-state", "other-method", "consumed-elsewhere")]


_TIMERS = '''
    import torch

    class Interval:
        @staticmethod
        def create():
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return Interval(start=start)

    class Meter:
        def measure(self, fn):
            begin = self.events.pop()
            begin.record()
            fn()
            end = torch.cuda.Event()
            end.record()
            self.report(begin.elapsed_time(end))
            self.keep(begin, end)
    '''


def test_events_recorded_only_to_time_work_are_no_owner_unseen_handoff(tmp_path):
    tree = tmp_path / "pkg"
    tree.mkdir()
    _write(tree, "sched.py", _SCHEDULER)
    _write(tree, "timers.py", _TIMERS)
    _write(tree, "cache.py", _LOADER)
    found = [f.function for f in _scan(tree) if "owner-unseen" in f.factors]
    assert found == ["Controller.start_loading"]  # the ordering event, not the timers


def test_the_callers_stream_waiting_first_lowers_a_caller_owned_tensor(tmp_path):
    """A side stream reads the caller's buffer and nothing after orders the caller's
    stream: reported. Where the caller's stream first waits for the side stream (a
    double buffer handed back and forth: the previous call's read is ordered before
    the caller refills it), the same finding is lowered by the entry barrier."""
    bad = ('''
        import torch

        class Reducer:
            def __init__(self):
                self.reduce_stream = torch.cuda.Stream()

            def average(self, bucket):
                self.reduce_stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.reduce_stream):
                    bucket.div_(8)
        ''')
    good = bad.replace(
        "                self.reduce_stream.wait_stream(torch.cuda.current_stream())\n",
        "                self.reduce_stream.wait_stream(torch.cuda.current_stream())\n"
        "                torch.cuda.current_stream().wait_stream(self.reduce_stream)\n")
    assert good != bad
    before, after = ([f for f in _scan(_write(tmp_path, name, text))
                      if f.hazard is Hazard.LIFETIME and f.function == "Reducer.average"]
                     for name, text in (("bad.py", bad), ("good.py", good)))
    assert before and after
    assert "entry-barrier" not in before[0].factors
    assert "entry-barrier" in after[0].factors and after[0].score < before[0].score


def test_a_buffers_own_copy_helpers_are_no_host_readers(tmp_path):
    """A host/device buffer pair whose one method copies device-to-host without blocking
    and another slices the host half to copy it back: the slice reads no values."""
    found = _scan(_write(tmp_path, "buffer.py", '''
        import torch

        class Buffer:
            def __init__(self, n):
                self.cpu = torch.zeros(n, pin_memory=True)
                self.gpu = torch.zeros(n, device="cuda")

            def copy_to_gpu(self, n):
                cpu, gpu = self.cpu, self.gpu
                cpu, gpu = cpu[:n], gpu[:n]
                return gpu.copy_(cpu, non_blocking=True)

            def copy_to_cpu(self, n):
                return self.cpu[:n].copy_(self.gpu[:n], non_blocking=True)

        class PinnedOnDemand:
            def __init__(self, n, pin, device):
                self.pin = pin
                self.cpu = torch.zeros(n, device="cpu", pin_memory=pin)
                self.gpu = torch.zeros_like(self.cpu, device=device)
                self.np = self.cpu.numpy()

            def copy_to_gpu(self, n=None):
                cpu, gpu = self.cpu, self.gpu
                if n is not None:
                    cpu, gpu = cpu[:n], gpu[:n]
                return gpu.copy_(cpu.pin_memory() if self.pin else cpu, non_blocking=True)

            def copy_to_cpu(self, n):
                return self.cpu[:n].copy_(self.gpu[:n], non_blocking=True)
        '''))
    assert not [f.what for f in found if f.hazard is Hazard.UNSYNCED_D2H]


def test_a_method_name_another_unread_file_defines_too_is_not_resolved(tmp_path):
    """``self.reducer.flush()`` is not the one ``flush`` of the files read when a file
    with no stream words (not walked) defines another: the receiver's class is unknown."""
    (tmp_path / "ddp.py").write_text(textwrap.dedent('''
        import torch

        class DDP:
            def __init__(self, reducer):
                self.reducer = reducer
                self.comm_stream = torch.cuda.Stream()

            def step(self, loss):
                loss.backward()
                with torch.cuda.stream(self.comm_stream):
                    self.reducer.flush()
                torch.cuda.current_stream().wait_stream(self.comm_stream)

        class Cache:
            def __init__(self):
                self.table = torch.zeros(8, device="cuda")

            def flush(self):
                self.table.add_(1)
        '''))
    (tmp_path / "reducer.py").write_text(textwrap.dedent('''
        class Reducer:
            def flush(self):
                return None
        '''))
    only = [f for f in scan(open_source(str(tmp_path / "ddp.py"))).active
            if f.function == "DDP.step"]
    both = [f for f in scan(open_source(str(tmp_path))).active if f.function == "DDP.step"]
    assert only and "self.reducer.table" in only[0].tensors
    assert not both, [f.what for f in both]
