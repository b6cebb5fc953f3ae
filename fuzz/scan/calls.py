"""What a call does to ordering and to tensors, by its shape.

A call is tried against the ordering rules first (``record_stream``, waits,
events, host syncs), then taken as work queued on the current stream: a tensor
method, a ``torch``/``numpy`` function, an async collective, or a call into
the package, whose effects its own walk lends (``streamfuzz.fuzz.scan.package``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from streamfuzz.fuzz.scan.names import (
    ASYNC_COLLECTIVE,
    CONTAINER_METHODS,
    DEVICE_MODULES,
    EVENTISH,
    HOST_BUILTINS,
    HOST_READS,
    HOSTISH,
    META,
    NOT_TENSOR_TORCH,
    TENSOR_METHODS,
    THREAD_SPAWNERS,
    VIEWS,
    Namer,
    callee_name,
    dotted,
    is_cpu_device,
    is_true,
    kw_arg,
)
from streamfuzz.fuzz.scan.ops import ANY, ARGUMENT, COPY_SOURCE, DEFAULT, STORAGE, K

SHAPED_MAKERS = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                           "randn_like", "randint_like", "new_empty", "new_zeros", "new_ones",
                           "new_full"})
"""Calls that make a tensor from another's shape, dtype and device: no kernel reads it."""
_TO_DEVICE = frozenset({"to", "cuda", "npu", "xpu", "mps", "hpu"})
"""Methods that copy their receiver to a device (a host tensor's device copy is not host)."""
_NO_STORAGE = frozenset({"isinstance", "issubclass", "type", "id", "callable", "hasattr"})
"""Builtins that look at an object, not at a tensor's bytes."""
_STORAGES = frozenset({"untyped_storage", "storage", "_typed_storage"})
"""Calls that give a tensor's storage."""
_NOT_TENSOR_ARG = re.compile(r"(?:^|_)(?:mode|group|pg|op|dim|rank|src|dst|world_size)$")
"""A collective's argument named as its group, mode, rank or dimension: not a tensor."""
_PASS = "<pass>"
"""An ordering rule's answer when the call is not of its shape."""


def _device_module(node: ast.expr) -> bool:
    """Is ``node`` torch or one of its device modules (``torch.cuda``, ``torch.xpu``,
    ``self.device_module``), whose ``synchronize()`` waits for the whole device?"""
    text = dotted(node) or ""
    head, _, rest = text.partition(".")
    return text == "torch" or (head == "torch" and "." not in rest) or \
        text.rsplit(".", 1)[-1] in DEVICE_MODULES


class Calls(Namer):
    """The call rules of the walker."""

    def call(self, c: ast.Call) -> str | None:
        """Record what the call does; the key of a tensor it makes, if any."""
        name = callee_name(c)
        recv = c.func.value if isinstance(c.func, ast.Attribute) else None
        rk = self.key(recv) if recv is not None else None
        for rule in (self._stream_order, self._event_call, self._host_sync):
            made = rule(c, name, recv, rk)
            if made != _PASS:
                return made
        if name in THREAD_SPAWNERS:
            for a in [*c.args, *(k.value for k in c.keywords)]:
                self.expr(a) if not isinstance(a, (ast.Name, ast.Attribute)) else None
            return None
        return self._work(c, name, recv, rk)

    # -- ordering ------------------------------------------------------------

    def _stream_order(self, c: ast.Call, name: str, recv: ast.expr | None,
                      rk: str | None) -> str | None:
        line = c.lineno
        if name == "record_stream" and rk:
            self.t.tensors.add(rk)
            s = self.stream_of(c.args[0]) if c.args else None
            # in a loop over a set of streams built here: each of them
            for each in self.stream_lists.get(s[:-2], [s]) if s and s.endswith("[]") else [s]:
                self.emit(K.RECORD, line, key=rk, stream=each or ANY)
            return None
        if name == "set_stream" and c.args and (recv is None or self.is_module(recv) or (
                dotted(recv) or "").rsplit(".", 1)[-1] in DEVICE_MODULES):
            # torch.cuda.set_stream(s): the current stream from here on
            s = self.stream_of(c.args[0]) or self.key(c.args[0])
            if s:
                self.t.streams.add(s)
                self.stack[-1] = s
                if s != self.t.base:
                    self.t.entered.add(s)
                    self.t.entries.append((s, len(self.t.ops)))
            return None
        if name == "wait_stream" and recv is not None:
            waiter = self.stream_of(recv) or rk or ANY
            waited = self.stream_of(c.args[0]) if c.args else None
            if c.args and isinstance(c.args[0], ast.Call) and \
                    callee_name(c.args[0]) == "default_stream":
                waited = DEFAULT  # named so, not bound as the function's compute stream
            self.emit(K.WAIT, line, stream=waiter, other=waited or ANY)
            return None
        if name == "wait_event" and recv is not None:
            waiter = self.stream_of(recv) or rk or ANY
            ev = self.event_of(c.args[0]) if c.args else None
            if ev is None and c.args:
                ev = self.key(c.args[0])
            self.emit(K.WAIT_EVENT, line, stream=waiter, key=ev or ANY)
            return None
        return _PASS

    def _event_call(self, c: ast.Call, name: str, recv: ast.expr | None,
                    rk: str | None) -> str | None:
        line = c.lineno
        if name == "record" and rk:
            self.t.recorded.add(rk)
        if name in ("wait", "query") and rk:
            self.t.waited.add(rk)
        if name == "record" and rk and (rk in self.t.events or EVENTISH.search(rk)):
            self.t.events.add(rk)
            s = self.stream_of(c.args[0]) if c.args else self.cur
            if c.args and s is None:
                s = self.key(c.args[0]) or ANY
            self.emit(K.EVENT_RECORD, line, key=rk, stream=s or self.cur)
            return None
        if name == "record_event":
            s = self.stream_of(recv) if recv is not None else self.cur
            arg = c.args[0] if len(c.args) == 1 else kw_arg(c, "event")
            given = (self.event_of(arg) or self.key(arg)) if arg is not None and s else None
            if given:  # stream.record_event(ev) records ev, as ev.record(stream) does
                self.t.events.add(given)
                self.t.recorded.add(given)
                self.emit(K.EVENT_RECORD, line, key=given, stream=s or self.cur)
                return None
            made = f"<event@{line}:{c.col_offset}>"
            self.t.events.add(made)
            self.emit(K.EVENT_RECORD, line, key=made, stream=s or self.cur)
            return made
        if name == "wait" and rk is not None:
            if rk in self.t.events or EVENTISH.search(rk):
                s = self.stream_of(c.args[0]) if c.args else self.cur
                self.emit(K.WAIT_EVENT, line, stream=s or self.cur, key=rk)
            else:
                self.emit(K.WORK_WAIT, line, key=rk, stream=self.cur)
                for other in sorted(self.also_holds.get(  # type: ignore[attr-defined]
                        ast.unparse(recv) if recv is not None else "", ())):
                    self.emit(K.WORK_WAIT, line, key=other, stream=self.cur)
            return None
        return _PASS

    def _host_sync(self, c: ast.Call, name: str, recv: ast.expr | None,
                   rk: str | None) -> str | None:
        if name != "synchronize" and name.endswith("synchronize") and recv is None:
            # a saved alias of Event.synchronize / Stream.synchronize: its argument
            target = ""
            if c.args:
                a0 = c.args[0]
                target = self.stream_of(a0) or self.key(a0) or ""
            self.emit(K.HOST_SYNC, c.lineno, key=target)
            return None
        if name == "synchronize":
            target = ""
            if isinstance(recv, ast.Call):  # current_stream().synchronize(), else a device
                target = self.stream_of(recv) or ""
            elif recv is not None and not _device_module(recv):
                target = self.stream_of(recv) or (self.event_of(recv) if rk else None) or \
                    rk or ast.unparse(recv)
            self.emit(K.HOST_SYNC, c.lineno, key=target)
            return None
        return _PASS

    # -- work ----------------------------------------------------------------

    def _work(self, c: ast.Call, name: str, recv: ast.expr | None,
              rk: str | None) -> str | None:
        """Work queued by the call: its receiver and arguments, on the current stream."""
        line = c.lineno
        owner = self._storage_owner(c.args[0]) if name == "set_" and c.args and \
            isinstance(recv, ast.Name) else None
        if owner and recv is not None:  # tmp.set_(x.untyped_storage(), ...): x's bytes
            for a in [*c.args[1:], *(k.value for k in c.keywords)]:
                self.expr(a)
            self.rebind(recv.id, line, still=owner)  # type: ignore[attr-defined]
            self.alias[recv.id] = owner  # type: ignore[attr-defined]
            self.t.tensors.add(owner)
            return None
        if isinstance(recv, ast.Subscript) and rk is not None:
            self.expr(recv.slice)  # x[i].copy_(...): a view of x, not a host read of it
        elif recv is not None and not isinstance(recv, (ast.Name, ast.Attribute)):
            made_recv = self.expr(recv)  # a chained call or an index: its own work first
            if made_recv is not None:
                rk = made_recv
        if rk is not None and rk.startswith("<work@") and name in ("get_future", "then"):
            return rk  # the work's future: waiting on it waits for the work
        if recv is None and name in _NO_STORAGE:
            return None  # isinstance(x, T), type(x): the object, none of its bytes
        if self.holds is not None and self.holds(c):
            # Record(a=x, b=y): the object holds references, as a tuple does; no
            # stream touches x or y here
            for a in [*c.args, *(k.value for k in c.keywords)]:
                if not isinstance(a, (ast.Name, ast.Attribute, ast.Constant, ast.Starred)):
                    self.expr(a)
            return None
        for a in [*c.args, *(k.value for k in c.keywords)]:
            for e in a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a]:
                k = self.key(e) if isinstance(e, (ast.Name, ast.Attribute)) else None
                if k and k.startswith("<work@"):  # collect_all([fut0, fut1]): handed on
                    self.emit(K.USE, line, stream=self.cur, key=k)
        effects = list(self.callee(c)) if self.callee is not None and self._may_lend(
            c, name, recv, rk) else None
        lent = {e.param for e in effects or () if e.what == "use"}  # the callee's uses
        arg_keys = [self.key(a) if i == 0 and name in SHAPED_MAKERS and isinstance(
            a, (ast.Name, ast.Attribute)) else self._argument(a) if ast.unparse(a) in lent
            else self.expr(a) or self.key(a) for i, a in enumerate(c.args)]
        for kw in c.keywords:
            if kw.arg in ("out",):
                k = self.key(kw.value)
                if k:
                    self.t.tensors.add(k)
                    self.emit(K.USE, line, stream=self.cur, key=k, write=True)
                    self.host_write(k, line)
            else:
                self.expr(kw.value)
        if name in HOST_READS and rk:
            self.t.tensors.add(rk)
            self.emit(K.HOST_READ, line, key=rk, flag=name)
            return None
        if name == "numpy" and rk:
            self.t.host.add(rk)
            return None
        if recv is None and name in HOST_BUILTINS:
            for k in arg_keys:
                if k and k in self.t.host:
                    self.emit(K.HOST_READ, line, key=k, flag=name)
            return None
        if rk and name in META:
            return None
        if rk in self.t.containers and name in CONTAINER_METHODS:
            for i, a in enumerate([*c.args, *(k.value for k in c.keywords)]):
                made = arg_keys[i] if i < len(arg_keys) and isinstance(a, ast.Call) else None
                if made:  # xs.append(f(...)): what the call gave is in xs
                    self.emit(K.KEEP, line, key=made, other=rk)
                else:
                    self.keep(a, line, into=rk)
            return None
        if rk and "." in rk and name in CONTAINER_METHODS and rk not in self.t.tensors and \
                not rk.startswith("<"):
            for a in [*c.args, *(k.value for k in c.keywords)]:
                self.keep(a, line)  # self.pending.append(x): kept with the object
            return None
        if rk in ("self", "cls"):
            rk = None
        tensor_recv = rk is not None and (name in TENSOR_METHODS or rk in self.t.tensors)
        if rk and name in TENSOR_METHODS:
            self.t.tensors.add(rk)
        if is_true(kw_arg(c, "async_op")) or name in ASYNC_COLLECTIVE:
            work = f"<work@{line}:{c.col_offset}>"
            for k in arg_keys:
                if k and not _NOT_TENSOR_ARG.search(k.rsplit(".", 1)[-1]):
                    self.t.tensors.add(k)
                    self.emit(K.COLLECTIVE, line, key=k, other=work, stream=self.cur)
            return work
        if name == "copy_" and rk:
            self._copy(c, rk, arg_keys[0] if arg_keys else None)
            return None
        if rk and tensor_recv:
            return self._tensor_method(c, name, rk)
        if recv is not None and name in TENSOR_METHODS and c.args and self.is_module(recv) \
                and (dotted(recv) or "").startswith("torch"):
            first = arg_keys[0]  # torch.narrow(x, ...), torch.cumsum(x, 0): x is a tensor
            if first:
                self.t.tensors.add(first)
                if name in VIEWS:
                    self.emit(K.USE, line, stream=self.cur, key=first)
                    return None
        full = dotted(c.func) or ""
        module_fn = full.startswith(("torch.", "F.", "np.", "numpy."))
        if rk and recv is not None and not module_fn:
            self.emit(K.USE, line, stream=self.cur, key=rk)
        if module_fn and not NOT_TENSOR_TORCH.match(full):
            return self._module_call(c, full, arg_keys)
        for k, a in zip(arg_keys, c.args):
            if k:  # handed to a callee whose own uses of it are lent below: ARGUMENT
                self.emit(K.USE, line, stream=self.cur, key=k, part=self.part(a),
                          flag=ARGUMENT if ast.unparse(a) in lent else "")
        self._package_call(c, name, effects)
        return None

    def _may_lend(self, c: ast.Call, name: str, recv: ast.expr | None,
                  rk: str | None) -> bool:
        """May the call be the package's own (not a tensor method, a torch or numpy
        function, a builtin)? Only such a call's callee is walked before its arguments."""
        if rk is not None and (name in TENSOR_METHODS or rk in self.t.tensors or name in META):
            return False
        if recv is None and name in HOST_BUILTINS:
            return False
        return not (dotted(c.func) or "").startswith(("torch.", "F.", "np.", "numpy."))

    def _argument(self, a: ast.expr) -> str | None:
        """An argument the callee's lent uses stand for: read as ``expr`` reads it,
        flagged ``ARGUMENT``."""
        if not isinstance(a, (ast.Name, ast.Attribute)):
            return self.expr(a) or self.key(a)
        k = self.key(a)
        if k and k not in self.t.streams and k not in self.t.events:
            self.emit(K.USE, a.lineno, stream=self.cur, key=k, part=self.part(a), flag=ARGUMENT)
        return k

    def _storage_owner(self, node: ast.expr) -> str | None:
        """The tensor whose storage ``node`` is (``x.untyped_storage()``, or ``x``
        itself), for ``set_``: the view set on it shares its bytes, and so its
        ``record_stream`` and its last writes."""
        if isinstance(node, ast.Call) and callee_name(node) in _STORAGES and \
                isinstance(node.func, ast.Attribute):
            return self.key(node.func.value)
        k = self.key(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        return k if k in self.t.tensors else None

    def _copy(self, c: ast.Call, dst: str, src: str | None) -> None:
        line = c.lineno
        recv = c.func.value if isinstance(c.func, ast.Attribute) else c.func
        self.emit(K.USE, line, stream=self.cur, key=dst, write=True, part=self.part(recv))
        if is_true(kw_arg(c, "non_blocking")) and src:
            self.t.tensors.add(src)
            self.emit(K.NB_COPY, line, stream=self.cur, key=dst, other=src,
                      flag=self._direction(dst, src))
        else:
            self.host_write(dst, line)
        if src:
            self.t.tensors.add(src)

    def _tensor_method(self, c: ast.Call, name: str, rk: str) -> str | None:
        line = c.lineno
        write = name.endswith("_") and not name.endswith("__")
        if name == "resize_" and c.args and isinstance(c.args[0], ast.Constant) and \
                c.args[0].value == 0:
            # the storage goes back to the allocator: a free, not a kernel's write
            self.emit(K.FREE, line, key=rk, flag=STORAGE)
            return rk
        if name not in SHAPED_MAKERS and name not in _STORAGES:
            # x.new_empty(n) reads none of x's storage; x.untyped_storage() names it
            self.emit(K.USE, line, stream=self.cur, key=rk, write=write,
                      flag=COPY_SOURCE if self._to_device(c, name) else "",
                      part=self.part(c.func.value) if isinstance(c.func, ast.Attribute) else "")
        if write:
            self.host_write(rk, line)
            return rk  # in-place ops return their receiver
        if name in VIEWS:
            return None
        made = self.fresh(c)
        self.t.tensors.add(made)
        if name == "pin_memory":
            self.t.pinned.add(made)
            self.t.host.add(made)
        elif name not in _TO_DEVICE and (rk in self.t.hosted or rk in self.t.pinned or
                                             HOSTISH.search(rk.rsplit(".", 1)[-1])):
            self.t.host.add(made)  # lens_cpu.cumsum(0): the host computes it, on the host
            self.t.hosted.add(made)
        elif name == "cpu" or (name == "to" and (
                is_cpu_device(c.args[0] if c.args else kw_arg(c, "device")))):
            self.t.host.add(made)
            if not is_true(kw_arg(c, "non_blocking")) and rk not in self.t.host:
                # a blocking copy to the host waits for the current stream's work, as
                # .item() and .tolist() do: a sync for the host's reads of copies
                self.emit(K.HOST_READ, line, key=rk, flag="cpu")
        if is_true(kw_arg(c, "non_blocking")) and name in ("to", "cuda", "cpu"):
            self.emit(K.NB_COPY, line, stream=self.cur, key=made, other=rk,
                      flag="d2h" if made in self.t.host else "h2d")
        return made

    def _to_device(self, c: ast.Call, name: str) -> bool:
        """Is the call a copy of its receiver to a device, with no dtype change?"""
        if name == "cuda":
            return not any(k.arg == "dtype" for k in c.keywords)
        if name != "to" or len(c.args) > 1 or any(k.arg == "dtype" for k in c.keywords):
            return False
        target = c.args[0] if c.args else kw_arg(c, "device")
        if target is None or is_cpu_device(target):
            return False
        if isinstance(target, ast.Constant):
            return isinstance(target.value, str)
        if isinstance(target, ast.Call):
            return callee_name(target) == "device"
        text = dotted(target) or ""
        last = text.rsplit(".", 1)[-1]
        if not text or last == "dtype" or (text.startswith("torch.") and last != "device"):
            return False  # a dtype: a conversion kernel reads the receiver
        return self.key(target) not in self.t.tensors  # .to(other): other's dtype too

    def _module_call(self, c: ast.Call, full: str, arg_keys: list[str | None]) -> str | None:
        """A ``torch.``/``numpy.`` function: a new tensor, or the host touching its arguments."""
        line = c.lineno
        if full.startswith(("np.", "numpy.")):
            for i, k in enumerate(arg_keys):
                if not k:
                    continue
                if i == 0 and full.split(".")[-1] in ("copyto", "put", "place"):
                    self.host_write(k, line)
                elif k in self.t.host:
                    self.emit(K.HOST_READ, line, key=k, flag="numpy")
            return None
        made = self.fresh(c)
        self.t.tensors.add(made)
        shaped = full.split(".")[-1] in SHAPED_MAKERS  # torch.empty_like(x): x's shape only
        for i, k in enumerate(arg_keys):
            if k and not (shaped and i == 0):
                self.emit(K.USE, line, stream=self.cur, key=k)
        dev = kw_arg(c, "device")
        if is_true(kw_arg(c, "pin_memory")):
            self.t.pinned.add(made)
            self.t.host.add(made)
        elif full.endswith("from_numpy") or (dev is None and full.split(".")[-1] in (
                "empty", "zeros", "ones", "full", "tensor", "arange", "as_tensor")) or \
                is_cpu_device(dev):
            self.t.host.add(made)
        return made

    def _package_call(self, c: ast.Call, name: str, effects: list[Any] | None = None) -> None:
        """A call the scan may resolve in the package: the effects its walk lends."""
        line = c.lineno
        self.t.calls.append((name, line, len(c.args), frozenset(
            k.arg for k in c.keywords if k.arg), self.cur))
        if self.callee is None:
            return
        for eff in self.callee(c) if effects is None else effects:
            if eff.what == "wait":
                self.emit(K.WAIT, line, stream=ANY, other=ANY)
            elif eff.what == "sync":
                self.emit(K.HOST_SYNC, line, key="", flag=eff.flag)
            else:
                k = self.key(ast.parse(eff.param, mode="eval").body) if eff.param else None
                if not k:
                    continue
                k += eff.suffix
                if eff.what == "record":
                    self.t.tensors.add(k)  # what the callee record_streams is a tensor
                    self.emit(K.RECORD, line, key=k, stream=ANY)
                elif eff.what == "free":
                    self.emit(K.FREE, line, key=k, flag=eff.flag)
                else:
                    self.t.tensors.add(k)
                    self.emit(K.USE, line, stream=self.cur, key=k, write=eff.write,
                              flag=eff.flag)

    def _direction(self, dst: str, src: str) -> str:
        dh = dst in self.t.host or bool(HOSTISH.search(dst))
        sh = src in self.t.host or bool(HOSTISH.search(src))
        if dh and not sh:
            return "d2h"
        if sh and not dh:
            return "h2d"
        return "?"
