"""Errors Kiln raises for bad input: always at compile time, always saying what was expected."""
from __future__ import annotations


class KilnError(Exception):
    """Base of every error Kiln raises on purpose."""


class ModelError(KilnError, ValueError):
    """The model itself is malformed: bad file, missing initializer, cycle, bad attribute, type clash."""


class UnsupportedOperator(KilnError, NotImplementedError):
    """An operator (or an operator's variant) Kiln cannot compile."""

    def __init__(self, op_type: str, node_name: str = "", opset: int | None = None, detail: str = "") -> None:
        self.op_type, self.node_name, self.opset, self.detail = op_type, node_name, opset, detail
        where = f" (node '{node_name}'" + (f", opset {opset})" if opset is not None else ")")
        super().__init__(f"unsupported operator {op_type}{where}" + (f": {detail}" if detail else ""))
