"""Transformer linear layers as torch and ONNX exporters write them (BERT-base's shape class, made small): the
GEMM's epilogue takes what follows a `view → addmm → view` (bias, GELU, the residual add) — the graph pass
`elementwise_through_views` and the epilogue fusion of kernel/build.py — and the packed GEMM tile prefetches its
weight panel (schedule/prefetch.py). Numerics against eager PyTorch (1e-4 of the output's scale, tests/torch_cases)
and onnxruntime (rtol stated per test); structure on the lowered kernels."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import check
from kiln.compiler import check_options, lower
from kiln.kernel.build import _view_reindex, build_program
from kiln.kernel.ir import Const, Kernel, Loop, Prefetch, Stmt, Var
from kiln.schedule.default import schedule_kernel
from kiln.target import resolve

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch_cases import check_module  # noqa: E402


class FeedForward(nn.Module):
    """BERT's output half: LayerNorm(h + down(GELU(up(h)))) on [batch, seq, hidden]."""

    def __init__(self, hidden: int = 64, inner: int = 256) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(hidden, inner), nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h + self.down(nn.functional.gelu(self.up(h))))


def _ffn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return FeedForward().eval(), torch.randn(1, 24, 64)


def _nest(body: list[Stmt]) -> list[Stmt]:
    out: list[Stmt] = []
    for s in body:
        out.append(s)
        for attr in ("body", "orelse"):
            out += _nest(getattr(s, attr, None) or [])
    return out


def _torch_kernels(module: nn.Module, x: torch.Tensor, target: str = "host") -> list[Kernel]:
    from kiln.frontend.torch import AtenProgram
    from kiln.torch.trace import export_core_aten
    with torch.no_grad():
        gm = export_core_aten(module, (x,))
    return lower(AtenProgram(gm), resolve(target), 2, check_options({}), stop_after="kernels").program.kernels


def test_ffn_matches_eager(width: str) -> None:
    module, x = _ffn()
    check_module(module, [x], width)


def test_ffn_epilogues_fuse_into_the_gemms() -> None:
    """up + bias + GELU is one kernel, down + bias + residual add another: only the two GEMMs and the LayerNorm
    run (before the pass: the GELU and the add were kernels of their own, reading the GEMMs' outputs back)."""
    module, x = _ffn()
    names = [k.name.split("_", 1)[1] for k in _torch_kernels(module, x)]
    assert names == ["packedmatmul", "packedmatmul", "layernormalization"], names
    off = lower_torch_without_pass(module, x)
    assert "gelu" in off and "add" in off, off


def lower_torch_without_pass(module: nn.Module, x: torch.Tensor) -> list[str]:
    from kiln.frontend.torch import AtenProgram
    from kiln.torch.trace import export_core_aten
    with torch.no_grad():
        gm = export_core_aten(module, (x,))
    c = lower(AtenProgram(gm), resolve("host"), 2, check_options({"elementwise_through_views": False}),
              stop_after="kernels")
    return [k.name.split("_", 1)[1] for k in c.program.kernels]


# -- the pass on ONNX graphs: broadcasts, constants, and the cases it must leave alone -------------------------------
def _view_model(second_reader: bool) -> onnx.ModelProto:
    """y = MatMul(x[24, 64], W) + b → Reshape [1, 24, 48] → Add(r[1, 1, 48]) → Mul(c[1, 24, 48]) → Relu → Softmax:
    the adds and multiplies broadcast over unit axes (the Softmax keeps the Relu from being the graph output, which
    stays unrewritten); with `second_reader` the view is also a graph output."""
    rng = np.random.default_rng(0)
    consts = {"W": rng.standard_normal((64, 48), dtype=np.float32) * 0.1,
              "b": rng.standard_normal(48, dtype=np.float32),
              "shape": np.array([1, 24, 48], np.int64),
              "r": rng.standard_normal((1, 1, 48), dtype=np.float32),
              "c": rng.standard_normal((1, 24, 48), dtype=np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["lin"]),
             helper.make_node("Reshape", ["lin", "shape"], ["v"]), helper.make_node("Add", ["v", "r"], ["a"]),
             helper.make_node("Mul", ["a", "c"], ["m"]), helper.make_node("Relu", ["m"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 48])]
    if second_reader:
        outs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 24, 48]))
    g = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 64])], outs,
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("second_reader", [False, True])
def test_elementwise_through_views(width: str, second_reader: bool) -> None:
    model = _view_model(second_reader)
    feeds = {"x": np.random.default_rng(1).standard_normal((24, 64), dtype=np.float32)}
    check(model, feeds, 1e-5, target=width)
    def names(**opts: bool) -> list[str]:
        c = lower(model, resolve("host"), 2, check_options(opts), stop_after="kernels")
        return [k.name.split("_", 1)[1] for k in c.program.kernels]
    if second_reader:  # the view is read twice: left alone (the same kernels as without the pass)
        assert names() == names(elementwise_through_views=False)
    else:  # the whole elementwise chain is the GEMM's epilogue
        assert names() == ["packedmatmul", "softmax"], names()
        assert len(names(elementwise_through_views=False)) > 2


# -- prefetch ------------------------------------------------------------------------------------------------------
def _gemm(k: int, n: int = 64) -> onnx.ModelProto:
    w = np.random.default_rng(2).standard_normal((k, n), dtype=np.float32) * 0.05
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "gemm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [40, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, n])],
                          [numpy_helper.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _prefetches(model: onnx.ModelProto, target: str, config: dict | None = None) -> list[Prefetch]:
    c = lower(model, resolve(target), 2, check_options({}), stop_after="kernels")
    prog = build_program(c.graph, check_options({}))
    (k,) = prog.kernels
    schedule_kernel(k, resolve(target), 2, check_options({}), config)
    return [s for s in _nest(k.body) if isinstance(s, Prefetch)]


def test_packed_tile_prefetches_its_panel_a_page_ahead(width: str) -> None:
    """Each reduction step of the packed tile prefetches the panel row one 4 KiB page ahead, one prefetch per 64-byte
    line of the NR-wide row; the knob `prefetch` = 0 removes them; the result is unchanged (vs onnxruntime)."""
    model = _gemm(256)
    t = resolve(width)
    nr = 2 * t.lanes(32)
    pf = _prefetches(model, width)
    assert len(pf) == -(-nr * 4 // 64), pf
    assert all(repr(p.index[1]).endswith(f"+ {4096 // (nr * 4)})") for p in pf), [repr(p.index) for p in pf]
    assert _prefetches(model, width, {"0:prefetch": 0}) == []
    off = lower(model, resolve(width), 2, check_options({"prefetch": False}), stop_after="kernels").program.kernels
    assert not [s for s in _nest(off[0].body) if isinstance(s, Prefetch)], "the switch prefetch=False"
    x = np.random.default_rng(3).standard_normal((40, 256), dtype=np.float32)
    check(model, {"x": x}, 1e-5, target=width)


def test_prefetch_reaches_llvm_and_skips_short_and_scalable() -> None:
    c = lower(_gemm(256), resolve("host"), 2, check_options({}), stop_after="llvm")
    assert "call void @\"llvm.prefetch.p0\"" in c.llvm_ir, "no prefetch in the LLVM IR"
    assert _prefetches(_gemm(16), "host") == [], "a panel shorter than a page needs no prefetch"
    assert _prefetches(_gemm(256), "aarch64-sve") == [], "scalable targets' strip-mined tiles take none"


def test_loop_printing_shows_prefetch() -> None:
    model = _gemm(256)
    c = lower(model, resolve("host"), 2, check_options({}), stop_after="kernels")
    text = str(c.program.kernels[0])
    assert "prefetch b1[" in text and "locality=3" in text, text
    assert any(isinstance(s, Loop) for s in c.program.kernels[0].body)


# -- recognize_gelu: the exporters' spelled-out GELU -------------------------------------------------------------------
def _gelu_model(spelling: str) -> onnx.ModelProto:
    """Linear(64 → 48) then GELU spelled out as exporters write it; `spelling`: "div" (x·(1 + erf(x/√2))·0.5, the
    zoo's and torch.onnx's), "mul_half_first" ((x·0.5)·(1 + erf(x·(1/√2)))), or "shared_erf" (the erf also a graph
    output: must stay spelled out)."""
    rng = np.random.default_rng(4)
    consts = {"W": rng.standard_normal((64, 48), dtype=np.float32) * 0.2,
              "b": rng.standard_normal(48, dtype=np.float32),
              "sqrt2": np.array(np.sqrt(2.0), np.float32), "isqrt2": np.array(1 / np.sqrt(2.0), np.float32),
              "one": np.array(1.0, np.float32), "half": np.array(0.5, np.float32)}
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "W"], ["mm"]), mk("Add", ["mm", "b"], ["h"])]
    if spelling == "mul_half_first":
        nodes += [mk("Mul", ["h", "isqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["one", "e"], ["a"]),
                  mk("Mul", ["h", "half"], ["hh"]), mk("Mul", ["hh", "a"], ["y"])]
    else:
        nodes += [mk("Div", ["h", "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["a"]),
                  mk("Mul", ["h", "a"], ["p"]), mk("Mul", ["p", "half"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 48])]
    if spelling == "shared_erf":
        outs.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [24, 48]))
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 64])], outs,
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("spelling", ["div", "mul_half_first", "shared_erf"])
def test_recognize_gelu(width: str, spelling: str) -> None:
    """The spelled-out GELU becomes one Gelu node fused into the GEMM (one kernel), and matches onnxruntime to 1e-5
    of the output's scale; with the erf read elsewhere it stays spelled out (and still matches)."""
    model = _gelu_model(spelling)
    feeds = {"x": np.random.default_rng(5).standard_normal((24, 64), dtype=np.float32)}
    check(model, feeds, 1e-5, target=width)
    c = lower(model, resolve("host"), 2, check_options({}), stop_after="kernels")
    gelus = [n for n in c.graph.nodes if n.op == "Gelu"]
    if spelling == "shared_erf":
        assert not gelus
    else:
        assert len(gelus) == 1 and [k.name.split("_", 1)[1] for k in c.program.kernels] == ["packedmatmul"], \
            [k.name for k in c.program.kernels]


# -- attention: the head split read in place, the SDPA scale on the scores ------------------------------------------
class SelfAttention(nn.Module):
    """BERT's self-attention (kiln.zoo.torch_models.BertSelfAttention, small): SDPA on [b, heads, s, d] views."""

    def __init__(self, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)  # noqa: E731
        ctx = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(ctx.transpose(1, 2).reshape(b, s, h))


def test_attention_matches_eager(width: str) -> None:
    torch.manual_seed(1)
    check_module(SelfAttention().eval(), [torch.randn(1, 24, 64)], width)


def test_attention_reads_q_and_v_in_place() -> None:
    """SDPA's q·√scale and k·√scale move to the scores (scale_after_matmul: one multiply in the bmm's epilogue), and
    the bmms read Q and V through their head-split views (kernel/build.py): the only copies left are Kᵀ (strided
    along the scores' vectors) and the context's merge — before, Q·s, Kᵀ·s and V were three copies."""
    torch.manual_seed(1)
    names = [k.name.split("_", 1)[1] for k in _torch_kernels(SelfAttention().eval(), torch.randn(1, 24, 64))]
    assert names.count("transpose") == 2 and "mul" not in names, names
    assert names.count("matmul") == 2 and names.count("packedmatmul") == 4, names


def _onnx_attention() -> onnx.ModelProto:
    """The ONNX exporters' attention core: q, k, v [1, s, H·d] → Reshape [1, s, H, d] → Transpose (k to Kᵀ) →
    MatMul → Div(√d) → Softmax → MatMul → Transpose → Reshape."""
    s, heads, d = 24, 4, 16
    mk = helper.make_node
    consts = {"split": np.array([1, s, heads, d], np.int64), "merge": np.array([1, s, heads * d], np.int64),
              "sqrt_d": np.array(np.sqrt(d), np.float32)}
    nodes = [mk("Reshape", ["q", "split"], ["q4"]), mk("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             mk("Reshape", ["k", "split"], ["k4"]), mk("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             mk("Reshape", ["v", "split"], ["v4"]), mk("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
             mk("MatMul", ["qh", "kt"], ["sc"]), mk("Div", ["sc", "sqrt_d"], ["scd"]),
             mk("Softmax", ["scd"], ["p"], axis=-1), mk("MatMul", ["p", "vh"], ["ctx"]),
             mk("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]), mk("Reshape", ["ct", "merge"], ["y"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, s, heads * d]) for n in "qkv"]
    g = helper.make_graph(nodes, "attn", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, 64])],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_onnx_attention_reads_q_and_v_in_place(width: str) -> None:
    model = _onnx_attention()
    rng = np.random.default_rng(6)
    check(model, {n: rng.standard_normal((1, 24, 64), dtype=np.float32) for n in "qkv"}, 1e-5, target=width)
    names = [k.name.split("_", 1)[1] for k in
             lower(model, resolve("host"), 2, check_options({}), stop_after="kernels").program.kernels]
    assert names.count("transpose") == 2 and names.count("matmul") == 2, names  # Kᵀ and the merge copied


def _onnx_fused_qkv_attention(merged_view: bool) -> onnx.ModelProto:
    """GPT-2's head split: one QKV projection [1, s, 3·H·d], Split into q, k, v, each viewed as [1, s, H, d] and
    transposed, then the attention core of _onnx_attention. `merged_view`: the projection is first viewed as
    [1, s·3·H·d] and back (a chain of views, read through end to end)."""
    s, heads, d = 24, 4, 16
    mk = helper.make_node
    rng = np.random.default_rng(3)
    consts = {"w": (rng.standard_normal((64, 192)) / 8).astype(np.float32),
              "split": np.array([1, s, heads, d], np.int64), "merge": np.array([1, s, heads * d], np.int64),
              "parts": np.array([64, 64, 64], np.int64), "sqrt_d": np.array(np.sqrt(d), np.float32),
              "flat": np.array([1, s * 192], np.int64), "unflat": np.array([1, s, 192], np.int64)}
    nodes = [mk("MatMul", ["x", "w"], ["qkv0"])]
    nodes += [mk("Reshape", ["qkv0", "flat"], ["qkvf"]), mk("Reshape", ["qkvf", "unflat"], ["qkv"])] if merged_view \
        else [mk("Identity", ["qkv0"], ["qkv"])]
    nodes += [mk("Split", ["qkv", "parts"], ["q", "k", "v"], axis=2),
              mk("Reshape", ["q", "split"], ["q4"]), mk("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
              mk("Reshape", ["k", "split"], ["k4"]), mk("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              mk("Reshape", ["v", "split"], ["v4"]), mk("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
              mk("MatMul", ["qh", "kt"], ["sc"]), mk("Div", ["sc", "sqrt_d"], ["scd"]),
              mk("Softmax", ["scd"], ["p"], axis=-1), mk("MatMul", ["p", "vh"], ["ctx"]),
              mk("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]), mk("Reshape", ["ct", "merge"], ["y"])]
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, 64])],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("merged_view", [False, True])
def test_head_split_slices_join_their_readers(width: str, merged_view: bool) -> None:
    """The Split's slices are read through their [1, s, H, d] views (kernel/build.py: _through_view): K's slice
    joins the Kᵀ copy, Q's and V's the attention matmuls that read them in place — no slice kernel is left. A view
    that merges axes has no such index (a [256] of [4, 64] element needs a division): not read through."""
    model = _onnx_fused_qkv_attention(merged_view)
    check(model, {"x": np.random.default_rng(7).standard_normal((1, 24, 64), dtype=np.float32)}, 1e-5, target=width)
    names = [k.name.split("_", 1)[1] for k in
             lower(model, resolve(width), 2, check_options({}), stop_after="kernels").program.kernels]
    assert "slice" not in names and "split" not in names and names.count("transpose") == 2, names
    assert names.count("matmul") == 2, names
    i, j = Var("i"), Var("j")
    assert _view_reindex((i, j), (4, 64), (256,)) == (i * 64 + j,)  # split
    assert _view_reindex((Const(0, "int64"), i, j), (1, 4, 64), (4, 64, 1)) == (i, j, Const(0, "int64"))  # unit axes
    assert _view_reindex((i,), (256,), (4, 64)) is None  # merge


def test_scale_after_matmul_numerics(width: str) -> None:
    """MatMul(Mul(a, 0.3), Mul(Reshape(b), 1.7)) = 0.51·MatMul(a, b) to float32 rounding (vs onnxruntime)."""
    mk = helper.make_node
    consts = {"s": np.array(0.3, np.float32), "t": np.array(1.7, np.float32), "shape": np.array([2, 16, 24], np.int64)}
    nodes = [mk("Mul", ["a", "s"], ["as"]), mk("Mul", ["t", "b"], ["bs"]), mk("Reshape", ["bs", "shape"], ["bv"]),
             mk("MatMul", ["as", "bv"], ["y"])]
    g = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 20, 16]),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 384])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 20, 24])],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rng = np.random.default_rng(7)
    check(model, {"a": rng.standard_normal((2, 20, 16), dtype=np.float32),
                  "b": rng.standard_normal((2, 384), dtype=np.float32)}, 1e-5, target=width)
    c = lower(model, resolve("host"), 2, check_options({}), stop_after="kernels")
    assert [n.op for n in c.graph.nodes if n.op in ("Mul", "MatMul")] == ["MatMul", "Mul"]
    assert [k.name.split("_", 1)[1] for k in c.program.kernels] == ["matmul"]
