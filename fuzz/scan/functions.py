"""A function of the scanned package, as every reader of the package names it:
its file, its node and its class."""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass
class Function:
    file: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None
    text: str = ""
    classes: dict[str, str] | None = None  # local name -> its stated class (_classes_of)
    # ('stream' | 'context', the stream it returns or enters), () if neither: _stream_helper
    helper: tuple[str, ast.expr | None] | tuple[()] | None = None

    @property
    def name(self) -> str:
        return self.node.name

    def receiver(self) -> str | None:
        """The name a method calls its object by (``self``), or None for a function."""
        a = self.node.args
        first = [*a.posonlyargs, *a.args][:1]
        decos = {ast.unparse(d) for d in self.node.decorator_list}
        if self.cls is None or not first or "staticmethod" in decos:
            return None
        return first[0].arg

    def params(self) -> list[ast.arg]:
        a = self.node.args
        ps = [*a.posonlyargs, *a.args]
        if self.cls is not None and ps and ps[0].arg in ("self", "cls"):
            ps = ps[1:]
        return ps
