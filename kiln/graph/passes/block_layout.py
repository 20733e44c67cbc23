"""Blocked channel layout for chains of convolutions (oneDNN's nChw16c, onnxruntime's NCHWc), chosen once and
propagated, with reorders only where a consumer needs plain NCHW:

    Conv(x[N,C,H,W], W) → Relu → Conv(·, W2) → Add(·, r) → GlobalAveragePool → Flatten
  ⇒ PackedConv(x, Wp, out_block=cb) → Relu → PackedConv(·, Wp2, in_block=cb, out_block=cb) → Add(·, rb)
    → Reduce(mean, axes 2,3) → FromBlocked → Flatten           values in between: xb[N, C/cb, H, W, cb]

cb = NR = two f32 vectors (AVX2 16, AVX-512 32) — one vector where that does not divide C: one pixel's channel
block is one row of the conv's register tile, so the tile stores its accumulators with plain contiguous stores
(no transpose into NCHW planes) and the pixels it broadcasts come CB input channels to a cache line (in NCHW
every input channel is a plane of its own, and a tile walking Ci touches a line per channel). Depthwise convs in
the layout vectorize over the block.

A value is blocked when its producer is a blocked conv, or an op that does not care where channels live
(elementwise with scalar or per-channel constants, pooling, spatial reductions) reading blocked values. Any
other consumer — and a graph output — gets FromBlocked, once per value. Channel counts that no block divides
stay NCHW: padded channels would be computed too, and an op like Div or Log could turn them into NaN that a
following conv multiplies by its zero weights. Convs built by a library call stay NCHW (the library takes plain
operands), and only fixed-width targets block their float convs (a scalable target's block would have to follow
its run-time vector length); on AArch64's scalable targets (SVE, SME) the int8 convs block, and the bf16 ones where
the target has BF16, in NEON-width blocks for the NEON tile they run there (schedule/int8.py, schedule/bf16.py)."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import OPS, infer
from kiln.graph.passes.pack_weights import pack
from kiln.graph.quant_pack import (
    INT8_K_GROUP,
    depthwise_quads,
    dot_group,
    int8_channel_block,
    pack_depthwise,
    pack_depthwise_quads,
    pack_qconv_blocked,
)
from kiln.strategy import strategy_of
from kiln.target import Target, features_on

SPATIAL_REDUCE_KINDS = ("mean", "sum", "max", "min")
# the strategies whose schedules take blocked operands: direct emission and the microkernel nest (whose panel
# index is then the channel block, schedule/ukernel.py); a library call wants plain NCHW
BLOCKED_STRATEGIES = ("direct", "ukernel")
# a dense conv whose reduction (Ci·kh·kw multiply-adds per output) is at least this long reorders an NCHW input
# into blocks and writes blocked output even where it must be reordered back: both reorders are a few
# memory passes over tensors the conv reads ≥ 256 times (conv_r50_3x3 alone: 1.40 → 1.27 ms)
REORDER_MIN_REDUCTION = 256


def channel_block(c: int, target: Target) -> int:
    """The block of a C-channel tensor: the register tile's NR (two f32 vectors) where it divides C, else one
    vector (MobileNetV2's 24 channels on AVX2: blocks of 8), else 0 (the tensor stays NCHW)."""
    lanes = target.lanes(32)
    return next((cb for cb in (2 * lanes, lanes) if c % cb == 0), 0)


def pack_blocked_conv(w: np.ndarray, nr: int, in_block: int, depthwise: bool) -> np.ndarray:
    """Conv weights W[Co, Ci, kh, kw] in the order a blocked tile reads them:
    depthwise Wd[C/nr, kh, kw, nr]; blocked input Wp[Co/nr, Ci/cb, kh, kw, cb, nr] (per CB input channels, the
    taps, then the block's channels: the tile's reduction order); NCHW input Wp[Co/nr, Ci, kh, kw, nr]."""
    co, ci, kh, kw = w.shape
    if depthwise:
        return np.ascontiguousarray(w.reshape(co // nr, nr, kh, kw).transpose(0, 2, 3, 1))
    if in_block:
        panels = -(-co // nr)  # an NCHW output's last panel is zero-padded
        wpad = w
        if co % nr:
            wpad = np.zeros((panels * nr,) + w.shape[1:], w.dtype)
            wpad[:co] = w
        return np.ascontiguousarray(wpad.reshape(panels, nr, ci // in_block, in_block, kh, kw)
                                    .transpose(0, 2, 4, 5, 3, 1))
    return pack(w.reshape(co, -1).T, nr).reshape((co // nr,) + w.shape[1:] + (nr,))


def _blocked_const(g: Graph, v: Value, out_shape: tuple[int, ...], cb: int) -> Value | None:
    """A constant operand of a blocked elementwise op: a scalar stays as it is, a per-channel vector (numpy-
    broadcast over N, H, W) becomes [1, C/cb, 1, 1, cb]; anything else cannot follow the layout."""
    if v.const is None or len(v.shape) > len(out_shape):
        return None
    if v.const.size == 1:
        return v
    shape = (1,) * (len(out_shape) - len(v.shape)) + v.shape
    c = out_shape[1]
    if shape[1] != c or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    arr = v.const.reshape(1, c // cb, cb)
    arr = np.ascontiguousarray(arr.reshape((1, c // cb) + (1,) * (len(out_shape) - 2) + (cb,)))
    return Value(g.fresh(v.name + ".blocked"), TensorType(v.dtype, arr.shape), const=arr)


def _conv(g: Graph, n: Node, xb: Value | None, target: Target, block_out: bool, group: int
          ) -> tuple[Node, bool] | None:
    """The PackedConv for a Conv (its input blocked or not), and whether its output is blocked (only with
    block_out); the QPackedConv for an integer QConv (graph/passes/quantize_qdq.py), blocked in and out."""
    if n.op == "QConv":
        return _qconv(g, n, xb, target, group)
    x, w = n.inputs[0], n.inputs[1]
    a = n.attrs
    if (w.const is None or w.dtype != "float32" or len(x.shape) != 4 or strategy_of(a) not in BLOCKED_STRATEGIES
            or (xb is None and x.dtype != "float32")):
        return None
    co, cig = w.shape[0], w.shape[1]
    depthwise = a["group"] > 1 and a["group"] == co == x.shape[1] and cig == 1
    in_block = xb.shape[-1] if xb is not None else 0
    if depthwise:
        if xb is None:
            return None  # an NCHW depthwise conv vectorizes along its rows (kernel/lower.py)
        out_block = in_block  # a depthwise conv keeps its input's layout
    elif a["group"] == 1:
        out_block = channel_block(co, target) if block_out else 0
        if not out_block and not in_block:
            return None  # plain NCHW in and out: pack_weights decides
    else:
        return None
    nr = out_block or 2 * target.lanes(32)  # an NCHW output's panels: two vectors, the last one zero-padded
    wp = pack_blocked_conv(w.const, nr, in_block, depthwise)
    packed = Value(g.fresh(w.name + ".packed"), TensorType("float32", wp.shape), const=wp)
    attrs = {**a, "co": co, "nr": nr, "kernel": tuple(w.shape[2:]), "in_block": in_block, "out_block": out_block}
    return Node("PackedConv", [xb if xb is not None else x, packed] + n.inputs[2:], [], attrs, n.name), bool(out_block)


def _qconv(g: Graph, n: Node, xb: Value | None, target: Target, group: int) -> tuple[Node, bool] | None:
    """An integer QConv blocked in and out (the only layout its dot-product tile and microkernel take; else it stays
    NCHW): dense weights in the VNNI layout, depthwise ones as int8 taps (graph/quant_pack.py). Under a library
    strategy it is blocked too unless that library has an integer GEMM for its activations (`library_conv`: then
    im2col + that GEMM on the NCHW operands, schedule/library.py)."""
    x, w, a = n.inputs[0], n.inputs[1], n.attrs
    if xb is None or w.const is None or len(x.shape) != 4 or library_conv(n):
        return None
    in_block, co = xb.shape[-1], w.shape[0]
    depthwise = a["group"] > 1
    out_block = in_block if depthwise else int8_channel_block(co, target)
    if not out_block or in_block % INT8_K_GROUP:
        return None
    quads = depthwise and depthwise_quads(target, w.shape[3], a["dilations"][1], in_block, x.dtype)
    wp = (pack_depthwise_quads if quads else pack_depthwise)(w.const, out_block) if depthwise else \
        pack_qconv_blocked(w.const, out_block, in_block, group)
    packed = Value(g.fresh(w.name + ".packed"), TensorType(wp.dtype.name, wp.shape), const=wp)
    attrs = {**a, "co": co, "nr": out_block, "kernel": tuple(w.shape[2:]), "in_block": in_block,
             "out_block": out_block, "depthwise": depthwise, "quads": quads}
    return Node("QPackedConv", [xb, packed] + n.inputs[2:], [], attrs, n.name), True


def library_conv(n: Node) -> bool:
    """A dense integer QConv (int32 accumulation) whose library strategy names a library with an integer GEMM for
    its activations: it stays NCHW, for im2col + that GEMM (schedule/library.py)."""
    strategy = strategy_of(n.attrs)
    if not strategy.startswith("library") or n.attrs.get("group", 1) != 1 or n.attrs.get("acc") != "int32":
        return False
    from kiln.library import integer_gemm, library_of
    return bool(integer_gemm(library_of(strategy), n.inputs[0].dtype))


def _heavy(n: Node, target: Target) -> bool:
    """A dense 2-D float conv with a long reduction over channels that a block divides; any integer QConv whose
    channels an 8-bit block divides (its NCHW form has no fast schedule)."""
    x, w = n.inputs[0], n.inputs[1]
    if n.op == "QConv":
        return (n.attrs["group"] == 1 and len(x.shape) == 4 and w.const is not None and not library_conv(n)
                and int8_channel_block(x.shape[1], target) > 0
                and int8_channel_block(w.shape[0], target) > 0)
    return (n.attrs["group"] == 1 and len(x.shape) == 4 and x.dtype == w.dtype == "float32" and w.const is not None
            and strategy_of(n.attrs) in BLOCKED_STRATEGIES and channel_block(x.shape[1], target) > 0
            and channel_block(w.shape[0], target) > 0 and int(np.prod(w.shape[1:])) >= REORDER_MIN_REDUCTION)


def _layout_agnostic(g: Graph, n: Node, twin: dict[int, Value]) -> Node | None:
    """The same op on blocked operands, when n does not care where channels live and reads a blocked value."""
    kind = OPS[n.op].kind
    blocked = [twin[id(v)] for v in n.inputs if id(v) in twin]
    if not blocked:
        return None
    cb = blocked[0].shape[-1]
    if kind in ("unary", "binary"):
        out_shape = n.outputs[0].shape
        ins: list[Value] = []
        for v in n.inputs:
            if id(v) in twin:
                if v.shape != out_shape:
                    return None
                ins.append(twin[id(v)])
            else:
                c = _blocked_const(g, v, out_shape, cb)
                if c is None:
                    return None
                ins.append(c)
        return Node(n.op, ins, [], dict(n.attrs), n.name)
    x = n.inputs[0]
    if n.op == "Pool" and len(n.attrs["kernel"]) == 2 and len(x.shape) == 4:
        return Node("Pool", [twin[id(x)]], [], dict(n.attrs), n.name)
    if n.op == "Reduce" and n.attrs["kind"] in SPATIAL_REDUCE_KINDS and n.attrs["keepdims"] \
            and set(n.attrs["axes"]) <= {2, 3} and len(x.shape) == 4:
        return Node("Reduce", [twin[id(x)]], [], dict(n.attrs), n.name)
    return None


def _worth_blocking(g: Graph) -> set[int]:
    """Values from which a Conv, a pooling or a spatial reduction can be reached through elementwise ops: there
    a blocked layout saves a reorder, or moves it after the reduction (a lone conv writing an NCHW graph output
    gains nothing from a blocked output)."""
    users = g.consumers()
    out: set[int] = set()
    for n in reversed(g.nodes):
        for v in n.outputs:
            for u in users.get(id(v), []):
                if u.op in ("Conv", "QConv", "Pool", "Reduce") or OPS[u.op].kind in ("unary", "binary") \
                        and any(id(w) in out for w in u.outputs):
                    out.add(id(v))
    return out


def block_layout(g: Graph, target: Target, options: dict[str, bool] | None = None) -> Graph:
    if not target.fixed_dot_tiles:  # RVV: nothing blocks
        return g
    # a scalable target (SVE/SME) blocks only the convs that run the NEON tile there: int8, and bf16 with BF16
    neon_only = target.scalable
    bf16_tile = neon_only and "bf16" in features_on(target.features)
    wanted = _worth_blocking(g)
    group = dot_group(target, options)  # the integer weights' k-group (graph/quant_pack.py)
    twin: dict[int, Value] = {}    # id(NCHW value) → the blocked value computed instead
    made: set[int] = set()         # NCHW values rebuilt from their twins
    nodes: list[Node] = []

    def plain(v: Value) -> None:
        """Make NCHW `v` exist again (FromBlocked of its blocked twin), once."""
        if id(v) in twin and id(v) not in made:
            node = Node("FromBlocked", [twin[id(v)]], [v], {}, f"{v.name}.from_blocked")
            v.producer = node
            nodes.append(node)
            made.add(id(v))

    for n in g.nodes:
        y = n.outputs[0]
        new: Node | None = None
        out_blocked = True
        neon_conv = bf16_tile and n.attrs.get("precision") == "bf16"
        if n.op == "QConv" or (n.op == "Conv" and (not neon_only or neon_conv)):
            x = n.inputs[0]
            pair_block = n.attrs.get("pair_block", 0)  # graph/passes/pad_pair_channels.py: a bf16 RGB stem
            heavy = bool(pair_block) or _heavy(n, target)
            if heavy and id(x) not in twin:  # reorder the NCHW input once (other convs reading x use it too)
                xb = Value(g.fresh(x.name + ".blocked"), TensorType(x.dtype, ()), producer=None)
                cb = int8_channel_block(x.shape[1], target) if n.op == "QConv" else \
                    pair_block or channel_block(x.shape[1], target)
                node = Node("ToBlocked", [x], [xb], {"cb": cb}, f"{x.name}.to_blocked")
                (xb.type,) = infer("ToBlocked", [x.type], node.attrs, node.name)
                xb.producer = node
                nodes.append(node)
                twin[id(x)] = xb
                made.add(id(x))  # x itself stays (it is the NCHW original)
            conv = _conv(g, n, twin.get(id(x)), target, id(y) in wanted or heavy, group)
            if conv is not None:
                new, out_blocked = conv
        elif len(n.outputs) == 1:
            new = _layout_agnostic(g, n, twin)
        if new is None:
            for v in n.inputs:
                plain(v)
            nodes.append(n)
            continue
        if out_blocked:
            (t,) = infer(new.op, [v.type for v in new.inputs], new.attrs, new.name)
            yb = Value(g.fresh(y.name + ".blocked"), t, producer=new)
            new.outputs = [yb]
            twin[id(y)] = yb
            y.producer = None
        else:
            new.outputs = [y]
            y.producer = new
        nodes.append(new)
    for v in g.outputs:
        plain(v)
    g.nodes = nodes
    return g
