"""What binding a name does: aliasing, dropping the storage it held, handing on.

``x = y`` makes ``x`` another name of ``y``'s storage (or of the stream, event
or stream context ``y`` is); a local name bound again drops what it held; a
value stored in an attribute, a container or returned outlives the call.
"""

from __future__ import annotations

import ast
import re

from streamfuzz.fuzz.scan.names import (
    CONTAINER_ANN,
    DEVICE_MODULES,
    EVENTISH,
    HOSTISH,
    SPLITS,
    STREAMISH,
    Namer,
    callee_name,
    dotted,
    is_container,
    is_true,
    kw_arg,
)
from streamfuzz.fuzz.scan.ops import REBOUND, K, Op


class Binding(Namer):
    """The binding rules of the walker."""

    def assign(self, s: ast.Assign | ast.AnnAssign | ast.AugAssign) -> None:
        value = s.value
        if value is None:
            return
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        if isinstance(s, ast.AugAssign):
            self.expr(value)
            k = self.key(s.target)
            if k:
                self.emit(K.USE, s.lineno, stream=self.cur, key=k, write=True,
                          part=self.part(s.target))
                self.host_write(k, s.lineno)
            return
        if isinstance(s, ast.AnnAssign) and CONTAINER_ANN.match(ast.unparse(s.annotation)):
            for tgt in targets:
                k = self.key(tgt)
                if k and "." not in k:
                    self.t.containers.add(k)
        elif isinstance(s, ast.AnnAssign) and "Tensor" in ast.unparse(s.annotation):
            for tgt in targets:
                k = self.key(tgt)
                if k:
                    self.t.tensors.add(k)
        # another name for the same storage is no stream work
        made = None if isinstance(value, (ast.Name, ast.Attribute)) else self.expr(value)
        for tgt in targets:
            self.bind(tgt, value, s.lineno, made)
            if isinstance(tgt, ast.Name):  # on_side = current_stream() != s: `if on_side:`
                if isinstance(value, ast.Compare):
                    self.compares[tgt.id] = value
                else:
                    self.compares.pop(tgt.id, None)
                if isinstance(value, ast.Constant) and value.value is None:
                    self.nones.add(tgt.id)  # `s = None`, then `s = s or self._compute()`
                else:
                    self.nones.discard(tgt.id)

    def bind(self, tgt: ast.expr, value: ast.expr | None, line: int,
             made: str | None = None) -> None:
        """``tgt`` bound to ``value`` (None where unknown: a loop target, ``as``), whose
        evaluation made ``made``."""
        if isinstance(tgt, (ast.Tuple, ast.List)):
            self._bind_parts(tgt, value, line, made)
        elif isinstance(tgt, ast.Starred):
            self.bind(tgt.value, None, line)
        elif isinstance(tgt, ast.Subscript):
            self._bind_item(tgt, value, line, made)
        else:
            name = dotted(tgt)
            if name is None:
                return
            if value is None:
                self._bind_unknown(name, line, made)
            elif self._bind_handle(name, value):
                return
            elif "." in name:
                self._bind_attribute(tgt, name, value, line, made)
            else:
                self._bind_local(name, value, line, made)

    def _bind_parts(self, tgt: ast.Tuple | ast.List, value: ast.expr | None,
                    line: int, made: str | None = None) -> None:
        held = self.stream_of(value) if isinstance(value, (ast.Name, ast.Attribute)) else None
        if held is None and isinstance(value, (ast.Name, ast.Attribute)):
            k = self.key(value)
            held = k + "[]" if k and (k + "[]" in self.t.streams or k.endswith("streams")) \
                else None
        if held is not None and held.endswith("[]") and all(
                isinstance(t, ast.Name) for t in tgt.elts):
            for i, t in enumerate(tgt.elts):  # copy_s, compute_s = self._streams
                name = self.stream_lists.get(held[:-2], [])[i:i + 1] or [f"{held[:-2]}[{i}]"]
                self.alias[t.id] = name[0]  # type: ignore[attr-defined]
                self.t.streams.add(name[0])
            return
        cut = self._cut(value)
        if cut is not None and all(isinstance(t, ast.Name) for t in tgt.elts):
            for i, t in enumerate(tgt.elts):  # a, b = x.chunk(2): two regions of x
                self.rebind(t.id, line)  # type: ignore[attr-defined]
                self.alias[t.id], self.parts[t.id] = cut, f"c{i}"  # type: ignore[attr-defined]
            return
        split = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(tgt.elts)
        # out, work = wrapper(x, async_op=True): the async work is the part named for a
        # handle (op, work, handle), else the last
        handle = _handle_part(tgt) if made and made.startswith("<work@") and not split else -1
        for i, t in enumerate(tgt.elts):
            v = value.elts[i] if split else None  # type: ignore[union-attr]
            m = self.expr(v) if v is not None and not isinstance(
                v, (ast.Name, ast.Attribute)) else None  # another name: no stream work
            if i == handle:
                self.bind(t, None, line, made)
                continue
            if v is None and isinstance(value, ast.Call) and self.cur != self.t.base and \
                    isinstance(t, ast.Name) and not _device_query(value):
                m = self.fresh(t)  # unpacked from a call made on a side stream
                self.t.maybe.add(m)
            self.bind(t, v, line, m)

    def _bind_item(self, tgt: ast.Subscript, value: ast.expr | None, line: int,
                   made: str | None) -> None:
        k = self.key(tgt.value)
        if dotted(tgt.value) not in self.t.mappings:
            self.expr(tgt.slice)
        into = ""
        if k and k in self.t.containers:  # a container's item: a reference stored
            into = k
            if made:
                self.emit(K.KEEP, line, key=made, other=k)
        elif k:
            self.emit(K.USE, line, stream=self.cur, key=k, write=True, part=self.part(tgt))
            self.host_write(k, line)
        if value is not None:
            self.keep(value, line, into)

    def _cut(self, value: ast.expr | None) -> str | None:
        """The tensor ``x.chunk(n)`` / ``torch.split(x, n)`` cuts into parts, or None."""
        if not isinstance(value, ast.Call) or callee_name(value) not in SPLITS or not \
                isinstance(value.func, ast.Attribute):
            return None
        recv = value.func.value
        if self.is_module(recv):
            return self.key(value.args[0]) if value.args else None
        return self.key(recv)

    def _keep_exclusive_work(self, name: str, made: str | None) -> None:
        """A handle bound again in a branch that asserts the first binding's branch not
        taken (``assert not allreduce``): on that branch's path it holds the first work."""
        old = self.alias.get(name, "")
        if not (made and made.startswith("<work@") and old.startswith("<work@")):
            return
        launch = next((o for o in self.t.ops if o.kind is K.COLLECTIVE and o.other == old), None)
        here = Op(K.USE, 0, guards=tuple(self.guards))
        if launch is not None and self.t.excluded(here, self.t.tests_of(launch)):
            self.also_holds.setdefault(name, set()).add(old)

    def _bind_unknown(self, name: str, line: int, made: str | None) -> None:
        self._keep_exclusive_work(name, made)
        self.parts.pop(name, None)
        self.alias.pop(name, None)
        self.rebind(name, line)
        if made and "." not in name:
            self.alias[name] = made
            self.t.names[made] = name

    def _bind_handle(self, name: str, value: ast.expr) -> bool:
        """A stream, a stream context or an event bound to ``name``; False if not one."""
        stream = self._stream_value(value)
        if stream is not None:
            self.t.streams.add(name)
            before = self.alias.get(name)
            if stream == self.t.base and self.guards and before not in (None, self.t.base) \
                    and before in self.t.streams:
                return True  # `s = side` on one path, `s = current` on another: keep the side
            self.alias[name] = stream
            return True
        ctx = self.context_stream(value) if isinstance(value, ast.Call) else None
        if ctx is not None:
            self.contexts[name] = ctx
            return True
        if isinstance(value, ast.Call) and callee_name(value) in ("Stream", "ExternalStream"):
            self.t.streams.add(name)
            self.alias.pop(name, None)
            return True
        if isinstance(value, ast.Call) and callee_name(value) in ("Event", "record_event"):
            self.t.events.add(name)
            self.alias.pop(name, None)
            if is_true(kw_arg(value, "enable_timing")):
                self.t.timing_events.add(name)
            return True
        return False

    def _bind_attribute(self, tgt: ast.expr, name: str, value: ast.expr, line: int,
                        made: str | None) -> None:
        """``self.x = v``: v now outlives the call; what ``self.x`` held is dropped."""
        vk = self.key(value) if made is None else None
        if vk:
            self.emit(K.KEEP, line, key=vk)
        if made:
            self.emit(K.KEEP, line, key=made)
        k = self.key(tgt) or name
        dropped = isinstance(value, ast.Constant) and value.value is None
        if k in self.unset:
            pass  # under `if self.x is None`: it held nothing to drop
        elif k in self.t.tensors or (dropped and name.startswith("self.")):
            # the reference it held is dropped
            self.emit(K.FREE, line, key=k, flag="" if dropped else REBOUND)
        self.alias.pop(name, None)
        if made:
            self.alias[name] = made
            if made.startswith("<tmp@"):
                self.t.names[made] = name
            self.t.persistent.add(made)

    def _bind_local(self, name: str, value: ast.expr, line: int, made: str | None) -> None:
        self._keep_exclusive_work(name, made)
        vk = self.key(value) if made is None else None
        self.rebind(name, line, still=vk)
        self.parts.pop(name, None)
        self.stream_lists.pop(name, None)
        listed = _listed(value)
        if listed:
            named = [self.stream_of(e) for e in listed]
            if all(named):  # streams = [self.copy_stream, self.compute_stream]
                self.stream_lists[name] = [str(n) for n in named]
                self.t.streams.add(name + "[]")
        if vk and self.part(value):
            self.parts[name] = self.part(value)  # lo = x[:n]: that side of x
        if is_container(value):
            self.t.containers.add(name)
        if isinstance(value, (ast.Dict, ast.DictComp)) or (isinstance(value, ast.Call) and
                                                           callee_name(value) in _DICT_MAKERS):
            self.t.mappings.add(name)
        else:
            self.t.mappings.discard(name)
        if isinstance(value, ast.Call) and HOSTISH.search(callee_name(value)):
            self.t.host.add(made or name)  # staged = self._to_cpu(ids): the helper says host
            self.t.hosted.add(made or name)
        if made is None and isinstance(value, ast.Call) and self.cur != self.t.base and \
                vk is None and not _device_query(value):
            if EVENTISH.search(callee_name(value)) or EVENTISH.search(name.rsplit(".", 1)[-1]):
                self.t.events.add(name)  # event = backend.create_event(dev): no tensor
            else:
                made = self.fresh(value)  # what a call returns on a side stream is made there
                self.t.maybe.add(made)
        if made:
            self.alias[name] = made
            if made.startswith("<tmp@"):
                self.t.names[made] = name
        elif vk and vk != name:
            self.alias[name] = vk
            if vk in self.t.events:
                self.t.events.add(name)
        else:
            self.alias.pop(name, None)

    def bind_items(self, target: ast.expr, it: ast.expr) -> None:
        """``for x in xs``: ``x`` stands for the storage of ``xs``'s items, which its
        owner holds (``zip`` and ``enumerate`` are looked through)."""
        if isinstance(it, ast.Call) and callee_name(it) in ("zip", "enumerate", "reversed"):
            if callee_name(it) == "enumerate" and isinstance(target, ast.Tuple) and len(
                    target.elts) == 2 and it.args:
                self.bind_items(target.elts[1], it.args[0])
            elif callee_name(it) == "zip" and isinstance(target, ast.Tuple) and len(
                    target.elts) == len(it.args):
                for t, a in zip(target.elts, it.args):
                    self.bind_items(t, a)
            elif callee_name(it) == "reversed" and it.args:
                self.bind_items(target, it.args[0])
            return
        name = dotted(target)
        k = self.key(it) if isinstance(it, (ast.Name, ast.Attribute)) else None
        if name and k and (k + "[]" in self.t.streams or STREAMISH.search(
                k.rsplit(".", 1)[-1]) and k.endswith("streams")):
            self.t.streams.add(k + "[]")  # for s in streams: each of them
            self.alias[name] = k + "[]"
            return
        if name and k and k not in self.t.streams and k not in self.t.events:
            self.alias[name] = k
            if name in self.t.tensors:
                self.t.tensors.add(k)

    def _stream_value(self, value: ast.expr) -> str | None:
        if isinstance(value, ast.Call) and callee_name(value) in ("current_stream",
                                                                     "default_stream"):
            return self.stream_of(value)
        if isinstance(value, (ast.Name, ast.Attribute, ast.IfExp, ast.Subscript, ast.BoolOp)):
            return self.stream_of(value)
        if isinstance(value, ast.Call) and callee_name(value) not in ("Stream", "ExternalStream"):
            return self.stream_of(value)  # a helper, or a call named like one, gives a stream
        return None

    def rebind(self, name: str, line: int, still: str | None = None) -> None:
        """A local name bound again: the storage it held is dropped here, unless another
        name still holds it, or the new value is a view of it (``x = x.view(-1)``)."""
        old = self.alias.get(name, name)
        if name in self.bound and old.startswith("<tmp@") and old not in self.t.persistent \
                and old != still and not self.held_elsewhere(name, old):
            self.emit(K.FREE, line, key=old)
        self.bound.add(name)

    def held_elsewhere(self, name: str, key: str) -> bool:
        """Does a local name other than ``name`` still hold the storage ``key``?"""
        return any(v == key and n != name and "." not in n for n, v in self.alias.items())


def _listed(value: ast.expr) -> list[ast.expr]:
    """The items a container literal holds: ``[a, b]``, ``{a, b}``, or a comprehension
    that picks from such a literal (``{s for s in (a, b) if s is not None}``)."""
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return list(value.elts)
    if isinstance(value, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and len(
            value.generators) == 1:
        gen = value.generators[0]
        if isinstance(gen.target, ast.Name) and isinstance(value.elt, ast.Name) and \
                value.elt.id == gen.target.id and isinstance(gen.iter, (ast.List, ast.Tuple)):
            return list(gen.iter.elts)
    return []


_DICT_MAKERS = {"dict", "defaultdict", "OrderedDict"}


def _device_query(c: ast.Call) -> bool:
    """Is ``c`` a device module's query (``torch.cuda.memory_reserved()``,
    ``mem_get_info()``, ``current_device()``), which returns host numbers?"""
    parts = (dotted(c.func) or "").split(".")
    return len(parts) >= 2 and parts[-2] in DEVICE_MODULES and bool(_QUERY.match(parts[-1]))


_QUERY = re.compile(r"(?:memory_|max_memory|mem_get_info|current_device|device_count|"
                    r"get_device|is_|utilization|temperature|power_draw|clock_rate)")
_HANDLE = re.compile(r"(?:^|_)(?:op|ops|work|works|handle|handles|req|future|fut)$")


def _handle_part(tgt: ast.Tuple | ast.List) -> int:
    names = [e.id if isinstance(e, ast.Name) else "" for e in tgt.elts]
    named = [i for i, n in enumerate(names) if _HANDLE.search(n)]
    return named[0] if len(named) == 1 else len(names) - 1
