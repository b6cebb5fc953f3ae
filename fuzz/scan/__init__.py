"""``fuzz scan``: where a package's stream code needs checking, ranked.

The pipeline, one module each: ``sources`` (a tree, wheel, sdist or installed
package, read as text) -> ``package`` (parsed, indexed) -> ``streams_ast``
(each function walked into ``ops``: what its names are, ``names``; what its
calls and bindings do, ``calls`` and ``binding``) -> ``hazards`` (rules and
score; an event handed to the caller, ``handoff``) -> ``report``
(table, JSON, markdown); ``harness`` turns one finding into a
``streamfuzz.checked()`` skeleton; ``marks`` marks each finding from a
checked run's record (flagged, clean, not reached).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from streamfuzz.fuzz.scan import (
    container_handoff,
    hazards,
    helper_copies,
    owners,
    package_hazards,
)
from streamfuzz.fuzz.scan.hazards import Finding
from streamfuzz.fuzz.scan.owned import own_stream_buffers
from streamfuzz.fuzz.scan.package import Package
from streamfuzz.fuzz.scan.sources import Source

SUPPRESS = re.compile(r"#\s*streamfuzz:\s*safe\b[ \t]*(.*)$")
"""``# streamfuzz: safe <reason>`` on a finding's line drops it (kept as suppressed)."""


@dataclass
class ScanResult:
    source: Source
    findings: list[Finding]  # ranked, suppressed ones included (rank 0)
    functions: int  # functions walked (those that touch streams)
    files: int
    unparsed: list[str] = field(default_factory=list)

    @property
    def active(self) -> list[Finding]:
        return [f for f in self.findings if f.suppressed is None]


def scan(source: Source) -> ScanResult:
    """Every finding of ``source``, ranked by score (ties by file, line, class)."""
    pkg = Package(source.files())
    walked = list(pkg.traces())
    traces = [t for t in walked if t.uses_streams()]
    owned = own_stream_buffers(pkg, walked)
    found: list[Finding] = []
    for t in traces:
        found.extend(hazards.judge(t, owned))
    found.extend(package_hazards.cached_streams(pkg.caches))
    found.extend(package_hazards.sibling_omissions(pkg))
    found.extend(package_hazards.attribute_lifetimes(pkg, walked))
    found.extend(package_hazards.attribute_d2h_reads(pkg, walked))
    found.extend(owners.unseen_owners(pkg, traces))
    found.extend(container_handoff.container_handoffs(pkg, walked))
    found.extend(helper_copies.helper_rewrites(pkg, walked))
    for f in found:
        lines = pkg.modules[f.file].lines
        text = lines[f.line - 1] if 0 < f.line <= len(lines) else ""
        m = SUPPRESS.search(text)
        if m:
            f.suppressed = m.group(1).strip() or "(no reason given)"
    found.sort(key=lambda f: (f.suppressed is not None, -f.score, f.file, f.line,
                              f.hazard.value, f.tensors))
    rank = 0
    for f in found:
        if f.suppressed is None:
            rank += 1
            f.rank = rank
    return ScanResult(source, found, len(traces), len(pkg.modules), sorted(pkg.unparsed))
