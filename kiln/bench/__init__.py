"""kiln.bench: measure Kiln against the systems people use (see cli.py for `kiln bench`).

Importing this package is cheap: matplotlib, onnxruntime, llvmlite and the peers load on use.
"""
