"""One import function per ONNX op type, registered in IMPORTERS — grouped by op family in this package's
modules (elementwise, nn, reduce, shape, composite, einsum, resize, indexing).

Each takes the import context and the node's input Values (None for an omitted optional input) and
returns the Values of the node's outputs, built from Kiln core ops with every attribute normalized
(explicit axes, pads, shapes; opset differences resolved here and nowhere else)."""
from kiln.frontend.importers.registry import IMPORTERS, Importer, fold_with_reference, importer  # noqa: I001

# the op families register themselves in IMPORTERS on import
from kiln.frontend.importers import composite, einsum, elementwise, indexing, nn, quant, reduce, resize, shape  # noqa: F401

__all__ = ["IMPORTERS", "Importer", "fold_with_reference", "importer"]
