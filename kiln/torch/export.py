"""Ahead of time: `kiln.from_torch(module, example_inputs)` → an Executable, through torch.export.

The module is exported for the example inputs' shapes and dtypes (torch.export, then torch's Core ATen
decompositions), its parameters and buffers frozen, imported into Kiln's graph IR and compiled by `kiln.compile`:
the result saves and loads like any Executable (`exe.save(path)`, `kiln.load(path)`), and needs no torch to run.
There is no eager fallback here: an op Kiln cannot compile is an UnsupportedOperator naming it and its source
line. Inputs are named after the forward's arguments; outputs output_0, output_1, ..."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kiln.frontend.torch import AtenProgram
from kiln.torch.trace import export_core_aten


def from_torch(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor,  # noqa: ANN201
               dynamic_shapes: Any = None, **compile_kw: Any):
    """Compile `module` for inputs like `example_inputs`; keywords go to kiln.compile (num_threads, strategy,
    target, cache, ...). `dynamic_shapes` is torch.export's (e.g. `({0: Dim("batch", max=8), 1: Dim("seq",
    max=512)},)`): those sizes become Kiln's symbolic dims, bounded by each Dim's range (a Dim without a max: Kiln's
    default bound), and the executable runs every size within them from one compile."""
    from kiln.compiler import compile as kiln_compile

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"from_torch: example input {i} is a {type(x).__name__}; pass tensors")
        if x.device.type != "cpu":
            raise ValueError(f"from_torch: example input {i} is on {x.device}; Kiln compiles for this machine's CPU")
    with torch.no_grad():
        gm = export_core_aten(module, tuple(example_inputs), dynamic_shapes)
    return kiln_compile(AtenProgram(gm, name=type(module).__name__), **compile_kw)
