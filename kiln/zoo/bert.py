"""BERT-base encoder stack (no embeddings, no pooler, no attention mask), exporter-style.

The graph mirrors what torch.onnx.export produces for HuggingFace's BertModel at opset 17: the
head split is a Reshape whose target shape is computed at run time from Shape/Gather/Unsqueeze/
Concat, GELU is the erf form spelled out in elementwise nodes, and LayerNormalization is the
opset-17 op. Compilers therefore have to see through the shape arithmetic and fuse GELU themselves.
"""
from __future__ import annotations

import math

import numpy as np
import onnx

from .builder import GraphBuilder

LAYERS = 12
HIDDEN = 768
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 3072
SEQ = 128
INIT_STD = 0.02  # BERT's initializer_range


def scalar(b: GraphBuilder, name: str, value: float) -> str:
    return b.const(name, np.array(value, dtype=np.float32))


def dense(b: GraphBuilder, x: str, name: str, cin: int, cout: int) -> str:
    """nn.Linear on 3-D input: the exporter writes MatMul with a pre-transposed [in, out] weight, then Add."""
    w = b.normal(f"{name}.weight", (cin, cout), INIT_STD)
    bias = b.normal(f"{name}.bias", (cout,), INIT_STD)
    return b.op("Add", f"{name}.bias_add", [b.op("MatMul", name, [x, w]), bias])


def layer_norm(b: GraphBuilder, x: str, name: str, out: str | None = None) -> str:
    gamma = b.uniform(f"{name}.weight", (HIDDEN,), 0.9, 1.1)
    beta = b.normal(f"{name}.bias", (HIDDEN,), INIT_STD)
    return b.op("LayerNormalization", name, [x, gamma, beta], out=out, axis=-1, epsilon=1e-12)


def leading_dims(b: GraphBuilder, x: str, name: str) -> tuple[str, str]:
    """[batch], [seq] of x as 1-D int64 tensors, via Shape -> Gather -> Unsqueeze."""
    shape = b.op("Shape", f"{name}.shape", [x])
    dims = []
    for i, dim in enumerate(("batch", "seq")):
        idx = b.constant_i64(f"{name}.{dim}_index", i)
        scalar_dim = b.op("Gather", f"{name}.{dim}", [shape, idx], axis=0)
        axes = b.constant_i64(f"{name}.{dim}_axes", [0])
        dims.append(b.op("Unsqueeze", f"{name}.{dim}_1d", [scalar_dim, axes]))
    return dims[0], dims[1]


def reshape_dynamic(b: GraphBuilder, x: str, name: str, tail: list[int]) -> str:
    """Reshape x [B, S, ...] to [B, S, *tail] with the target shape computed from x at run time."""
    batch, seq = leading_dims(b, x, name)
    rest = [b.constant_i64(f"{name}.dim{i + 2}", [d]) for i, d in enumerate(tail)]
    target = b.op("Concat", f"{name}.target", [batch, seq, *rest], axis=0)
    return b.op("Reshape", name, [x, target])


def split_heads(b: GraphBuilder, x: str, name: str, perm: list[int]) -> str:
    """[B, S, H*D] -> [B, S, H, D] -> transposed by perm (K gets [0,2,3,1] so it arrives as K^T)."""
    x = reshape_dynamic(b, x, f"{name}.split", [HEADS, HEAD_DIM])
    return b.op("Transpose", f"{name}.transpose", [x], perm=perm)


def attention(b: GraphBuilder, x: str, p: str) -> str:
    q = split_heads(b, dense(b, x, f"{p}.q", HIDDEN, HIDDEN), f"{p}.q", [0, 2, 1, 3])
    k_t = split_heads(b, dense(b, x, f"{p}.k", HIDDEN, HIDDEN), f"{p}.k", [0, 2, 3, 1])
    v = split_heads(b, dense(b, x, f"{p}.v", HIDDEN, HIDDEN), f"{p}.v", [0, 2, 1, 3])
    scores = b.op("MatMul", f"{p}.scores", [q, k_t])
    scores = b.op("Div", f"{p}.scale", [scores, scalar(b, "const.sqrt_head_dim", math.sqrt(HEAD_DIM))])
    probs = b.op("Softmax", f"{p}.softmax", [scores], axis=-1)
    ctx = b.op("MatMul", f"{p}.context", [probs, v])
    ctx = b.op("Transpose", f"{p}.context.transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = reshape_dynamic(b, ctx, f"{p}.context.merge", [HIDDEN])
    return dense(b, ctx, f"{p}.out", HIDDEN, HIDDEN)


def gelu(b: GraphBuilder, x: str, p: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), node for node as the exporter emits nn.GELU()."""
    y = b.op("Div", f"{p}.div", [x, scalar(b, "const.sqrt2", math.sqrt(2.0))])
    y = b.op("Erf", f"{p}.erf", [y])
    y = b.op("Add", f"{p}.add", [y, scalar(b, "const.one", 1.0)])
    y = b.op("Mul", f"{p}.mul", [x, y])
    return b.op("Mul", f"{p}.half", [y, scalar(b, "const.half", 0.5)])


def encoder_layer(b: GraphBuilder, x: str, p: str, out: str | None = None) -> str:
    h = b.op("Add", f"{p}.attn.residual", [attention(b, x, f"{p}.attn"), x])
    h = layer_norm(b, h, f"{p}.attn.ln")
    y = gelu(b, dense(b, h, f"{p}.ffn.up", HIDDEN, INTERMEDIATE), f"{p}.ffn.gelu")
    y = b.op("Add", f"{p}.ffn.residual", [dense(b, y, f"{p}.ffn.down", INTERMEDIATE, HIDDEN), h])
    return layer_norm(b, y, f"{p}.ffn.ln", out=out)


def bert_base(seed: int = 0, dims: tuple[int | str, int | str] = (1, SEQ), name: str = "bert_base"
              ) -> onnx.ModelProto:
    """`dims`: (batch, seq) of the embeddings input, ints or dim_param names (bert_base_dynamic)."""
    b = GraphBuilder(seed)
    x = b.input("embeddings", (*dims, HIDDEN))
    for i in range(LAYERS):
        x = encoder_layer(b, x, f"encoder.{i}", out="hidden_states" if i == LAYERS - 1 else None)
    b.output("hidden_states", (*dims, HIDDEN))
    return b.model(name)


def bert_base_dynamic(seed: int = 0) -> onnx.ModelProto:
    """bert_base with symbolic `batch` and `seq`: embeddings [batch, seq, 768] (same weights, same graph)."""
    return bert_base(seed, dims=("batch", "seq"), name="bert_base_dynamic")
