"""What the static pass of ``fuzz scan`` says about one function: its ops.

An ``Op`` is one thing the function does to a tensor, stream or event (an
allocation on the current stream, a use, a ``record_stream``, a wait, an event
record, a host sync, a non-blocking copy, a free...), in source order; a
``Trace`` is the flat list of them plus what the function's names were found
to be. ``streamfuzz.fuzz.scan.streams_ast`` makes traces,
``streamfuzz.fuzz.scan.hazards`` judges them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from enum import Enum

CURRENT = "<current>"
"""The stream current when the function is entered: its caller's."""
THREAD = "<thread>"
"""The current stream of a function that a thread runs (not its submitter's)."""
SUBMITTER = "<submitter>"
"""Where a thread's inputs were made: the stream of the code that handed them over."""
DEFAULT = "<default>"
"""The stream a ``wait_stream(default_stream())`` waits for. The default stream is the
current one only where nothing made another current, which a function cannot know of
its caller (a backward hook runs on the stream its forward op ran on; a scheduler's loop
enters its own): such a wait orders none of the caller's work. A function that binds the
default stream as its compute stream (``compute = default_stream()``) says it runs
there, and keeps it as its current stream."""
ANY = "<any>"
"""A stream or event a callee orders without naming it to the caller."""
BLOCKING_READS = frozenset({"item", "tolist", "cpu"})
"""Host reads of a device tensor (a ``HOST_READ``'s flag) that block the host until the
current stream has run up to them: a sync for the host's reads of earlier copies."""
OWN = "own"
"""A stream helper lookup's kind for a function of the package's own that neither
returns nor enters a stream: its name (``open_chat_stream(payload)``) then says nothing."""
COPY_SOURCE = "copy-source"
"""A use's flag: the key is read as the source of a copy to a device (``.to(device)``,
``.cuda()``). Such a source is host memory, whose pinned block the host allocator
holds until the copy's stream has passed it (a pageable one is staged before the
call returns), or a tensor already on that device, for which the call queues nothing:
either way, dropping it after the call cannot free memory the copy still reads."""
ARGUMENT = "argument"
"""A use's flag: the key is an argument of a package call whose own uses of it the
callee's walk lends at the call (the argument's read stands for what the callee does)."""
STORAGE = "storage"
"""A free's flag: the storage itself goes back (``untyped_storage().resize_(0)``),
whatever other references to the tensor remain."""

REBOUND = "rebound"
"""A free's flag: an attribute bound to a new value (what it held is dropped as a
side effect, as in a setup method), not an explicit ``del`` or ``= None``."""


class K(str, Enum):
    ALLOC = "alloc"          # key made on stream (flag: pinned, host)
    USE = "use"              # key read (or written, .write) by work on stream (flag: COPY_SOURCE)
    RECORD = "record_stream"
    WAIT = "wait_stream"     # stream waits for other
    WAIT_EVENT = "wait_event"
    EVENT_RECORD = "event_record"
    HOST_SYNC = "host_sync"  # key: the stream or event synced ('' for the device)
    HOST_READ = "host_read"
    HOST_WRITE = "host_write"
    NB_COPY = "nb_copy"      # key <- other without blocking (flag: d2h, h2d, ?)
    FREE = "free"          # key's reference dropped (flag: STORAGE, its storage; REBOUND)
    KEEP = "keep"            # key outlives the call (stored, returned)
    COLLECTIVE = "collective"  # key handed to an async collective; other: its work
    WORK_WAIT = "work_wait"


@dataclass(frozen=True)
class Op:
    kind: K
    line: int
    stream: str = ""
    key: str = ""
    other: str = ""
    write: bool = False
    flag: str = ""
    guards: tuple[int, ...] = ()
    part: str = ""  # a use's region of key, where known (disjoint_parts)


def disjoint_parts(a: str, b: str) -> bool:
    """Are two regions of one tensor apart: chunks or items of different index
    (``c0``/``c1``, ``i0``/``i1``), or the two sides of one cut (``s:n``/``sn:``)?"""
    if not a or not b or a == b:
        return False
    if a[0] == b[0] and a[0] in "ci":
        return True
    return {a, b} == {f"s:{a[2:]}", f"s{a[2:]}:"} if a.startswith("s:") else \
        {a, b} == {f"s:{b[2:]}", f"s{b[2:]}:"} if b.startswith("s:") else False


@dataclass
class Loop:
    """A loop of the function: where each pass of its walk put its ops, and, for a
    ``for VAR in range(...)``, the index and the range's arguments."""

    var: str | None
    bounds: tuple[ast.expr, ...]
    depth: int  # how many branches it is under: its ops' guards start with those
    node: ast.stmt  # the loop itself (a ``break`` or ``return`` in it may end it early)
    passes: list[tuple[int, int]] = field(default_factory=list)  # (first op, end) each


@dataclass
class Trace:
    """One function's ops and what its names were found to be."""

    file: str
    qualname: str
    line: int
    cls: str | None
    params: tuple[str, ...]
    thread: bool
    ops: list[Op] = field(default_factory=list)
    tensors: set[str] = field(default_factory=set)
    host: set[str] = field(default_factory=set)
    pinned: set[str] = field(default_factory=set)
    hosted: set[str] = field(default_factory=set)  # host memory by a helper's name: no stream's
    persistent: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    timing_events: set[str] = field(default_factory=set)
    # (name, line, positional arguments, keywords, the stream current at the call)
    calls: list[tuple[str, int, int, frozenset[str], str]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # made-here key -> how the code names it
    entered: set[str] = field(default_factory=set)  # streams made current here (contexts)
    entries: list[tuple[str, int]] = field(default_factory=list)  # (stream, ops index) entered
    at: dict[int, str] = field(default_factory=dict)  # a statement's line -> the stream current

    maybe: set[str] = field(default_factory=set)  # made here, tensors only if used as ones
    containers: set[str] = field(default_factory=set)  # Python lists, dicts...: hold references
    mappings: set[str] = field(default_factory=set)  # dicts: a key lookup reads no key bytes
    recorded: set[str] = field(default_factory=set)  # x.record() seen
    waited: set[str] = field(default_factory=set)  # x.wait() / x.query() seen
    loops: list[Loop] = field(default_factory=list)
    tests: dict[int, ast.expr] = field(default_factory=dict)  # an if's id -> its test
    # an if's id -> the tests its body asserts false (``assert not x``): their branches
    # were not taken on its path
    excludes: dict[int, set[str]] = field(default_factory=dict)
    # a branch's guard -> the side streams chosen only there (``stream = side`` here,
    # ``stream = current_stream()`` in the other branch)
    chosen: dict[int, set[str]] = field(default_factory=dict)

    def name(self, key: str) -> str:
        root, dot, rest = key.partition(".")
        return self.names.get(key) or (self.names.get(root, root) + dot + rest)

    @property
    def base(self) -> str:
        return THREAD if self.thread else CURRENT

    @property
    def producer(self) -> str:
        """Where tensors the function did not make were made."""
        return SUBMITTER if self.thread else CURRENT

    def on_path(self, op: Op, path: tuple[int, ...]) -> bool:
        """Does ``op`` run wherever something with the branches ``path`` runs? Its
        branches hold that path, or the ones it adds only test that what it syncs, or
        the stream that waits, exists (``if self.ev is not None: self.ev.synchronize()``:
        with no event there is nothing to wait for; with no side stream no side work),
        that the waiting stream is not the current one, or that pick the waiting stream
        (the branch that chooses it over the current one)."""
        common = next((i for i, (a, b) in enumerate(zip(op.guards, path)) if a != b),
                      min(len(op.guards), len(path)))
        return all(g > 0 and (_tests_presence(self.tests.get(g), op.key) or
                              _tests_presence(self.tests.get(g), op.stream) or
                              _tests_not_current(self.tests.get(g), op.stream)) or
                   op.stream in self.chosen.get(g, ())
                   for g in op.guards[common:])

    def tests_of(self, op: Op) -> set[str]:
        """The tests of the branches ``op`` runs in (their bodies)."""
        return {ast.unparse(self.tests[g]) for g in op.guards if g in self.tests}

    def excluded(self, op: Op, tests: set[str]) -> bool:
        """Does ``op`` run in a branch that asserts one of ``tests`` false?"""
        return any(self.excludes.get(g, set()) & tests for g in op.guards)

    def uses_streams(self) -> bool:
        return any(o.kind in _STREAM_KINDS or (o.kind in (K.USE, K.ALLOC)
                                                and o.stream != self.base) for o in self.ops)


_STREAM_KINDS = {K.RECORD, K.WAIT, K.WAIT_EVENT, K.EVENT_RECORD, K.NB_COPY, K.COLLECTIVE,
                 K.WORK_WAIT}


@dataclass
class ClassFacts:
    """What a class's methods make its attributes (``self.x``) into."""

    tensors: set[str] = field(default_factory=set)
    pinned: set[str] = field(default_factory=set)
    host: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)
    events: set[str] = field(default_factory=set)
    alias: dict[str, str] = field(default_factory=dict)  # self.x_np -> self.x
    contexts: dict[str, str] = field(default_factory=dict)  # self.ctx -> the stream it enters
    modules: set[str] = field(default_factory=set)  # names bound by ``import``: never tensors
    foreign: set[str] = field(default_factory=set)  # names of another framework's modules


def _tests_not_current(test: ast.expr | None, stream: str) -> bool:
    """Is ``test`` ``current_stream() != stream`` (or ``is not``)? Where it is false the
    stream is the current one: a wait of it for the current stream has nothing to order."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not stream or \
            not isinstance(test.ops[0], (ast.NotEq, ast.IsNot)):
        return False
    sides = [test.left, test.comparators[0]]
    current = [isinstance(x, ast.Call) and isinstance(x.func, (ast.Attribute, ast.Name)) and
               (x.func.attr if isinstance(x.func, ast.Attribute) else x.func.id) ==
               "current_stream" for x in sides]
    return current.count(True) == 1 and ast.unparse(sides[current.index(False)]) == stream


def _tests_presence(test: ast.expr | None, key: str) -> bool:
    """Is ``test`` ``key is not None`` or ``key`` itself (its truth)?"""
    if test is None or not key:
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], ast.IsNot) and isinstance(test.comparators[0], ast.Constant) and \
            test.comparators[0].value is None:
        test = test.left
    try:
        return ast.unparse(test) == key
    except Exception:  # noqa: BLE001 - an odd node tests nothing known
        return False
