"""Kiln: a deep-learning compiler for CPUs (ONNX → graph IR → loop IR → LLVM → native vector code)."""
from kiln.compiler import PASS_OPTIONS, __version__, compile
from kiln.errors import BoundsError, KilnError, ModelError, TargetError, UnsupportedOperator
from kiln.quantization import quantization_report, quantize
from kiln.runtime.executable import Executable
from kiln.strategy import STRATEGIES


def from_torch(module, example_inputs, **compile_kw):  # noqa: ANN001, ANN201
    """Compile a torch.nn.Module ahead of time (torch.export → Core ATen → Kiln) into an Executable that saves and
    loads like any other; keywords go to kiln.compile. See kiln/torch/export.py."""
    from kiln.torch.export import from_torch as _from_torch

    return _from_torch(module, example_inputs, **compile_kw)


def load(path: str, num_threads: int | None = None) -> Executable:
    """Load an executable written by `Executable.save` (no recompilation)."""
    return Executable.load(path, num_threads=num_threads)


__all__ = ["compile", "load", "from_torch", "Executable", "KilnError", "ModelError", "UnsupportedOperator",
           "BoundsError", "TargetError", "quantize", "quantization_report", "PASS_OPTIONS", "STRATEGIES",
           "__version__"]
