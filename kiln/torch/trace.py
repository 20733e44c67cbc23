"""Core ATen graphs with frozen parameters, by AOTAutograd (the dynamo backend) or torch.export (`from_torch`).

Both paths give the same thing: a functional FX graph of Core ATen ops (in-place ops and views functionalized,
composite ops decomposed by torch's own Core ATen decomposition table) whose parameters and buffers are
`get_attr` constants, plus which of its outputs write back into inputs (an in-place op on an input)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch._decomp import core_aten_decompositions


@dataclass
class Traced:
    gm: torch.fx.GraphModule          # Core ATen; frozen inputs are get_attr constants, the rest placeholders
    runtime: list[int]                # which of the traced call's arguments the placeholders are, in order
    mutations: list[int] = field(default_factory=list)  # the first len(mutations) outputs: new values of args[i]


def decompositions() -> dict[Any, Any]:
    """torch's Core ATen decomposition table (what torch.export's run_decompositions uses too)."""
    return core_aten_decompositions()


def freeze(gm: torch.fx.GraphModule, placeholders: list[torch.fx.Node], values: dict[int, torch.Tensor]) -> None:
    """Replace placeholder i by a get_attr of values[i] (detached, not copied): parameters become constants."""
    for i, t in values.items():
        node = placeholders[i]
        name = f"_kiln_frozen_{i}"
        gm.register_buffer(name, t.detach(), persistent=False)
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
    # get_attr nodes first, as FX prints them; the graph stays topologically ordered
    gm.graph.lint()
    gm.recompile()


def aot_core_aten(gm: torch.fx.GraphModule, args: list[Any], frozen: set[int], symbolic: bool = False) -> Traced:
    """A dynamo graph traced by AOTAutograd (no autograd: an inference graph), the arguments in `frozen`
    (parameters, buffers) turned into constants unless the graph writes to them. For these concrete arguments; or,
    `symbolic`, for dynamo's fake ones (its `example_value`s: sizes it made dynamic are torch shape symbols)."""
    from torch._functorch.aot_autograd import aot_export_module

    if symbolic:
        fakes = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
        with torch.no_grad():  # inside dynamo's tracing context: its fake mode and shape environment
            agm, sig = aot_export_module(gm, fakes, trace_joint=False, decompositions=decompositions())
    else:
        # outside dynamo's tracing context: its fake mode (symbolic shapes) must not be picked up for real inputs
        with torch.no_grad(), torch._guards.tracing(None):
            agm, sig = aot_export_module(gm, args, trace_joint=False, decompositions=decompositions())
    placeholders = [n for n in agm.graph.nodes if n.op == "placeholder"]
    index = {n.name: i for i, n in enumerate(placeholders)}
    mutated = [index[name] for name in sig.user_inputs_to_mutate.values()]
    mutated += [index[name] for name in sig.buffers_to_mutate.values() if name in index]
    keep = frozen - set(mutated)
    freeze(agm, placeholders, {i: args[i] for i in sorted(keep)})
    return Traced(agm, [i for i in range(len(args)) if i not in keep], mutated)


def export_core_aten(module: torch.nn.Module, example_inputs: tuple[Any, ...], dynamic_shapes: Any = None
                     ) -> torch.fx.GraphModule:
    """torch.export of a module, decomposed to Core ATen, parameters/buffers/constants frozen; the placeholders
    left are the user inputs (with `dynamic_shapes`, torch's shape symbols in their sizes, their ranges in its
    shape environment). A module that writes to its buffers or inputs cannot be an AOT executable."""
    from torch.export.graph_signature import InputKind

    ep = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False)
    ep = ep.run_decompositions(decompositions())
    sig = ep.graph_signature
    written = list(sig.buffers_to_mutate.values()) + list(sig.user_inputs_to_mutate.values())
    if written:
        from kiln.errors import UnsupportedOperator

        raise UnsupportedOperator("<module>", type(module).__name__, None,
                                  f"it writes to {written} when it runs (a buffer update or an in-place op on an "
                                  "input): an AOT executable cannot; export the module in eval() without them")
    gm = ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    consts: dict[int, torch.Tensor] = {}
    for i, spec in enumerate(sig.input_specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            consts[i] = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            consts[i] = ep.constants[spec.target]
        elif spec.kind != InputKind.USER_INPUT:
            from kiln.errors import UnsupportedOperator

            raise UnsupportedOperator("<module>", type(module).__name__, None, f"input kind {spec.kind.name}")
    freeze(gm, placeholders, consts)
    # each shape symbol's range as the user declared it (a Dim's min and max): the shape environment's own range
    # starts at 2 (torch specializes sizes 0 and 1 away), which Kiln's symbolic dims need not
    gm.meta["kiln_ranges"] = {str(sym): (int(r.lower), int(r.upper) if r.upper.is_Integer else None)
                              for sym, r in ep.range_constraints.items() if r.lower.is_Integer}
    gm.meta["kiln_names"] = _dim_names(module, [n for n in gm.graph.nodes if n.op == "placeholder"], dynamic_shapes)
    return gm


def _dim_names(module: torch.nn.Module, inputs: list[torch.fx.Node], dynamic_shapes: Any) -> dict[str, str]:
    """torch shape symbol → the name of the `Dim` the user gave it in `dynamic_shapes` (per positional input, or
    by argument name), for the dims that are that symbol alone: Kiln's symbolic dims, bounds and errors then say
    `seq`, not `sym1`."""
    import inspect

    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, dict):
        params = list(inspect.signature(module.forward).parameters)
        specs = [dynamic_shapes.get(p) for p in params[:len(inputs)]]
    else:
        specs = list(dynamic_shapes)
    names: dict[str, str] = {}
    for node, spec in zip(inputs, specs):
        shape = getattr(node.meta.get("val"), "shape", ())
        dims = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, dim in dims:
            name = getattr(dim, "__name__", None)
            if name and axis < len(shape) and isinstance(shape[axis], torch.SymInt) and shape[axis].node.expr.is_Symbol:
                names[str(shape[axis].node.expr)] = name
    return names
