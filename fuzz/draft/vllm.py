"""vLLM's own ``PPHandler`` as draft-broadcast targets: the ``vllm-pp`` families.

``streamfuzz.fuzz.upstream`` finds vLLM's ``pp_utils.py`` at a version and derives the
pre-PR code (``vllm-pp-pre-pr``); here that code gets this protocol's
stand-ins for its vLLM imports (``streamfuzz.fuzz.draft.targets.vllm_standins``) and is
driven by vLLM's runner model (``streamfuzz.fuzz.draft.targets.vllm_pp``). The draft
protocol names this loader (``Protocol.upstream``); ``streamfuzz.fuzz.targets`` reaches
it through the registry.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from streamfuzz.fuzz import upstream

PRE_PR = {"vllm-pp": False, "vllm-pp-pre-pr": True}
"""Each family, and whether it runs the pre-PR edit of vLLM's file."""


def _standins() -> dict[str, Any]:
    from streamfuzz.fuzz.draft.targets import vllm_standins

    return vllm_standins.builtins()


class _Family:
    """The loader of the ``vllm-pp`` families (``streamfuzz.fuzz.targets.names.Family``)."""

    def code(self, family: str, version: str | None) -> upstream.Upstream:
        """vLLM ``version``'s file (None: the installed vllm), as ``family`` runs it."""
        up = upstream.find(version) if version else upstream.resolve(None)
        if PRE_PR[family]:
            up = upstream.pre_pr(up)
        return replace(up, imports=_standins)

    def factory(self, family: str, version: str | None) -> Any:
        from streamfuzz.fuzz.draft.targets import vllm_pp

        return vllm_pp.factory(self.code(family, version))

    def provenance(self, family: str, version: str | None) -> dict[str, Any]:
        return self.code(family, version).provenance()

    def source(self, up: upstream.Upstream) -> tuple[str, ast.Module, str,
                                                 Callable[[ast.Module, dict[str, Any], str], Any]]:
        """What ``mutate`` edits: the file as it runs here, from ``PPHandler`` on."""

        def build(edited: ast.Module, extra: dict[str, Any], suffix: str) -> Any:
            from streamfuzz.fuzz.draft.targets import vllm_pp

            return vllm_pp.factory(up, upstream.edited_module(up, edited, suffix, extra))

        return upstream.filename(up), upstream.tree(up), "PPHandler", build


FAMILY = _Family()
