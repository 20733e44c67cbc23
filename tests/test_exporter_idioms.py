"""Models written the way PyTorch's ONNX exporter (torch.onnx.export, TorchScript-based, opset 13–17) emits them,
compiled by Kiln and compared with onnxruntime: shape arithmetic on symbolic dims (Shape → Gather → Unsqueeze →
Concat → Reshape), a causal mask built from Range/Trilu and applied with Where, a fused QKV projection Split
into heads, the erf-GELU and decomposed LayerNorm patterns, embedding lookups with int64 ids and position ids
made by Range/Expand, and a vision block flattened through Shape arithmetic."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln.backend
from conftest import check

F, I64 = TensorProto.FLOAT, TensorProto.INT64
HIDDEN, HEADS = 32, 4
HD = HIDDEN // HEADS


class G:
    """A tiny graph builder that names values like the exporter does (onnx::Add_12, /attn/Softmax_output_0)."""

    def __init__(self, opset: int = 14, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def op(self, op: str, *ins: str, n_out: int = 1, **attrs) -> str | list[str]:  # noqa: ANN003
        self.n += 1
        outs = [f"/{op}_{self.n}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, list(ins), outs, name=f"/{op}_{self.n}", **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value: np.ndarray | float | int | list, dtype=None) -> str:  # noqa: ANN001
        """A Constant node (the exporter emits those for literals), not an initializer."""
        self.n += 1
        name = f"onnx::Constant_{self.n}"
        arr = np.asarray(value, dtype=dtype)
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr)))
        return name

    def weight(self, name: str, *shape: int, scale: float = 0.2) -> str:
        self.inits.append(numpy_helper.from_array((self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def linear(self, x: str, name: str, k: int, n: int) -> str:  # MatMul with a transposed weight + Add bias
        return self.op("Add", self.op("MatMul", x, self.weight(f"{name}.weight_T", k, n)),
                       self.weight(f"{name}.bias", n))

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[tuple[str, str, list]]) -> onnx.ModelProto:
        outs = []
        for src, name, dims in outputs:
            self.nodes.append(helper.make_node("Identity", [src], [name]))
            outs.append(helper.make_tensor_value_info(name, F, dims))
        g = helper.make_graph(self.nodes, "torch_jit", inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], producer_name="pytorch",
                              producer_version="2.13.0")
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m

    # -- exporter idioms -------------------------------------------------------------------------------------
    def dim(self, x: str, i: int) -> str:
        """x.size(i) as a 1-element int64 tensor: Shape → Gather(scalar index) → Unsqueeze."""
        return self.op("Unsqueeze", self.op("Gather", self.op("Shape", x), self.const(i, np.int64), axis=0),
                       self.const([0], np.int64))

    def layer_norm(self, x: str, name: str) -> str:
        """LayerNorm as exported before opset 17: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div."""
        mean = self.op("ReduceMean", x, axes=[-1], keepdims=1)
        d = self.op("Sub", x, mean)
        var = self.op("ReduceMean", self.op("Pow", d, self.const(2.0, np.float32)), axes=[-1], keepdims=1)
        y = self.op("Div", d, self.op("Sqrt", self.op("Add", var, self.const(1e-5, np.float32))))
        return self.op("Add", self.op("Mul", y, self.weight(f"{name}.weight", HIDDEN, scale=1.0)),
                       self.weight(f"{name}.bias", HIDDEN))

    def gelu(self, x: str) -> str:
        """nn.GELU(): x * 0.5 * (1 + erf(x / sqrt(2)))."""
        e = self.op("Erf", self.op("Div", x, self.const(1.4142135381698608, np.float32)))
        return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(1.0, np.float32))),
                       self.const(0.5, np.float32))

    def heads(self, x: str, b: str, s: str) -> str:
        """[b, s, H] → view(b, s, heads, hd) → transpose(1, 2)."""
        shape = self.op("Concat", b, s, self.const([HEADS], np.int64), self.const([HD], np.int64), axis=0)
        return self.op("Transpose", self.op("Reshape", x, shape), perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, b: str, s: str) -> str:
        t = self.op("Transpose", x, perm=[0, 2, 1, 3])
        return self.op("Reshape", t, self.op("Concat", b, s, self.const([HIDDEN], np.int64), axis=0))


def _attention(g: G, x: str, name: str, causal: str) -> str:
    """A GPT-style block: fused QKV Linear, Split into q/k/v, per-head attention masked with Where."""
    b, s = g.dim(x, 0), g.dim(x, 1)
    qkv = g.linear(x, f"{name}.c_attn", HIDDEN, 3 * HIDDEN)
    q, k, v = g.op("Split", qkv, g.const([HIDDEN] * 3, np.int64), n_out=3, axis=2)
    q, k, v = (g.heads(t, b, s) for t in (q, k, v))
    scores = g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                  g.const(np.sqrt(HD), np.float32))
    # mask = causal[:, :, :s, :s] (a Slice of a precomputed buffer with run-time ends), then where(mask, w, -inf)
    ends = g.op("Concat", s, s, axis=0)
    mask = g.op("Slice", causal, g.const([0, 0], np.int64), ends, g.const([2, 3], np.int64))
    masked = g.op("Where", mask, scores, g.const(np.finfo(np.float32).min, np.float32))
    att = g.op("MatMul", g.op("Softmax", masked, axis=-1), v)
    return g.linear(g.merge_heads(att, b, s), f"{name}.c_proj", HIDDEN, HIDDEN)


def gpt_block(seq_max: int = 16, mask_from: str = "trilu") -> onnx.ModelProto:
    g = G(opset=14)
    ids = helper.make_tensor_value_info("input_ids", I64, ["batch", "sequence"])
    # token + position embeddings: position_ids = arange(s).unsqueeze(0).expand(b, s)
    wte, wpe = g.weight("wte.weight", 50, HIDDEN), g.weight("wpe.weight", seq_max, HIDDEN)
    b, s = g.dim("input_ids", 0), g.dim("input_ids", 1)
    s_scalar = g.op("Squeeze", s, g.const([0], np.int64))
    pos = g.op("Range", g.const(0, np.int64), s_scalar, g.const(1, np.int64))
    pos = g.op("Expand", g.op("Unsqueeze", pos, g.const([0], np.int64)), g.op("Concat", b, s, axis=0))
    x = g.op("Add", g.op("Gather", wte, "input_ids", axis=0), g.op("Gather", wpe, pos, axis=0))
    if mask_from == "trilu":  # torch.tril(torch.ones(n, n, dtype=bool)).view(1, 1, n, n)
        ones = g.op("ConstantOfShape", g.const([seq_max, seq_max], np.int64),
                    value=numpy_helper.from_array(np.array([1], np.int64)))
        causal = g.op("Cast", g.op("Trilu", ones, upper=0), to=TensorProto.BOOL)
        causal = g.op("Reshape", causal, g.const([1, 1, seq_max, seq_max], np.int64))
    else:  # a registered buffer: the exporter writes it as a constant
        causal = g.const(np.tril(np.ones((seq_max, seq_max), bool)).reshape(1, 1, seq_max, seq_max))
    h = g.op("Add", x, _attention(g, g.layer_norm(x, "ln_1"), "attn", causal))
    mlp = g.linear(g.gelu(g.linear(g.layer_norm(h, "ln_2"), "mlp.c_fc", HIDDEN, 4 * HIDDEN)), "mlp.c_proj",
                   4 * HIDDEN, HIDDEN)
    out = g.op("Add", h, mlp)
    logits = g.op("MatMul", out, g.op("Transpose", wte, perm=[1, 0]))
    return g.model([ids], [(logits, "logits", ["batch", "sequence", 50]),
                                (out, "hidden_states", ["batch", "sequence", HIDDEN])])


def bert_attention_mask() -> onnx.ModelProto:
    """BERT's extended attention mask: (1.0 - mask[:, None, None, :].float()) * finfo.min, added to the scores;
    the sequence length comes from Shape arithmetic; opset 13 (Split and Squeeze take inputs)."""
    g = G(opset=13, seed=1)
    x_in = helper.make_tensor_value_info("hidden", F, ["batch", "sequence", HIDDEN])
    m_in = helper.make_tensor_value_info("attention_mask", I64, ["batch", "sequence"])
    ext = g.op("Unsqueeze", g.op("Unsqueeze", "attention_mask", g.const([1], np.int64)), g.const([2], np.int64))
    ext = g.op("Mul", g.op("Sub", g.const(1.0, np.float32), g.op("Cast", ext, to=F)),
               g.const(np.finfo(np.float32).min, np.float32))
    b, s = g.dim("hidden", 0), g.dim("hidden", 1)
    q, k, v = (g.heads(g.linear("hidden", f"attn.{n}", HIDDEN, HIDDEN), b, s) for n in ("query", "key", "value"))
    scores = g.op("Add", g.op("Div", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2])),
                              g.const(np.sqrt(HD), np.float32)), ext)
    ctx = g.merge_heads(g.op("MatMul", g.op("Softmax", scores, axis=-1), v), b, s)
    # pooler: hidden[:, 0] via Gather on axis 1, tanh(Linear)
    pooled = g.op("Tanh", g.linear(g.op("Gather", ctx, g.const(0, np.int64), axis=1), "pooler", HIDDEN, HIDDEN))
    return g.model([x_in, m_in], [(ctx, "last_hidden_state", ["batch", "sequence", HIDDEN]),
                                    (pooled, "pooler_output", ["batch", HIDDEN])])


def conv_flatten() -> onnx.ModelProto:
    """A vision head as exported: Conv (BN already folded by the exporter in eval mode), Relu, MaxPool,
    GlobalAveragePool (AdaptiveAvgPool2d(1)), x.view(x.size(0), -1) through Shape/Gather/Unsqueeze/Concat,
    then Gemm with transB=1 (nn.Linear)."""
    g = G(opset=13, seed=2)
    x_in = helper.make_tensor_value_info("input", F, ["batch", 3, 16, 16])
    c = g.op("Relu", g.op("Conv", "input", g.weight("conv.weight", 8, 3, 3, 3), g.weight("conv.bias", 8),
                          pads=[1, 1, 1, 1], strides=[1, 1], kernel_shape=[3, 3]))
    p = g.op("GlobalAveragePool", g.op("MaxPool", c, kernel_shape=[2, 2], strides=[2, 2]))
    flat = g.op("Reshape", p, g.op("Concat", g.dim(p, 0), g.const([-1], np.int64), axis=0))
    y = g.op("Gemm", flat, g.weight("fc.weight", 10, 8), g.weight("fc.bias", 10), alpha=1.0, beta=1.0, transB=1)
    return g.model([x_in], [(y, "output", ["batch", 10])])


CASES = {
    "gpt_block_trilu_mask": (lambda: gpt_block(mask_from="trilu"), {"input_ids": (2, 7)}),
    "gpt_block_constant_mask": (lambda: gpt_block(mask_from="constant"), {"input_ids": (1, 16)}),
    "bert_attention_mask": (bert_attention_mask, {"hidden": (2, 9, HIDDEN), "attention_mask": (2, 9)}),
    "conv_flatten": (conv_flatten, {"input": (3, 3, 16, 16)}),
}


def _feeds(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if name == "input_ids":
            out[name] = rng.integers(0, 50, shape).astype(np.int64)
        elif name == "attention_mask":
            m = np.ones(shape, np.int64)
            m[0, -3:] = 0  # padding at the end of the first sequence
            out[name] = m
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_exporter_model_matches_onnxruntime(case: str) -> None:
    build, shapes = CASES[case]
    model, feeds = build(), _feeds(shapes)
    check(model, feeds, rtol=2e-4, input_shapes=shapes)


@pytest.mark.parametrize("case", ["gpt_block_trilu_mask", "bert_attention_mask"])
def test_exporter_model_through_the_backend_at_two_lengths(case: str) -> None:
    """Symbolic batch/sequence: the backend compiles once per input-shape signature."""
    from conftest import assert_close, run_ort

    build, shapes = CASES[case]
    model = build()
    rep = kiln.backend.prepare(model)
    for seq in (5, 11):
        sh = {k: (v[0], seq) + tuple(v[2:]) for k, v in shapes.items()}
        feeds = _feeds(sh, seed=seq)
        got = rep.run([feeds[i.name] for i in model.graph.input])
        for g_, w in zip(got, run_ort(model, feeds)):
            assert_close(g_, w, 2e-4)
    assert len(rep._executables) == 2
