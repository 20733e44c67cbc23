"""Small torch.nn modules covering the Core ATen ops the torch frontend imports, and the check the torch tests
share: compile with backend="kiln", run, compare with eager PyTorch.

Tolerance form (as tests/conftest.py's): for every float output, max|kiln − eager| ≤ rtol · max(max|eager|, 1e-6)
with rtol = 1e-4; integer and bool outputs equal."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import kiln
import kiln.torch
from conftest import width_runs

RTOL = 1e-4
TINY = 1e-6


def assert_matches(got: Any, want: Any, rtol: float = RTOL, what: str = "output") -> None:
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"{what}: {type(got)} vs {type(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_matches(g, w, rtol, f"{what}[{i}]")
        return
    assert isinstance(got, torch.Tensor), f"{what}: {type(got).__name__}, eager gives a tensor"
    assert got.shape == want.shape, f"{what}: shape {list(got.shape)}, eager {list(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, eager {want.dtype}"
    g, w = got.detach().numpy(), want.detach().numpy()
    if not w.dtype.kind == "f":
        assert np.array_equal(g, w), f"{what}: {int((g != w).sum())} of {w.size} elements differ"
        return
    assert np.array_equal(np.isnan(g), np.isnan(w)), f"{what}: NaNs in different places"
    ok = np.isfinite(w)
    assert np.array_equal(g[~ok & ~np.isnan(w)], w[~ok & ~np.isnan(w)]), f"{what}: infinities differ"
    if not ok.any():
        return
    err = float(np.abs(g[ok].astype(np.float64) - w[ok]).max())
    scale = max(float(np.abs(w[ok]).max()), TINY)
    assert err <= rtol * scale, f"{what}: max|kiln − eager| = {err:.3g} > {rtol:g} × {scale:.3g}"


def clone_inputs(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x.clone() for x in xs]


def check_module(module: nn.Module, inputs: Sequence[torch.Tensor], width: str | None = None,
                 fullgraph: bool = True, **options: Any) -> Any:
    """torch.compile(module, backend="kiln") for `width` (None: the host's), run on copies of the inputs, compare
    with eager (outputs, and inputs an in-place op wrote to). A width this CPU cannot execute is lowered and its
    object emitted instead (as conftest.emit_only does for ONNX models)."""
    module.eval()
    opts = {"threads": 2, "cache": False, **options}
    if width is not None:
        opts["target"] = width
        if not width_runs(width):
            return emit_compiled(module, inputs, width, fullgraph)
    eager_in, kiln_in = clone_inputs(inputs), clone_inputs(inputs)
    with torch.no_grad():
        want = module(*eager_in)
        compiled = torch.compile(module, backend="kiln", fullgraph=fullgraph, options=opts)
        got = compiled(*kiln_in)
    assert_matches(got, want)
    assert_matches(kiln_in, eager_in, what="inputs after the call")
    return got


def emit_compiled(module: nn.Module, inputs: Sequence[torch.Tensor], width: str, fullgraph: bool = True) -> list[bytes]:
    """What torch.compile(backend="kiln") would build for `width`, lowered and emitted, the module then run eagerly:
    dynamo's graphs traced as the backend traces them (AOTAutograd, so an in-place op on an input is a functional
    output written back — torch.export refuses it), partitioned, each Kiln partition lowered to an object."""
    from kiln.compiler import lower
    from kiln.frontend.torch import AtenProgram
    from kiln.target import resolve
    from kiln.torch.dynamo import _frozen
    from kiln.torch.partition import partition
    from kiln.torch.trace import aot_core_aten

    objs: list[bytes] = []

    def lower_only(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        traced = aot_core_aten(gm, list(example_inputs), _frozen(example_inputs))
        part = partition(traced.gm, None)
        for name in part.kiln:
            c = lower(AtenProgram(getattr(part.gm, name)), resolve(width), 2, {}, stop_after="object")
            assert c.obj[:4] == b"\x7fELF", f"{width}: no ELF object emitted"
            objs.append(c.obj)
        return gm.forward

    torch._dynamo.reset()  # dynamo's caches: a graph seen before would not reach this backend
    with torch.no_grad():
        torch.compile(module, backend=lower_only, fullgraph=fullgraph)(*clone_inputs(inputs))
    assert objs, f"{width}: no Kiln partition lowered"
    return objs


def emit_module(module: nn.Module, inputs: Sequence[torch.Tensor], width: str) -> bytes:
    from kiln.compiler import lower
    from kiln.frontend.torch import AtenProgram
    from kiln.target import resolve
    from kiln.torch.trace import export_core_aten

    with torch.no_grad():
        gm = export_core_aten(module, tuple(inputs))
    c = lower(AtenProgram(gm), resolve(width), 2, {}, stop_after="object")
    assert c.obj[:4] == b"\x7fELF", f"{width}: no ELF object emitted"
    return c.obj


# -- the modules -----------------------------------------------------------------------------------------------------
class ConvNetBN(nn.Module):
    """Convs with BatchNorm (folded by Kiln), a depthwise conv, pooling of every kind, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU6())
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.up = nn.ConvTranspose2d(32, 8, 2, stride=2)
        self.fc = nn.Linear(32 + 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.stem(x)) + self.stem(x)
        y = F.max_pool2d(y, 3, 1, 1)
        z = F.relu(self.bn(self.down(y)))
        u = F.avg_pool2d(self.up(z), 3, 2, 1, ceil_mode=True, count_include_pad=False)
        head = torch.cat([F.adaptive_avg_pool2d(z, 1).flatten(1), u.mean((2, 3))], 1)
        return F.log_softmax(self.fc(head), -1)


class TransformerBlock(nn.Module):
    """Pre-norm attention block: SDPA with is_causal, and the same with an explicit causal mask."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attend(self, x: torch.Tensor, explicit_mask: bool) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if explicit_mask:
            causal = torch.ones(s, s, dtype=torch.bool).triu(1)
            scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
            ctx = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        else:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outs = []
        for explicit in (False, True):
            h = x + self.attend(x, explicit)
            outs.append(h + self.mlp(self.norm2(h)))
        return outs[0], outs[1]


class MLP(nn.Module):
    """Linear layers between every activation Kiln imports."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(24, 24) for _ in range(4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.relu(self.layers[0](x))
        b = F.silu(self.layers[1](a)) + torch.tanh(a) - torch.sigmoid(a) * F.hardswish(a)
        c = F.leaky_relu(self.layers[2](b), 0.1) + F.elu(b) + F.softplus(b) + F.gelu(b, approximate="tanh")
        d = torch.clamp(self.layers[3](c), -0.5, 0.5) + F.hardtanh(c) + F.mish(c)
        return d.softmax(-1), torch.exp(d) * torch.rsqrt(c * c + 1) + torch.abs(d) ** 2, F.relu6(d * 4)


class Norms(nn.Module):
    """BatchNorm1d/2d, LayerNorm, GroupNorm, InstanceNorm, RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.bn1, self.bn2 = nn.BatchNorm1d(8), nn.BatchNorm2d(8)
        self.ln, self.gn = nn.LayerNorm([6, 6]), nn.GroupNorm(4, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.rms = nn.RMSNorm(6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.bn1(x.flatten(2)), self.bn2(x), self.ln(x), self.gn(x), self.inorm(x), self.rms(x))


class InPlace(nn.Module):
    """In-place ops (functionalized): on intermediates, on a slice, and on the input itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1).mul_(0.5)
        y.relu_()
        y[:, 0] = 3.0
        y[:, 2:4] += 1
        y.clamp_(max=2.5)
        x.mul_(2)  # written back into the caller's tensor
        return y + x


class ViewsSlicing(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x.reshape(8, 6, 5).permute(2, 0, 1).transpose(0, 2)
        b = x[:, 1:5:2, ..., -1] + x.narrow(1, 0, 2)[..., 0]
        c, d = x.chunk(2, dim=1)
        e = torch.cat([c, d.flip(-1)], dim=-1)
        f = torch.stack(x.unbind(0), dim=2).flatten(0, 1).unsqueeze(0).squeeze(0)
        g = x[:1].expand(2, -1, -1, -1) + x.split([1, 1, 1, 3], dim=1)[3].repeat(1, 2, 1, 1)[:, :1]
        return a * 2, b, e, f, g, x.t() if x.dim() == 2 else x.mT


class WhereMask(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.where(x > y, x, y)
        b = x.masked_fill(m, -1.0)
        c = torch.where(m, 0.0, y)
        x2 = x.clone()
        x2[x2 < 0] = 0.5
        return a, b, c, x2, (x > 0) & ~m, (x == y) | (y >= 0.5)


class Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(50, 16), nn.Embedding(12, 16)
        self.register_buffer("positions", torch.arange(12))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.tok(ids) + self.pos(self.positions)
        picked = torch.index_select(x, 1, ids[0, :4] % 5)
        picked = picked + torch.gather(x, 1, (ids[:, :4] % 5).unsqueeze(-1).expand(-1, -1, 3))
        return h, picked, x[:, ids[1, 2:6] % 5], x[ids[:, :3] % 2, (ids[:, 3:6] % 5) - 5]


class Reductions(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, idx = x.max(dim=1)
        return (x.sum(), x.mean((0, 2), keepdim=True), x.amax(-1), values, idx, x.argmin(2), x.var(1),
                x.std(-1, keepdim=True), torch.logsumexp(x, -1), x.prod(0), (x > 1).any(1), (x > -3).all(),
                x.cumsum(1), x.sum(1, dtype=torch.float32) / x.numel())


class Resample(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.interpolate(x, scale_factor=2, mode="nearest"),
                F.interpolate(x, size=(9, 7), mode="bilinear", align_corners=False),
                F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
                F.pad(x, (1, 2, 0, 1), value=0.5), F.pad(x, (2, 2, 1, 1), mode="reflect"))


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_g(seed))


def _with_bn_stats(m: nn.Module) -> nn.Module:
    """Random BatchNorm statistics and affine parameters (a fresh BN is the identity: a wrong fold would pass)."""
    g = _g(7)
    with torch.no_grad():
        for bn in m.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.copy_(torch.randn(bn.running_mean.shape, generator=g) * 0.3)
                bn.running_var.copy_(torch.rand(bn.running_var.shape, generator=g) + 0.5)
                bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) + 0.5)
                bn.bias.copy_(torch.randn(bn.bias.shape, generator=g) * 0.1)
            elif isinstance(bn, (nn.GroupNorm, nn.LayerNorm, nn.InstanceNorm2d, nn.RMSNorm)) and bn.weight is not None:
                bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) + 0.5)
                if getattr(bn, "bias", None) is not None:
                    bn.bias.copy_(torch.randn(bn.bias.shape, generator=g) * 0.1)
    return m


def _ids(*shape: int, high: int, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_g(seed))


# name → (module factory, inputs factory)
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], list[torch.Tensor]]]] = {
    "convnet_bn": (lambda: _with_bn_stats(ConvNetBN()), lambda: [_randn(2, 3, 12, 12)]),
    "transformer_sdpa_causal": (TransformerBlock, lambda: [_randn(2, 10, 32)]),
    "mlp_activations": (MLP, lambda: [_randn(3, 24)]),
    "normalizations": (lambda: _with_bn_stats(Norms()), lambda: [_randn(2, 8, 6, 6) * 2 + 1]),
    "inplace": (InPlace, lambda: [_randn(3, 6, 4)]),
    "views_slicing": (ViewsSlicing, lambda: [_randn(2, 6, 4, 5)]),
    "where_masked_fill": (WhereMask, lambda: [_randn(4, 5), _randn(4, 5, seed=1), _randn(4, 5, seed=2) > 0]),
    "embeddings_gather": (Embeddings, lambda: [_ids(2, 12, high=50), _randn(2, 5, 3)]),
    "reductions": (Reductions, lambda: [_randn(3, 4, 5)]),
    "resample_pad": (Resample, lambda: [_randn(1, 2, 5, 4)]),
}


def case(name: str) -> tuple[nn.Module, list[torch.Tensor]]:
    make_module, make_inputs = CASES[name]
    torch.manual_seed(0)
    return make_module().eval(), make_inputs()


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    """Each test compiles from scratch (dynamo's per-code caches and recompile limits are per process)."""
    torch._dynamo.reset()
    kiln.torch.reset_stats()
    yield
    torch._dynamo.reset()
