"""The table of ONNX import functions (IMPORTERS, filled by the `importer` decorator) and the helpers the op
families share. Below the families, which import it, and below the package, which imports the families."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from kiln.errors import KilnError, ModelError
from kiln.frontend.context import Ctx
from kiln.graph import symbolic
from kiln.graph.ir import Value

Importer = Callable[[Ctx, list[Value | None]], list[Value]]
IMPORTERS: dict[str, Importer] = {}


def importer(*names: str) -> Callable[[Importer], Importer]:
    def reg(fn: Importer) -> Importer:
        @functools.wraps(fn)
        def guarded(cx: Ctx, ins: list[Value | None]) -> list[Value]:
            """A malformed node (missing input, bad attribute, inconsistent shapes) is a ModelError naming it,
            never a stray IndexError/TypeError/ZeroDivisionError from the import function."""
            try:
                return fn(cx, ins)
            except ModelError as e:  # from a shape rule the importer called directly: name the node
                if "node '" in str(e):
                    raise
                raise ModelError(f"node '{cx.name}' ({cx.node.op_type}, opset {cx.opset}): {e}") from None
            except KilnError:
                raise
            except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError,
                    OverflowError) as e:
                dims = _symbolic_dims(ins)
                if dims and isinstance(e, TypeError):  # sympy: "cannot determine truth value", "cannot convert"
                    raise ModelError(f"node '{cx.name}' ({cx.node.op_type}, opset {cx.opset}) cannot take the "
                                     f"symbolic dimension(s) {dims} of its inputs: {e}") from None
                raise ModelError(f"node '{cx.name}' ({cx.node.op_type}, opset {cx.opset}): invalid inputs or "
                                 f"attributes: {type(e).__name__}: {e}") from None
        for n in names:
            IMPORTERS[n] = guarded
        return guarded
    return reg


def _symbolic_dims(ins: list[Value | None]) -> list[str]:
    """The symbolic dims an op's inputs carry, in their shapes or as shape values, for error messages."""
    out: set[str] = set()
    for v in ins:
        if v is not None:
            out |= symbolic.free_symbols(v.shape)
            if v.const is not None and symbolic.is_symbolic_array(v.const):
                out |= symbolic.free_symbols(list(v.const.reshape(-1)))
    return sorted(out)


def fold_with_reference(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    """Evaluate an all-constant node with ONNX's reference implementation (ops Kiln only meets in
    shape arithmetic: Range, NonZero, ...)."""
    from onnx.reference import ReferenceEvaluator

    try:
        feeds = {n: v.const for n, v in zip(cx.node.input, ins) if v is not None}
        outs = ReferenceEvaluator(cx.node, opsets={"": cx.opset}).run(None, feeds)
    except Exception as e:
        raise cx.unsupported(f"constant evaluation failed: {e}") from None
    return [cx.constant(np.asarray(o)) for o in outs]


def _axis(ax: int, rank: int, cx: Ctx) -> int:
    if not -rank <= ax < max(rank, 1):
        raise cx.unsupported(f"axis {ax} is out of range for rank {rank}")
    return ax % max(rank, 1)


def _scalar(cx: Ctx, v: float, like: Value) -> Value:
    return cx.constant(np.array(v, dtype=like.dtype))


def _opt(ins: list[Value | None], i: int) -> Value | None:
    return ins[i] if len(ins) > i else None
