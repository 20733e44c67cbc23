"""Vision models in the style of their reference implementations: a ViT (patch conv, class token, pre-LN encoder),
a Swin transformer (window partition, shifted windows with their attention mask, relative position bias, patch
merging), a ConvNeXt (depthwise 7×7, channels-last LayerNorm and GELU, layer scale), a MobileViT (MobileNetV2
blocks, unfold into patches → transformer → fold) and a MobileNetV2 with TensorFlow "same" padding (an explicit
pad before every conv, 1×1 ones included, as TF ports compute it)."""
from __future__ import annotations

import torch
from torch import nn

IMAGE = 64


def image_input(size: int = IMAGE) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3)),)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), act(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """timm-style fused qkv attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, act: type[nn.Module] = nn.GELU, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=1e-6), MLP(dim, int(dim * mlp_ratio), act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# -- ViT -------------------------------------------------------------------------------------------------------------
class ViT(nn.Module):
    def __init__(self, dim: int = 128, depth: int = 2, heads: int = 4, patch: int = 16, classes: int = 100) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        n = (IMAGE // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


# -- Swin ------------------------------------------------------------------------------------------------------------
def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, c)


def window_reverse(windows: torch.Tensor, ws: int, h: int, w: int) -> torch.Tensor:
    c = windows.shape[-1]
    x = windows.view(-1, h // ws, w // ws, ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, h, w, c)


class WindowAttention(nn.Module):
    def __init__(self, dim: int, ws: int, heads: int) -> None:
        super().__init__()
        self.ws, self.heads, self.scale = ws, heads, (dim // heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.randn((2 * ws - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1
        rel[:, :, 1] += ws - 1
        rel[:, :, 0] *= 2 * ws - 1
        self.register_buffer("relative_position_index", rel.sum(-1), persistent=False)
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        bw, n, c = x.shape
        qkv = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(n, n, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(bw, n, c)
        return self.proj(x)


class SwinBlock(nn.Module):
    def __init__(self, dim: int, res: int, heads: int, ws: int, shift: int) -> None:
        super().__init__()
        self.res, self.ws, self.shift = res, ws, shift
        self.norm1, self.attn = nn.LayerNorm(dim), WindowAttention(dim, ws, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, 4 * dim)
        mask = None
        if shift:
            img = torch.zeros(1, res, res, 1)
            cnt = 0
            for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img[:, hs, wsl, :] = cnt
                    cnt += 1
            mw = window_partition(img, ws).view(-1, ws * ws)
            mask = mw.unsqueeze(1) - mw.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, c = x.shape
        h = w = self.res
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = window_partition(x, self.ws).view(-1, self.ws * self.ws, c)
        win = self.attn(win, self.attn_mask).view(-1, self.ws, self.ws, c)
        x = window_reverse(win, self.ws, h, w)
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = shortcut + x.view(b, h * w, c)
        return x + self.mlp(self.norm2(x))


class PatchMerging(nn.Module):
    def __init__(self, dim: int, res: int) -> None:
        super().__init__()
        self.res = res
        self.norm, self.reduction = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        x = x.view(b, self.res, self.res, c)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x.view(b, -1, 4 * c)))


class Swin(nn.Module):
    def __init__(self, dim: int = 64, heads: tuple[int, int] = (2, 4), ws: int = 4, patch: int = 4,
                 classes: int = 100) -> None:
        super().__init__()
        res = IMAGE // patch
        self.patch_embed, self.patch_norm = nn.Conv2d(3, dim, patch, patch), nn.LayerNorm(dim)
        self.stage1 = nn.Sequential(SwinBlock(dim, res, heads[0], ws, 0), SwinBlock(dim, res, heads[0], ws, ws // 2))
        self.merge = PatchMerging(dim, res)
        res //= 2
        self.stage2 = nn.Sequential(SwinBlock(2 * dim, res, heads[1], ws, 0),
                                    SwinBlock(2 * dim, res, heads[1], ws, ws // 2))
        self.norm, self.head = nn.LayerNorm(2 * dim), nn.Linear(2 * dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_norm(self.patch_embed(x).flatten(2).transpose(1, 2))
        x = self.stage2(self.merge(self.stage1(x)))
        return self.head(self.norm(x).mean(1))


# -- ConvNeXt --------------------------------------------------------------------------------------------------------
class LayerNormChannelsFirst(nn.Module):
    """ConvNeXt's LayerNorm over the channels of an NCHW tensor (mean, squared deviation, rsqrt by hand)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW → NHWC
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims: tuple[int, int] = (64, 128), classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNormChannelsFirst(dims[0]))
        self.stage1 = nn.Sequential(ConvNeXtBlock(dims[0]), ConvNeXtBlock(dims[0]))
        self.down = nn.Sequential(LayerNormChannelsFirst(dims[0]), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = nn.Sequential(ConvNeXtBlock(dims[1]), ConvNeXtBlock(dims[1]))
        self.norm, self.head = nn.LayerNorm(dims[1], eps=1e-6), nn.Linear(dims[1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean([-2, -1])))


# -- MobileViT -------------------------------------------------------------------------------------------------------
def conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.SiLU()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(conv_bn(cin, hid), conv_bn(hid, hid, 3, stride, groups=hid),
                                   conv_bn(hid, cout, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class MobileViTBlock(nn.Module):
    """local 3×3 + 1×1 convs → unfold into 2×2 patches → transformer over each patch position → fold → fuse."""

    def __init__(self, channels: int, dim: int, depth: int = 2, patch: int = 2) -> None:
        super().__init__()
        self.ph = self.pw = patch
        self.local = nn.Sequential(conv_bn(channels, channels, 3), nn.Conv2d(channels, dim, 1, bias=False))
        self.transformer = nn.Sequential(*(Block(dim, 4, nn.SiLU, 2.0) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.proj = conv_bn(dim, channels)
        self.fusion = conv_bn(2 * channels, channels, 3)

    def unfold(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
        b, c, h, w = x.shape
        nh, nw = h // self.ph, w // self.pw
        x = x.reshape(b * c * nh, self.ph, nw, self.pw).transpose(1, 2)
        x = x.reshape(b, c, nh * nw, self.ph * self.pw).transpose(1, 3)
        return x.reshape(b * self.ph * self.pw, nh * nw, c), (b, c, nh, nw)

    def fold(self, x: torch.Tensor, info: tuple[int, int, int, int]) -> torch.Tensor:
        b, c, nh, nw = info
        x = x.contiguous().view(b, self.ph * self.pw, nh * nw, c).transpose(1, 3)
        x = x.reshape(b * c * nh, nw, self.ph, self.pw).transpose(1, 2)
        return x.reshape(b, c, nh * self.ph, nw * self.pw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, info = self.unfold(self.local(x))
        y = self.proj(self.fold(self.norm(self.transformer(y)), info))
        return self.fusion(torch.cat((x, y), 1))


class MobileViT(nn.Module):
    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2)
        self.layer1 = nn.Sequential(InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2),
                                    InvertedResidual(24, 24, 1))
        self.layer2 = nn.Sequential(InvertedResidual(24, 48, 2), MobileViTBlock(48, 64))
        self.layer3 = nn.Sequential(InvertedResidual(48, 64, 2), MobileViTBlock(64, 80))
        self.head = nn.Sequential(conv_bn(64, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer3(self.layer2(self.layer1(self.stem(x)))))


# -- MobileNetV2 with TensorFlow "same" padding ----------------------------------------------------------------------
def tf_pad(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """TF's SAME padding, computed from the input size as TF ports do (a Pad node before every conv)."""
    h, w = x.shape[-2:]
    sh, sw = conv.stride
    kh, kw = conv.kernel_size
    ph = max(kh - sh, 0) if h % sh == 0 else max(kh - h % sh, 0)
    pw = max(kw - sw, 0) if w % sw == 0 else max(kw - w % sw, 0)
    return nn.functional.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), "constant", 0.0)


class TFConv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, 0, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.act = nn.ReLU6() if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(tf_pad(x, self.conv))))


class TFInvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 6) -> None:
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.block = nn.Sequential(TFConv(cin, hid), TFConv(hid, hid, 3, stride, hid), TFConv(hid, cout, act=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetTF(nn.Module):
    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        cfg = [(16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]
        self.stem = TFConv(3, 16, 3, 2)
        self.blocks = nn.Sequential(*(TFInvertedResidual(i, o, s) for i, o, s in cfg))
        self.last = TFConv(64, 256)
        self.head = nn.Linear(256, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.last(self.blocks(self.stem(x))).mean([-2, -1]))


def init_norms(m: nn.Module) -> None:
    """Random BatchNorm statistics (fresh ones are the identity) so folding them is exercised."""
    g = torch.Generator().manual_seed(5)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) * 0.5 + 0.75)
            mod.weight.data.copy_(torch.rand(mod.num_features, generator=g) * 0.5 + 0.75)
            mod.bias.data.copy_(torch.randn(mod.num_features, generator=g) * 0.1)

