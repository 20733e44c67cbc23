"""Vector constants as LLVM reads them fastest: one shared object per value, a uniform one spelled `splat (T v)`."""
from __future__ import annotations

import functools

from llvmlite import ir


class _Spelled(ir.Constant):
    """A constant with its value (llvmlite checks shuffle masks by it) printed as `text` (zeroinitializer, poison,
    splat)."""

    def __init__(self, typ: ir.Type, value: object, text: str):
        super().__init__(typ, value)
        self.text = text

    def _get_reference(self) -> str:
        return self.text


def _is_zero(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0 and str(float(v))[0] != "-"


def vector_constant(elem: ir.Type, values: tuple) -> ir.Constant:
    """One shared constant per (element type, lanes): llvmlite builds a Constant object per lane and formats them
    all again on every use (resnet50: 300k lane objects for its splats). `zeroinitializer` when all lanes are +0,
    `splat (float 2.0)` when all are one value: written out lane by lane, the exp polynomial's constants alone were
    8000 formatted floats of one dynamic decoder's IR."""
    return _vector_constant(elem, values, tuple(repr(v) for v in values))  # (repr: 0.0 and -0.0 hash alike)


@functools.cache
def _vector_constant(elem: ir.Type, values: tuple, spelled: tuple[str, ...]) -> ir.Constant:
    vt = ir.VectorType(elem, len(values))
    if len(set(spelled)) == 1:  # llvmlite repeats one element Constant without building a list
        one = ir.Constant(elem, values[0])
        return _Spelled(vt, one, "zeroinitializer" if _is_zero(values[0]) else f"splat ({elem} {one.get_reference()})")
    return ir.Constant(vt, list(values))


def splat_constant(t: ir.VectorType, v: float | int) -> ir.Constant:
    if type(t) is not ir.VectorType:  # a scalable vector type (codegen/scalable.py) prints its own splats
        return ir.Constant(t, [v] * t.count)
    return vector_constant(t.element, (v,) * t.count)


@functools.cache
def poison(vt: ir.Type) -> ir.Constant:
    return _Spelled(vt, None, "poison")
