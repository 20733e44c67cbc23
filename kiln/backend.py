"""Kiln as a standard ONNX backend (`onnx.backend.base.Backend`), so ONNX's own backend test suite runs
against it:

    import kiln.backend
    rep = kiln.backend.prepare(model)            # BackendRep
    outputs = rep.run([x, y])                    # in the order of the model's (non-initializer) inputs
    outputs = kiln.backend.run_model(model, [x, y])
    outputs = kiln.backend.run_node(node, [x, y])

A model whose inputs have symbolic dimensions (`batch`, `seq`) is compiled ONCE, with its symbols
(`rep.dynamic`, issue 15), and serves every size within their bounds; a size outside them, or a model with an op
that cannot take a symbolic dim (`rep.dynamic_error` says which), is compiled for the concrete shapes it is fed
(`kiln.compile(model, input_shapes=...)`), one executable per input-shape signature. `rep.compilations` counts
them. CPU only.

Two things the backend does at the model's edges that `kiln.compile` does not:
  * float16 inputs and outputs: Kiln stores and computes in float32, so the model is compiled with its
    float16 inputs/outputs declared float32; `run` widens float16 feeds and narrows the outputs back,
    so callers see the graph's declared types.
  * newer opsets: models declaring an opset above the frontend's newest (22) are compiled as opset 22
    when every op they use has the same semantics there (the opsets after 22 only added element types,
    such as float4/float8/int2, or attributes Kiln checks itself); otherwise `UnsupportedOperator`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

import kiln
from kiln.errors import ModelError, UnsupportedOperator
from kiln.frontend import onnx as _frontend
from kiln.frontend.importers import IMPORTERS

# The ONNX op types Kiln imports: the one list (README "Supported operators" is generated from it).
SUPPORTED_OPS: list[str] = sorted(IMPORTERS)

# Ops whose versions after opset 22 changed only element types Kiln does not have (float4e2m1, float8e8m0,
# int2/uint2, float6...) or added attributes the importer reads itself (SpaceToDepth's mode, Mod's fmod=0 on
# floats); and ops new after 22 whose importer follows their newest version.
_SAME_AFTER_22 = {"Cast", "CastLike", "Celu", "Compress", "Constant", "ConstantOfShape", "DepthToSpace", "Einsum",
                  "Flatten", "Identity", "Mod", "Pad", "Range", "ReduceLogSum", "ReduceLogSumExp", "Reshape",
                  "Shape", "Size", "SpaceToDepth", "Squeeze", "Swish", "TopK", "Transpose", "Unsqueeze",
                  "RMSNormalization", "OneHot", "ReverseSequence"}


def supports_device(device: str) -> bool:
    """CPU only."""
    try:
        return Device(device).type == DeviceType.CPU
    except (AttributeError, ValueError):
        return False


def _opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def ops_used(graph: onnx.GraphProto) -> set[str]:
    """Every op type in a graph, sub-graphs (If/Loop bodies) included."""
    found = set()
    for n in graph.node:
        found.add(n.op_type)
        for a in n.attribute:
            if a.HasField("g"):
                found |= ops_used(a.g)
            for g in a.graphs:
                found |= ops_used(g)
    return found


def _with_opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
    return model


def _clamp_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """A model newer than the frontend's newest opset, compiled as that opset where that changes nothing."""
    opset = _opset(model)
    oldest, newest = _frontend.MIN_OPSET, _frontend.MAX_OPSET
    if opset is not None and opset < oldest:  # older than opset 7: fine where every op is unchanged since
        for op in sorted(ops_used(model.graph)):
            try:
                same = onnx.defs.get_schema(op, opset).since_version == onnx.defs.get_schema(op, oldest).since_version
            except Exception:  # noqa: BLE001
                continue
            if not same:
                raise UnsupportedOperator(op, "", opset, f"opset {opset} (Kiln imports opsets {oldest}–{newest})")
        return _with_opset(model, oldest)
    if opset is None or opset <= newest:
        return model
    for op in sorted(ops_used(model.graph)):
        try:
            since = onnx.defs.get_schema(op, opset).since_version
        except Exception:  # noqa: BLE001  (unknown op: the importer names it)
            continue
        if since > newest and op not in _SAME_AFTER_22:
            raise UnsupportedOperator(op, "", opset, f"{op}-{since} is newer than the opsets Kiln imports "
                                                     f"({_frontend.MIN_OPSET}–{newest})")
    return _with_opset(model, newest)


def _round_float16_values(model: onnx.ModelProto) -> None:
    """Every float16 tensor the graph computes is rounded to float16 after the node that makes it (a
    Cast to float16, which Kiln imports as float32 rounded to half precision): float16 *storage*, so results
    match a float16 runtime's, not a more precise float32 one."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001  (no types: nothing to round)
        return
    f16 = {v.name for v in list(inferred.graph.value_info) + list(inferred.graph.output)
           if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.FLOAT16}
    nodes = []
    for n in model.graph.node:
        nodes.append(n)
        if n.op_type in ("Cast", "CastLike", "Constant", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                         "Transpose", "Shape", "Size"):
            continue  # these never make a value that is not already a float16 value
        for i, o in enumerate(n.output):
            if o in f16:
                n.output[i] = f"{o}__kiln_f32"
                nodes.append(helper.make_node("Cast", [n.output[i]], [o], name=f"{n.name or o}__round_f16",
                                              to=TensorProto.FLOAT16))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _widen_float16(model: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str], set[str]]:
    """Declare float16 graph inputs/outputs float32; returns the model and the names that were float16."""
    _round_float16_values(model)
    f16_in, f16_out = set(), set()
    for vi, names in ((model.graph.input, f16_in), (model.graph.output, f16_out)):
        for v in vi:
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.FLOAT16:
                v.type.tensor_type.elem_type = TensorProto.FLOAT
                names.add(v.name)
    if f16_in or f16_out:
        del model.graph.value_info[:]  # intermediate types are re-derived by the importer
    return model, f16_in, f16_out


# Operand positions Kiln needs as compile-time constants (shapes, axes, pads, sizes, counts): a graph input
# that reaches one of them (through any nodes but Shape/Size, which only read shapes) is compiled as a
# constant — the executable is specialized on its value, as on the input shapes.
CONST_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3), "Split": (1,), "Range": (0, 1, 2), "ConstantOfShape": (0,), "TopK": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "OneHot": (1,), "CumSum": (1,), "Dropout": (1, 2), "Trilu": (1,),
    "NonZero": (0,), "Compress": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2), "HannWindow": (0,),
    "HammingWindow": (0,), "BlackmanWindow": (0,),
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
}
_SHAPE_ONLY = {"Shape", "Size"}


def value_specialized_inputs(model: onnx.ModelProto) -> list[str]:
    """The graph inputs whose *values* Kiln needs at compile time (see CONST_OPERANDS)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    needed, stack, seen = [], [], set()
    for n in model.graph.node:
        stack += [n.input[i] for i in CONST_OPERANDS.get(n.op_type, ()) if i < len(n.input) and n.input[i]]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            needed.append(name)
        elif name in producer and producer[name].op_type not in _SHAPE_ONLY:
            stack += [i for i in producer[name].input if i]
    return [v.name for v in model.graph.input if v.name in needed]


def _bake(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of `model` with the graph inputs in `values` turned into initializers."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [v for v in m.graph.input if v.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(numpy_helper.from_array(np.asarray(a), n) for n, a in values.items())
    return m


class KilnRep(BackendRep):
    """A prepared model: `run(inputs)` returns its outputs (a tuple, in the model's output order)."""

    def __init__(self, model: onnx.ModelProto, num_threads: int | None = None, **options: Any):
        self.model = model
        self.num_threads = num_threads
        self.options = options
        inits = {i.name for i in model.graph.initializer}
        self.inputs = [v for v in model.graph.input if v.name not in inits]
        self.input_names = [v.name for v in self.inputs]
        self.output_names = [v.name for v in model.graph.output]
        self.model, self.f16_in, self.f16_out = _widen_float16(self.model)
        self.baked = value_specialized_inputs(self.model)
        self._executables: dict[tuple, kiln.Executable] = {}
        self.symbolic = any(not d.HasField("dim_value") for v in self.inputs
                            for d in v.type.tensor_type.shape.dim)
        self.compilations = 0
        self.dynamic: kiln.Executable | None = None   # one executable for every size (symbolic dims, issue 15)
        self.dynamic_error = ""                        # why the model is compiled per shape instead, if it is
        if self.symbolic and not self.baked:
            try:
                self.dynamic = kiln.compile(self.model, num_threads=self.num_threads, cache=False, **self.options)
                self.compilations += 1
            except (ModelError, UnsupportedOperator) as e:  # an op that cannot take a symbolic dim: per shape
                self.dynamic_error = str(e)
        if not self.symbolic and not self.baked:  # compile now: errors come at prepare time
            self._executable({v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in self.inputs},
                             {})

    def _executable(self, shapes: dict[str, tuple[int, ...]], baked: dict[str, np.ndarray]) -> kiln.Executable:
        key = (tuple(sorted(shapes.items())),
               tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(baked.items())))
        exe = self._executables.get(key)
        if exe is None:
            model = _bake(self.model, baked) if baked else self.model
            shapes = {k: v for k, v in shapes.items() if k not in baked}
            exe = kiln.compile(model, num_threads=self.num_threads, cache=False,
                               input_shapes=shapes if self.symbolic else None, **self.options)
            self.compilations += 1
            self._executables[key] = exe
        return exe

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise ValueError(f"the model has {len(self.input_names)} input(s) {self.input_names}, "
                                 f"got {len(inputs)} array(s)")
            feeds = dict(zip(self.input_names, inputs))
        out = {}
        for name, a in feeds.items():
            a = np.asarray(a)
            if name in self.f16_in:
                if a.dtype != np.float16:
                    raise ValueError(f"input '{name}' has dtype {a.dtype}, expected float16")
                a = a.astype(np.float32)
            out[name] = a
        return out

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = self._feeds(inputs)
        baked = {n: feeds.pop(n) for n in self.baked if n in feeds}
        if self.dynamic is not None and self._within_bounds(feeds):
            outs = self.dynamic.run(feeds)
        else:
            outs = self._executable({k: tuple(v.shape) for k, v in feeds.items()}, baked).run(feeds)
        outs = [o.astype(np.float16) if n in self.f16_out else o for n, o in zip(self.output_names, outs)]
        return tuple(outs)


    def _within_bounds(self, feeds: dict[str, np.ndarray]) -> bool:
        """Do the feeds' sizes fall in the dynamic executable's bounds? (Outside them: a specialized compile.)"""
        from kiln.runtime.shapes import bind
        try:
            bind(self.dynamic.inputs, [np.asarray(feeds[s.name]) for s in self.dynamic.inputs],
                 self.dynamic.meta["dynamic"]["bounds"])
        except (ValueError, KeyError):
            return False
        return True


class KilnBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU", **kwargs: Any) -> KilnRep:
        if not supports_device(device):
            raise ValueError(f"Kiln runs on CPU only, not {device!r}")
        proto = onnx.ModelProto()
        proto.CopyFrom(_frontend.load_model(model))
        if _opset(proto) is None:
            raise ModelError("model declares no default-domain opset")
        return KilnRep(_clamp_opset(proto), num_threads=kwargs.pop("num_threads", None), **kwargs)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None, **kwargs: Any) -> tuple:
        """Run one node: a one-node model whose inputs are `inputs` (in the node's input order)."""
        opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
        arrays = [np.asarray(a) for a in (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [n for n in node.input if n]
        if len(names) != len(arrays):
            raise ValueError(f"node {node.op_type} has {len(names)} input(s), got {len(arrays)} array(s)")
        vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(names, arrays)]
        outs = []
        for i, o in enumerate(node.output):
            if outputs_info and i < len(outputs_info):
                dt, shape = outputs_info[i]
                outs.append(helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape))
            else:
                outs.append(onnx.ValueInfoProto(name=o))
        graph = helper.make_graph([node], f"{node.op_type}_node", vis, outs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        if not outputs_info:
            try:
                inferred = onnx.shape_inference.infer_shapes(model)
                model.graph.output.CopyFrom(inferred.graph.output)
            except Exception:  # noqa: BLE001  (Kiln infers its own types; ONNX's are only for the rewrite)
                pass
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return supports_device(device)


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
run_node = KilnBackend.run_node
is_compatible = KilnBackend.is_compatible
# `supports_device` is the module-level function above (the same as KilnBackend.supports_device)

__all__ = ["SUPPORTED_OPS", "KilnBackend", "KilnRep", "prepare", "run_model", "run_node", "supports_device",
           "is_compatible"]
