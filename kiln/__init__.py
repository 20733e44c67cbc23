"""Kiln: a deep-learning compiler for CPUs (ONNX → graph IR → loop IR → LLVM → native vector code)."""
from kiln.compiler import PASS_OPTIONS, __version__, compile
from kiln.errors import BoundsError, KilnError, ModelError, TargetError, UnsupportedOperator
from kiln.quantization import quantization_report, quantize
from kiln.runtime.executable import Executable
from kiln.strategy import STRATEGIES


def load(path: str, num_threads: int | None = None) -> Executable:
    """Load an executable written by `Executable.save` (no recompilation)."""
    return Executable.load(path, num_threads=num_threads)


__all__ = ["compile", "load", "Executable", "KilnError", "ModelError", "UnsupportedOperator", "BoundsError",
           "TargetError", "quantize", "quantization_report", "PASS_OPTIONS", "STRATEGIES", "__version__"]
