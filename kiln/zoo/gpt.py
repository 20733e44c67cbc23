"""A small GPT-2-style decoder with a symbolic batch and sequence, exporter-style.

input_ids int64[batch, seq] → token embeddings (Gather) + learned position embeddings (Gather of the position
table by Range(0, seq, 1), seq taken from Shape(input_ids)) → 4 pre-LayerNorm blocks (fused QKV projection split
three ways, 4 causal heads, GELU MLP) → final LayerNorm → logits [batch, seq, VOCAB]. The causal mask is GPT-2's:
a constant lower-triangular [1, 1, MAX_POSITIONS, MAX_POSITIONS] table sliced to [seq, seq] (Slice ends from
Shape), then Where(mask, scores, -1e4). All shapes come from Shape/Gather/Unsqueeze/Concat arithmetic at run time,
as torch.onnx.export writes them; small (hidden 256) so tests stay fast. Random seeded weights.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from .bert import dense, gelu, leading_dims, reshape_dynamic, scalar
from .builder import GraphBuilder

LAYERS = 4
HIDDEN = 256
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
VOCAB = 1000
MAX_POSITIONS = 512  # the position table's rows: the largest seq (= kiln.graph.symbolic.DEFAULT_BOUND)
INIT_STD = 0.02
SEQ = 16  # the default sequence length of zoo.inputs("gpt_decoder")


def layer_norm(b: GraphBuilder, x: str, name: str) -> str:
    gamma = b.uniform(f"{name}.weight", (HIDDEN,), 0.9, 1.1)
    beta = b.normal(f"{name}.bias", (HIDDEN,), INIT_STD)
    return b.op("LayerNormalization", name, [x, gamma, beta], axis=-1, epsilon=1e-5)


def causal_mask(b: GraphBuilder, x: str, p: str) -> str:
    """GPT-2's `bias[:, :, :seq, :seq]`: the constant causal table sliced by the sequence length of x."""
    table = np.tril(np.ones((MAX_POSITIONS, MAX_POSITIONS), dtype=bool)).reshape(1, 1, MAX_POSITIONS, MAX_POSITIONS)
    mask = b.const("const.causal_mask", table)
    _, seq = leading_dims(b, x, f"{p}.mask")
    ends = b.op("Concat", f"{p}.mask.ends", [seq, seq], axis=0)
    return b.op("Slice", f"{p}.mask.slice", [mask, b.constant_i64(f"{p}.mask.starts", [0, 0]), ends,
                                             b.constant_i64(f"{p}.mask.axes", [2, 3])])


def attention(b: GraphBuilder, x: str, p: str) -> str:
    qkv = dense(b, x, f"{p}.qkv", HIDDEN, 3 * HIDDEN)
    split = b.constant_i64(f"{p}.split_sizes", [HIDDEN] * 3)
    names = b.op_outputs("Split", f"{p}.split", [qkv, split], [f"{p}.{t}" for t in "qkv"], axis=-1)
    q, k, v = (reshape_dynamic(b, t, f"{t}.heads", [HEADS, HEAD_DIM]) for t in names)
    q = b.op("Transpose", f"{p}.q.transpose", [q], perm=[0, 2, 1, 3])
    k_t = b.op("Transpose", f"{p}.k.transpose", [k], perm=[0, 2, 3, 1])
    v = b.op("Transpose", f"{p}.v.transpose", [v], perm=[0, 2, 1, 3])
    scores = b.op("MatMul", f"{p}.scores", [q, k_t])
    scores = b.op("Div", f"{p}.scale", [scores, scalar(b, "const.sqrt_head_dim", math.sqrt(HEAD_DIM))])
    scores = b.op("Where", f"{p}.causal", [causal_mask(b, x, p), scores, scalar(b, "const.masked", -1e4)])
    probs = b.op("Softmax", f"{p}.softmax", [scores], axis=-1)
    ctx = b.op("MatMul", f"{p}.context", [probs, v])
    ctx = b.op("Transpose", f"{p}.context.transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = reshape_dynamic(b, ctx, f"{p}.context.merge", [HIDDEN])
    return dense(b, ctx, f"{p}.proj", HIDDEN, HIDDEN)


def block(b: GraphBuilder, x: str, p: str) -> str:
    h = b.op("Add", f"{p}.attn.residual", [attention(b, layer_norm(b, x, f"{p}.ln_1"), f"{p}.attn"), x])
    y = gelu(b, dense(b, layer_norm(b, h, f"{p}.ln_2"), f"{p}.mlp.fc", HIDDEN, 4 * HIDDEN), f"{p}.mlp.gelu")
    return b.op("Add", f"{p}.mlp.residual", [dense(b, y, f"{p}.mlp.proj", 4 * HIDDEN, HIDDEN), h])


def gpt_decoder(seed: int = 0) -> onnx.ModelProto:
    b = GraphBuilder(seed)
    ids = b.input("input_ids", ("batch", "seq"), TensorProto.INT64)
    wte = b.normal("wte", (VOCAB, HIDDEN), INIT_STD)
    wpe = b.normal("wpe", (MAX_POSITIONS, HIDDEN), 0.01)
    tokens = b.op("Gather", "embed.tokens", [wte, ids], axis=0)
    seq = b.op("Gather", "embed.seq", [b.op("Shape", "embed.shape", [ids]), b.constant_i64("embed.seq_index", 1)],
               axis=0)
    positions = b.op("Range", "embed.positions", [b.constant_i64("embed.zero", 0), seq,
                                                  b.constant_i64("embed.one", 1)])
    x = b.op("Add", "embed.add", [tokens, b.op("Gather", "embed.pos", [wpe, positions], axis=0)])
    for i in range(LAYERS):
        x = block(b, x, f"h.{i}")
    x = layer_norm(b, x, "ln_f")
    head = b.normal("lm_head.weight", (HIDDEN, VOCAB), INIT_STD)
    b.op("MatMul", "lm_head", [x, head], out="logits")
    b.output("logits", ("batch", "seq", VOCAB))
    return b.model("gpt_decoder")


def token_ids(shape: tuple[int, int], seed: int = 1) -> np.ndarray:
    """Random token ids in [0, VOCAB) for a [batch, seq] input."""
    return np.random.default_rng(seed).integers(0, VOCAB, size=shape, dtype=np.int64)
