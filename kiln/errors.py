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


class TargetError(KilnError, ValueError):
    """A target (ISA, CPU, feature set) that Kiln or LLVM cannot generate code for."""


class BoundsError(KilnError, RuntimeError):
    """A bounds-checked build (`kiln.compile(..., bounds_check=True)`) saw generated code index outside a buffer.

    The access was skipped (loads read 0.0 / 1, stores wrote nothing), so the process is intact but the
    outputs of that run are not to be trusted; this names the first violation and counts the rest."""

    def __init__(self, kernel: str, buffer: str, index: int, size: int, count: int = 1) -> None:
        self.kernel, self.buffer, self.index, self.size, self.count = kernel, buffer, index, size, count
        self.outputs: list = []  # the run's outputs, computed with the access skipped (Executable.run sets them)
        more = f" ({count - 1} more out-of-bounds access{'es' if count > 2 else ''} in this run)" if count > 1 else ""
        super().__init__(f"out-of-bounds access in kernel '{kernel}': buffer {buffer}, flat element index {index} "
                         f"is outside [0, {size}){more} — a Kiln codegen/schedule bug; the access was skipped")
