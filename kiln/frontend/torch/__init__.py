"""PyTorch (FX graphs of Core ATen ops) → Graph IR, beside the ONNX frontend and into the same graph IR.

What arrives here is a functional FX graph in the Core ATen op set — from AOTAutograd under `torch.compile(...,
backend="kiln")` (kiln/torch/dynamo.py) or from `torch.export` (`kiln.from_torch`) — whose parameters are frozen
as `get_attr` constants. `import_aten` walks it in order; each `call_function` goes through the import function
registered for its ATen overload in `ATEN` (this package's `ops_*` modules, one function per op family as
kiln/frontend/importers does for ONNX), which builds Kiln core ops with every argument normalized. From the graph
IR on, a torch model takes exactly the path of an ONNX one (`kiln/compiler.py: lower()`).

`unsupported_reason(node)` is the capability check the partitioner asks (kiln/torch/partition.py): a node is
supported when its import succeeds on its own, so there is one source of truth for what Kiln can take.

Nothing here imports torch at module level: `import kiln` stays light."""
from __future__ import annotations

from kiln.frontend.torch.importer import ATEN, AtenProgram, import_aten, unsupported_reason

# the op families register themselves in ATEN on import
from kiln.frontend.torch.ops import elementwise, indexing, nn, reduce, shape  # noqa: E402, F401, I001

__all__ = ["ATEN", "AtenProgram", "import_aten", "unsupported_reason"]
