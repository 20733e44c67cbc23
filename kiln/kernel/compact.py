"""compact_trailing: an intermediate whose last dim is symbolic — attention's scores and probabilities,
[b, h, seq, seq], and a transposed key, Kᵀ [b, h, d, seq] — laid out with its rows `seq` apart, not the upper
bound's 512.

A symbolic model's buffers are planned in their max layouts (kernel/dynamic.py): a dim's stride is its upper bound's,
whatever the actual size, so a [b, s, 768] activation at s = 77 is the first 77 rows of a 512-row block — dense rows,
each contiguous. A buffer whose last dim is symbolic is not: at seq = 200 each 800-byte row of a [seq, seq] block
sits 2 KiB from the next. Softmax and the two attention matmuls then stream 2.5× the lines they use (the hardware
prefetchers run on past each row's end) and the rows collide in a few L1 sets; gpt_decoder's softmax ran 2–2.7× its
static build at 4×200 tokens. At a few tokens Kᵀ's 64 rows per head, each a few floats, sit on 64 lines 2 KiB apart
(half as many pages) where the static build's fill one or two lines: compacting Kᵀ too took gpt_decoder's 3-token
steps 0.84–0.87× and its 1-token steps 0.93–0.95× (bert_base_dynamic at 4×3 0.90×), equal from 16 tokens up (Zen 5,
one interleaved A/B run).

So such a buffer's last two axes become one of the bound's size (512·512, 64·512), indexed `i·seq + j` with `seq`
the actual run-time extent: the same storage (the arena plans the bound), its rows packed. Only buffers every reader
and writer of is a kernel of this program: not graph inputs or outputs (their layouts are the caller's), not views
or the values views alias (a view's consumer indexes the shared storage with its own shape), not constants.

    before:  scores: float32[4, 4, 512, 512]      b2[b, h, i, j]          (row pitch 512)
    after:   scores: float32[4, 4, 262144]        b2[b, h, i·${seq} + j]  (row pitch seq)"""
from __future__ import annotations

from kiln.graph.symbolic import is_static
from kiln.kernel.build import Program, _replace_loads
from kiln.kernel.ir import Buffer, Compute, Expr, Load


def compact_trailing(prog: Program) -> list[str]:
    """Rewrite, in place, every kernel's accesses to such buffers; returns their names."""
    dims = prog.dims
    if dims is None or dims.split is not None:  # split per sample: every kernel keeps its static schedule
        return []
    io = {v.name for v in prog.graph.inputs} | {v.name for v in prog.graph.outputs}
    aliased = set(prog.view_of) | set(prog.view_of.values())
    pitch: dict[str, Expr] = {}
    for name, shape in dims.shapes.items():
        if name in io or name in aliased or name in prog.consts or name not in prog.buffers:
            continue
        if len(shape) >= 2 and not is_static(shape[-1]):
            pitch[name] = dims.expr(shape[-1])
    if not pitch:
        return []
    for name in pitch:
        prog.buffers[name] = _merged(prog.buffers[name])
    for k, names in zip(prog.kernels, prog.bindings):
        local = {f"b{i}": pitch[n] for i, n in enumerate(names) if n in pitch}  # make_kernel's b0..bn
        if not local:
            continue
        k.args = [_merged(b) if b.name in local else b for b in k.args]
        k.scratch = [_merged(b) if b.name in local else b for b in k.scratch]
        k.computes = [_rewrite(c, local) for c in k.computes]
    return sorted(pitch)


def _merged(b: Buffer) -> Buffer:
    return Buffer(b.name, b.dtype, tuple(b.shape[:-2]) + (int(b.shape[-2]) * int(b.shape[-1]),))


def _index(index: tuple[Expr, ...], row: Expr) -> tuple[Expr, ...]:
    return tuple(index[:-2]) + (index[-2] * row + index[-1],)


def _rewrite(c: Compute, local: dict[str, Expr]) -> Compute:
    def loads(e: Expr) -> Expr:
        for buf, row in local.items():
            e = _replace_loads(e, buf, lambda ld, row=row: Load(ld.buf, _index(ld.index, row), ld.dtype))
        return e
    store, hints = c.store, c.hints
    if c.out in local:
        store = _index(c.store_index, local[c.out])
        if c.store is None:  # the axes, merged: a register tile may still store it (tile_shape.choose_tile)
            hints = {**hints, "compact_store": True}
    if store is not None:
        store = tuple(loads(e) for e in store)
    return Compute(c.out, c.axes, c.extents, loads(c.body), store, hints)
