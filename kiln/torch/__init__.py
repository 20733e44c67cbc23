"""Kiln for PyTorch: `torch.compile(model, backend="kiln")` (kiln/torch/dynamo.py) and
`kiln.from_torch(module, example_inputs)` (kiln/torch/export.py), both through the Core ATen frontend
(kiln/frontend/torch) into the same compiler as ONNX models.

    compiled = torch.compile(model, backend="kiln", options={"threads": 2})   # inference; fallback to eager
    exe = kiln.from_torch(model, (x,)); exe.save("m.kiln")                   # AOT, no torch needed to run
    kiln.torch.as_module(exe)(x)                                              # an Executable on tensors
    kiln.torch.stats()                                                        # graphs, compiles, fallbacks

Importing this package imports torch (`import kiln` does not)."""
from kiln.torch.call import KilnCall, as_module
from kiln.torch.dynamo import backend, reset_stats, stats
from kiln.torch.export import from_torch

__all__ = ["backend", "from_torch", "as_module", "stats", "reset_stats", "KilnCall"]
