"""The walker: an FX graph of Core ATen ops → Graph IR, one import function per ATen overload in `ATEN`.

Each import function takes the context and the node's arguments bound by name from the op's schema (defaults
filled in, FX nodes replaced by Kiln `Value`s) and returns the Value(s) of its output(s). Every result is checked
against the shape and dtype torch recorded for the node (`node.meta["val"]`): a shape that differs is an importer
bug and says so; a dtype that differs (torch's type promotion) gets a Cast. A node whose tensor arguments are all
constants is evaluated by torch itself at import (arange, full, masks built from them, permutes of weights...),
as the ONNX frontend folds all-constant nodes."""
from __future__ import annotations

import functools
import hashlib
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModelError, UnsupportedOperator
from kiln.frontend.context import Ctx
from kiln.graph import symbolic
from kiln.graph.ir import Graph, TensorType, Value

# the element types Kiln computes in (float32), and those of indices, shapes and masks
COMPUTED_DTYPES = ("float32", "int64", "int32", "bool")
FOLD_LIMIT_BYTES = 256 << 20  # constants folded at import stay below this (an expand to a huge shape is not folded)

Args = dict[str, Any]
AtenImporter = Callable[["AtenCtx", Args], "Value | Sequence[Value | None]"]
ATEN: dict[str, AtenImporter] = {}


def aten(*names: str) -> Callable[[AtenImporter], AtenImporter]:
    """Register an import function for ATen overloads named as `str(op)` without the namespace: "add.Tensor"."""
    def reg(fn: AtenImporter) -> AtenImporter:
        for n in names:
            ATEN[n] = fn
        return fn
    return reg


def op_key(target: Any) -> str:
    """"add.Tensor" for torch.ops.aten.add.Tensor; the full name for any other namespace or callable."""
    name = str(target) if not callable(target) or hasattr(target, "_schema") else getattr(target, "__name__", "?")
    return name[len("aten."):] if name.startswith("aten.") else name


def source_line(node: Any) -> str:
    """Where a node came from in the user's code: 'file.py:12: y = torch.cumprod(x, 1)' (from its stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    found = list(re.finditer(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', trace))
    if not found:
        return ""
    path, line, code = found[-1].groups()
    return f"{path}:{line}: {code.strip()}"


def torch_dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def to_numpy(t: Any) -> np.ndarray:
    """A CPU tensor as an owned, C-contiguous NumPy array (weights are copied once, at import)."""
    return np.array(t.detach().cpu().resolve_conj().resolve_neg().numpy(), order="C", copy=True)


@dataclass(frozen=True)
class TorchSymbols:
    """torch's shape symbols (a graph traced with dynamic shapes: `torch.compile(..., dynamic=True)`) as Kiln's
    symbolic dims: each torch symbol ("s33", numbered by torch's ShapeEnv) gets a Kiln name by its first appearance
    in the graph's inputs ("sym0", "sym1", ...: the same graph names its symbols the same in every process, so the
    compile cache finds it) — or, exported with `dynamic_shapes`, its Dim's name ("seq") —, and inclusive bounds:
    torch's value range (the Dim's declared range), capped at `max_bound` (tensors are laid out at their upper
    bounds: kernel/dynamic.py)."""
    names: dict[str, str] = field(default_factory=dict)               # torch symbol → Kiln symbol
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)  # Kiln symbol → (lo, hi)

    @staticmethod
    def of(gm: Any, max_bound: int = symbolic.DEFAULT_BOUND) -> TorchSymbols:
        import torch

        names: dict[str, str] = {}
        bounds: dict[str, tuple[int, int]] = {}
        meta = getattr(gm, "meta", {})  # torch.export's ranges and Dim names (trace.export_core_aten)
        declared, dim_names = meta.get("kiln_ranges", {}), meta.get("kiln_names", {})
        for node in gm.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val", node.meta.get("example_value"))  # (AOTAutograd's record, dynamo's)
            dims = list(val.shape) if isinstance(val, torch.Tensor) else [val] if isinstance(val, torch.SymInt) else []
            for d in dims:
                if not isinstance(d, torch.SymInt):
                    continue
                for s in sorted(d.node.expr.free_symbols, key=str):
                    if str(s) in names:
                        continue
                    given, taken = dim_names.get(str(s), ""), set(names.values()) | set(dim_names.values())
                    fresh = (f"sym{i}" for i in range(len(names), len(names) + len(taken) + 1))
                    kiln = names[str(s)] = given if given.isidentifier() and given not in names.values() else \
                        next(n for n in fresh if n not in taken)
                    rng = d.node.shape_env.var_to_range.get(s)
                    lo = max(1, int(rng.lower)) if rng is not None and rng.lower.is_Integer else 1
                    hi = int(rng.upper) if rng is not None and rng.upper.is_Integer else max_bound
                    if str(s) in declared:
                        lo, up = declared[str(s)]
                        lo, hi = max(1, lo), up if up is not None else max_bound
                    bounds[kiln] = (lo, max(lo, min(hi, max_bound)))
        return TorchSymbols(names, bounds)

    def dim(self, d: Any) -> symbolic.Dim:
        """A dim torch recorded (an int or a SymInt) as a Kiln dim (an int or a sympy expression over Kiln's
        symbols)."""
        import torch

        if isinstance(d, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if d.node.expr.is_number:
                return symbolic.normalize(d.node.expr)
            return symbolic.normalize(self._expr(d.node.expr))
        return symbolic.normalize(d)

    def shape(self, shape: Any) -> tuple[symbolic.Dim, ...]:
        return tuple(self.dim(d) for d in shape)

    def _expr(self, e: Any) -> Any:
        if e.is_Symbol:
            if str(e) not in self.names:
                raise ModelError(f"torch shape symbol {e} is not a dim of the graph's inputs: Kiln binds its symbols "
                                 "from the input shapes")
            return symbolic.symbol(self.names[str(e)])
        if e.is_Integer:
            return int(e)
        args = [self._expr(a) for a in e.args]
        build = next((f for t, f in _dim_ops().items() if isinstance(e, t)), None)
        if build is None or (type(e).__name__ == "Pow" and not (e.args[1].is_Integer and int(e.args[1]) > 0)):
            raise ModelError(f"torch shape expression {e}: {type(e).__name__} is not integer arithmetic Kiln's "
                             "symbolic dims represent")
        return build(*args)


@functools.cache
def _dim_ops() -> dict[type, Callable[..., Any]]:
    """torch's shape-expression functions (torch.utils._sympy) → the sympy forms Kiln's dims use."""
    import sympy

    from torch.utils._sympy import functions as F

    def floor_div(a: Any, b: Any) -> Any:
        return sympy.floor(sympy.sympify(a) / b)

    return {sympy.Add: sympy.Add, sympy.Mul: sympy.Mul, F.Max: sympy.Max, sympy.Max: sympy.Max,
            F.Min: sympy.Min, sympy.Min: sympy.Min, sympy.Pow: lambda a, n: a ** n,
            F.PowByNatural: lambda a, n: a ** n, F.FloorDiv: floor_div, F.CleanDiv: floor_div,
            F.CeilDiv: lambda a, b: sympy.ceiling(sympy.sympify(a) / b),
            F.Mod: sympy.Mod, F.PythonMod: sympy.Mod, sympy.Mod: sympy.Mod}


@dataclass
class AtenProgram:
    """A functional Core ATen FX graph with its parameters frozen as get_attr constants: what the torch frontend
    imports. Its placeholders are the executable's inputs (non-tensor placeholders are specialized away, their
    value fixed at trace time — or, traced with dynamic shapes, a symbol's value); its output tuple the outputs,
    named output_0, output_1, ... `symbols`: the Kiln names and bounds of torch's shape symbols (None: from the
    graph, at the default bound)."""
    gm: Any                       # torch.fx.GraphModule
    name: str = "torch"
    symbols: TorchSymbols | None = None
    _digest: str = field(default="", repr=False)

    def torch_symbols(self) -> TorchSymbols:
        if self.symbols is None:
            self.symbols = TorchSymbols.of(self.gm)
        return self.symbols

    def fingerprint(self) -> bytes:
        """Bytes that identify the program for Kiln's compile cache: the graph's code, input types (torch's shape
        symbols by their Kiln names), the symbols' bounds and every constant's bytes."""
        if not self._digest:
            syms = self.torch_symbols()
            h = hashlib.sha256(self.gm.code.encode())
            h.update(repr(sorted(syms.bounds.items())).encode())
            for node in self.gm.graph.nodes:
                val = node.meta.get("val")
                if node.op == "placeholder":
                    shape = syms.shape(getattr(val, "shape", ()))
                    h.update(f"{node.name}:{getattr(val, 'dtype', type(val).__name__)}{shape}".encode())
                elif node.op == "get_attr":
                    t = _attr(self.gm, node.target)
                    h.update(f"{node.target}:{t.dtype}{tuple(t.shape)}".encode())
                    h.update(to_numpy(t).tobytes())
            self._digest = h.hexdigest()
        return self._digest.encode()


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class AtenCtx(Ctx):
    """The ONNX frontend's import context (add with folding, constants), naming an FX node instead."""
    fx: Any = None  # the torch.fx.Node being imported
    symbols: TorchSymbols = field(default_factory=TorchSymbols)

    @property
    def name(self) -> str:
        return self.fx.name if self.fx is not None else "torch"

    @property
    def op(self) -> str:
        return op_key(self.fx.target) if self.fx is not None else "?"

    def unsupported(self, detail: str) -> UnsupportedOperator:
        where = source_line(self.fx) if self.fx is not None else ""
        return UnsupportedOperator(f"aten.{self.op}", self.name, None, detail + (f" [at {where}]" if where else ""))

    # -- what torch recorded for this node's outputs ----------------------------------------------------------
    def out(self, i: int = 0) -> Any:
        val = self.fx.meta.get("val")
        return val[i] if isinstance(val, (tuple, list)) else val

    def out_dtype(self, i: int = 0) -> str:
        return torch_dtype_name(self.out(i).dtype)

    def out_shape(self, i: int = 0) -> tuple[symbolic.Dim, ...]:
        return self.symbols.shape(self.out(i).shape)

    # -- helpers every op family uses -------------------------------------------------------------------------
    def scalar(self, value: float | int | bool, dtype: str) -> Value:
        return self.constant(np.array(value, dtype=dtype))

    def cast(self, v: Value, dtype: str) -> Value:
        if v.dtype == dtype:
            return v
        if dtype == "bool":  # torch's bool(x) is x != 0 (a Cast to bool in Kiln may truncate)
            return self.add("Not", [self.add("Equal", [v, self.scalar(0, v.dtype)])])
        return self.add("Cast", [v], to=dtype)

    def tensor(self, v: Value | float | int | bool, dtype: str) -> Value:
        """A tensor argument or a Python scalar, as a Value of `dtype`."""
        return self.cast(v, dtype) if isinstance(v, Value) else self.scalar(v, dtype)

    def reshape(self, v: Value, shape: Sequence[symbolic.Dim]) -> Value:
        shape = symbolic.normalize_shape(shape)
        return v if tuple(v.shape) == shape else self.add("Reshape", [v], shape=shape)


def _bind(node: Any, env: dict[Any, Any]) -> Args:
    """The node's arguments by schema name, defaults filled in, FX nodes replaced by what they imported to."""
    import torch

    def sub(v: Any) -> Any:
        if isinstance(v, torch.fx.Node):
            return env[v]
        if isinstance(v, (list, tuple)):
            return type(v)(sub(x) for x in v)
        return v

    schema = node.target._schema
    out: Args = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(node.args) and positional[i] is a:
            out[a.name] = sub(node.args[i])
        elif a.name in node.kwargs:
            out[a.name] = sub(node.kwargs[a.name])
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def _values(x: Any) -> list[Value]:
    if isinstance(x, Value):
        return [x]
    if isinstance(x, (list, tuple)):
        return [v for e in x for v in _values(e)]
    return []


def _fold(cx: AtenCtx, node: Any, args: Args) -> Any:
    """Evaluate a node whose tensor arguments are all constants with torch itself; None when it is not one."""
    import torch

    if not all(v.const is not None for v in _values(list(args.values()))) or _symbolic_args(args):
        return None
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return None
    vals = node.meta.get("val")
    outs = vals if isinstance(vals, (tuple, list)) else [vals]
    if any(not isinstance(t, torch.Tensor) or not all(isinstance(d, int) for d in t.shape) for t in outs) or \
            sum(t.numel() * t.element_size() for t in outs) > FOLD_LIMIT_BYTES:
        return None

    def real(v: Any) -> Any:
        if isinstance(v, Value):
            return torch.from_numpy(np.array(v.const))
        if isinstance(v, (list, tuple)):
            return type(v)(real(x) for x in v)
        return v

    bound = {k: real(v) for k, v in args.items()}
    schema = node.target._schema
    pos = [bound[a.name] for a in schema.arguments if not a.kwarg_only]
    kw = {a.name: bound[a.name] for a in schema.arguments if a.kwarg_only}
    res = node.target(*pos, **kw)
    res = list(res) if isinstance(res, (tuple, list)) else [res]
    return [cx.constant(to_numpy(t)) if isinstance(t, torch.Tensor) else None for t in res] \
        if isinstance(vals, (tuple, list)) else cx.constant(to_numpy(res[0]))


def _symbolic_args(args: Any) -> bool:
    """Does an argument hold a symbolic dim (a size computed from torch's shape symbols)?"""
    import sympy

    if isinstance(args, dict):
        return _symbolic_args(list(args.values()))
    if isinstance(args, (list, tuple)):
        return any(_symbolic_args(a) for a in args)
    return isinstance(args, sympy.Basic)  # (a Value here is a constant: its shape is static)


def _conform(cx: AtenCtx, got: Any) -> Any:
    """Check an import function's result against torch's record of the node; cast where torch promoted."""
    import torch

    meta = cx.fx.meta.get("val")
    if isinstance(meta, (tuple, list)):
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        return [_conform_one(cx, g, m, i) for i, (g, m) in enumerate(zip(got, meta))] + got[len(meta):]
    if isinstance(got, (tuple, list)):
        raise ModelError(f"node '{cx.name}' (aten.{cx.op}): the importer returned {len(got)} values for one output")
    return _conform_one(cx, got, meta, 0) if isinstance(meta, torch.Tensor) else got


def _conform_one(cx: AtenCtx, v: Any, meta: Any, i: int) -> Any:
    import torch

    if v is None or not isinstance(meta, torch.Tensor):
        return v
    shape, dtype = cx.symbols.shape(meta.shape), torch_dtype_name(meta.dtype)
    if len(v.shape) != len(shape) or not all(symbolic.equal(a, b) for a, b in zip(v.shape, shape)):
        raise ModelError(f"node '{cx.name}' (aten.{cx.op}) output {i}: Kiln's import has shape {list(v.shape)}, torch "
                         f"{list(shape)} — an importer bug")
    return cx.cast(v, dtype)


def _check_types(cx: AtenCtx, node: Any) -> None:
    """Every tensor the node reads or writes has a static shape and an element type Kiln computes."""
    import torch

    tensors = [a.meta.get("val") for a in node.all_input_nodes]
    val = node.meta.get("val")
    tensors += list(val) if isinstance(val, (tuple, list)) else [val]
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if torch_dtype_name(t.dtype) not in COMPUTED_DTYPES:
            raise cx.unsupported(f"dtype {torch_dtype_name(t.dtype)}: Kiln computes float32 (int64/int32/bool for "
                                 "indices and masks)")
        if t.device.type != "cpu":
            raise cx.unsupported(f"a tensor on {t.device}: Kiln compiles for this machine's CPU")


def import_node(cx: AtenCtx, node: Any, env: dict[Any, Any]) -> Any:
    """One call_function node → its Value(s)."""
    cx.fx = node
    if node.target is operator.getitem:
        src, i = node.args
        got = env[src][i]
        if got is None:
            raise cx.unsupported(f"output {i} of {src.name} is not computed by Kiln")
        return got
    if _is_size(node.meta.get("val")):  # arithmetic on sizes (sym_size, s0 * 8): the dim expression itself
        return cx.symbols.dim(node.meta["val"])
    if not hasattr(node.target, "_schema"):
        raise cx.unsupported("not an ATen op")
    _check_types(cx, node)
    args = _bind(node, env)
    fn = ATEN.get(cx.op)
    try:
        folded = _fold(cx, node, args)  # any op, imported or not, whose tensor inputs are all constants
        if folded is None and fn is None:
            raise cx.unsupported("no Kiln importer for this op")
        return _conform(cx, folded if folded is not None else fn(cx, args))
    except KilnError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        raise ModelError(f"node '{cx.name}' (aten.{cx.op}): cannot import {_short(args)}: "
                         f"{type(e).__name__}: {e}") from None


def _is_size(val: Any) -> bool:
    """A value torch computes on the host from shape symbols (a SymInt), not a tensor."""
    import torch

    return isinstance(val, (torch.SymInt, torch.SymBool))


def is_size_node(node: Any) -> bool:
    """An FX node that computes a size from shape symbols (sym_size, arithmetic on SymInts): no kernel runs it."""
    return node.op == "call_function" and _is_size(node.meta.get("val"))


def _short(args: Args) -> str:
    def one(v: Any) -> str:
        return f"%{v.name}:{v.type}" if isinstance(v, Value) else repr(v)
    return ", ".join(f"{k}={one(v)}" for k, v in args.items())


def _input_value(node: Any, symbols: TorchSymbols) -> Any:
    """A placeholder as a graph input (a tensor), a symbol's value (a SymInt) or its specialized Python value."""
    import torch

    val = node.meta.get("val")
    if _is_size(val):
        return symbols.dim(val)
    if not isinstance(val, torch.Tensor):
        return val
    dtype = torch_dtype_name(val.dtype)
    if dtype not in COMPUTED_DTYPES:
        raise UnsupportedOperator("<input>", node.name, None, f"a {dtype}{list(val.shape)} input: Kiln takes "
                                  f"{'/'.join(COMPUTED_DTYPES)} tensors")
    return Value(node.name, TensorType(dtype, symbols.shape(val.shape)))


def import_aten(program: AtenProgram) -> Graph:
    """The whole program → a verified Graph whose inputs are its tensor placeholders."""
    gm = program.gm
    graph = Graph([], [], name=program.name)
    symbols = program.torch_symbols()
    graph.bounds = dict(symbols.bounds)
    cx = AtenCtx(graph, 0, symbols=symbols)
    env: dict[Any, Any] = {}
    outputs: list[Any] = []
    with symbolic.using_bounds(graph.bounds):  # the symbols' bounds decide the importers' comparisons of dims
        for node in gm.graph.nodes:
            cx.fx = node
            if node.op == "placeholder":
                env[node] = _input_value(node, symbols)
                if isinstance(env[node], Value):
                    graph.inputs.append(env[node])
            elif node.op == "get_attr":
                env[node] = cx.constant(to_numpy(_attr(gm, node.target)))
            elif node.op == "call_function":
                env[node] = import_node(cx, node, env)
            elif node.op == "output":
                outputs = _values_of_output(node.args[0], env, node)
            else:
                raise UnsupportedOperator(node.op, node.name, None, f"{node.target}: not a Core ATen graph (export "
                                          "it through AOTAutograd or torch.export first)")
    graph.outputs = outputs
    graph.output_names = [f"output_{i}" for i in range(len(outputs))]
    _check_bindable(graph)
    graph.verify()
    return graph


def _check_bindable(graph: Graph) -> None:
    """Every symbol a value's shape uses is a dim of some input: the executable binds symbols from its inputs'
    shapes. Only those symbols keep bounds."""
    bound = {d.name for v in graph.inputs for d in v.shape if getattr(d, "is_Symbol", False)}
    graph.bounds = {n: b for n, b in graph.bounds.items() if n in bound}
    for v in graph.values():
        loose = symbolic.free_symbols(v.shape) - bound
        if loose:
            raise ModelError(f"value '{v.name}' has shape {symbolic.shape_str(v.shape)}, whose symbol(s) "
                             f"{sorted(loose)} no input of '{graph.name}' has as a dim: its size could not be known "
                             "from the inputs")


def _values_of_output(out: Any, env: dict[Any, Any], node: Any) -> list[Value]:
    import torch

    flat: list[Value] = []
    for x in (out if isinstance(out, (list, tuple)) else [out]):
        if isinstance(x, (list, tuple)):
            flat += _values_of_output(x, env, node)
        elif isinstance(x, torch.fx.Node) and isinstance(env.get(x), Value):
            flat.append(env[x])
        else:
            raise UnsupportedOperator("<output>", node.name, None, f"output {x!r} is not a tensor Kiln computes")
    return flat


def unsupported_reason(node: Any, gm: Any = None, symbols: TorchSymbols | None = None) -> str | None:
    """Why Kiln cannot take this call_function node (None: it can): the node is imported on its own, its tensor
    inputs as graph inputs (get_attr inputs as the constants they are), its dims as Kiln dims (`symbols`: torch's
    shape symbols of the whole graph)."""
    if node.op != "call_function":
        return None
    symbols = symbols if symbols is not None else TorchSymbols()
    try:
        with symbolic.using_bounds(symbols.bounds):
            _probe(node, gm, symbols)
    except (UnsupportedOperator, ModelError) as e:
        return str(e)
    return None


def _probe(node: Any, gm: Any, symbols: TorchSymbols) -> Any:
    import torch

    if node.target is operator.getitem:  # supported when its producer is and computes that output
        src, i = node.args
        got = _probe(src, gm, symbols)
        if not isinstance(got, (list, tuple)) or got[i] is None:
            raise AtenCtx(Graph([], []), 0, fx=node).unsupported(f"output {i} of {src.name} is not computed by Kiln")
        return got[i]
    cx = AtenCtx(Graph([], [], name="probe"), 0, symbols=symbols)
    env: dict[Any, Any] = {}
    for a in node.all_input_nodes:
        val = a.meta.get("val")
        if a.op == "get_attr" and gm is not None:
            env[a] = cx.constant(to_numpy(_attr(gm, a.target)))
        elif isinstance(val, torch.Tensor):
            env[a] = _probe_value(a.name, val, symbols)
        elif isinstance(val, (tuple, list)):  # a multi-output producer, read through getitem
            env[a] = [_probe_value(f"{a.name}.{i}", t, symbols) if isinstance(t, torch.Tensor) else None
                      for i, t in enumerate(val)]
        elif _is_size(val):
            env[a] = symbols.dim(val)
        else:
            env[a] = val
    return import_node(cx, node, env)


def _probe_value(name: str, t: Any, symbols: TorchSymbols) -> Value:
    dtype = torch_dtype_name(t.dtype)
    return Value(name, TensorType(dtype if dtype in COMPUTED_DTYPES else "float32", symbols.shape(t.shape)))
