"""torch.compile(module, backend="kiln", fullgraph=True) on small modules covering the Core ATen ops the frontend
imports (convnets with BN, a transformer block with SDPA and a causal mask, an MLP, normalizations, in-place ops,
views and slicing, where/masked_fill, embeddings, reductions, resampling and padding), compared with eager PyTorch:
max|kiln − eager| ≤ 1e-4 · max(max|eager|, 1e-6) per output (tests/torch_cases.py). fullgraph=True means the whole
graph ran in Kiln (a fallback would be an error); every case runs per x86 vector width (`width` fixture)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_cases import CASES, _fresh_dynamo, case, check_module  # noqa: E402, F401

import kiln.torch  # noqa: E402
from conftest import width_runs  # noqa: E402


@pytest.mark.parametrize("name", list(CASES))
def test_module_matches_eager(name: str, width: str) -> None:
    module, inputs = case(name)
    check_module(module, inputs, width)
    if width_runs(width):  # (otherwise check_module lowered and emitted the object: no backend call)
        st = kiln.torch.stats()
        assert st.get("fallback_ops", 0) == 0 and st.get("compiles", 0) >= 1, st


def test_import_is_not_an_onnx_round_trip() -> None:
    """The frontend builds Kiln's graph IR from the ATen graph directly: the compiled Kiln graph carries the FX
    node names, and no ONNX model is made on the way."""
    import onnx

    from kiln.compiler import lower
    from kiln.frontend.torch import AtenProgram, import_aten
    from kiln.target import host
    from kiln.torch.trace import export_core_aten

    module, inputs = case("convnet_bn")
    made = []
    real = onnx.ModelProto.__init__
    onnx.ModelProto.__init__ = lambda self, *a, **k: (made.append(1), real(self, *a, **k))[1]  # type: ignore
    try:
        with torch.no_grad():
            program = AtenProgram(export_core_aten(module, tuple(inputs)))
        graph = import_aten(program)
        c = lower(program, host(), 2, {}, stop_after="kernels")
    finally:
        onnx.ModelProto.__init__ = real  # type: ignore
    assert not made, "an ONNX model was built on the way"
    assert any(n.name.startswith("convolution") for n in graph.nodes), [n.name for n in graph.nodes][:5]
    assert [n.op for n in graph.nodes].count("BatchNormalization") == 4  # the stem runs twice
    assert not any(n.op == "BatchNormalization" for n in c.graph.nodes), "BN was not folded by the shared passes"
