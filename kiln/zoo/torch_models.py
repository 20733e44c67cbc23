"""ResNet-50, MobileNetV2 and a BERT-base encoder written with torch.nn (torchvision cannot be installed beside
torch 2.13.0 here), with seeded random weights — the PyTorch twins of kiln.zoo's ONNX resnet50, mobilenetv2 and
bert_base, for the torch.compile benchmarks (`kiln bench --workloads torch_resnet50,...`).

    >>> module, inputs = build("torch_resnet50")   # an nn.Module in eval(), a tuple of input tensors

BatchNorm running statistics come from one calibration batch pushed through the network in training mode
(cumulative averages), the way training leaves them, then gamma/beta are drawn at random: activations stay O(1)
through every network, which keeps relative-error comparisons meaningful. Importing this module imports torch."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

IMAGE_SHAPE = (1, 3, 224, 224)


# -- ResNet-50 (torchvision's v1.5 layout: the stride on the 3x3 conv of each bottleneck) ---------------------------
class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            stage = []
            for i in range(blocks):
                stage.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * Bottleneck.expansion
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# -- MobileNetV2 ----------------------------------------------------------------------------------------------------
def conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU6())


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn_relu6(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # expansion, channels, repeats, first stride

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers, cin = [conv_bn_relu6(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn_relu6(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# -- BERT-base encoder (no embeddings, no pooler, no attention mask: the stack kiln.zoo's bert_base is) ----------------
class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.output = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)  # noqa: E731
        ctx = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                             attn_mask=mask)
        return self.output(ctx.transpose(1, 2).reshape(b, s, h))


class BertLayer(nn.Module):
    def __init__(self, hidden: int = 768, heads: int = 12, intermediate: int = 3072) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.attention_norm(x + self.attention(x, mask))
        return self.output_norm(h + self.down(F.gelu(self.up(h))))


class BertEncoder(nn.Module):
    def __init__(self, layers: int = 12, hidden: int = 768, heads: int = 12, intermediate: int = 3072) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


# -- weights -----------------------------------------------------------------------------------------------------------
def calibrate_batchnorm(module: nn.Module, x: torch.Tensor, seed: int) -> None:
    """Running statistics from one calibration batch (cumulative average), then gamma ~ U(0.5, 1.5) and
    beta ~ N(0, 0.1): the network's activations stay O(1) and a wrong Conv+BN fold still shows."""
    g = torch.Generator().manual_seed(seed)
    bns = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    module.train()
    with torch.no_grad():
        module(x)
        for bn in bns:
            bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) + 0.5)
            bn.bias.copy_(torch.randn(bn.bias.shape, generator=g) * 0.1)
    module.eval()


def bert_init(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.02)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.2 + 0.9)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.02)


INPUT_SHAPES: dict[str, tuple[int, ...]] = {"torch_resnet50": IMAGE_SHAPE, "torch_mobilenetv2": IMAGE_SHAPE,
                                          "torch_bert_base": (1, 128, 768)}


def _input(name: str, seed: int) -> torch.Tensor:
    return torch.randn(INPUT_SHAPES[name], generator=torch.Generator().manual_seed(seed + 2))


def _vision(cls: type[nn.Module], seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = cls()
    calibrate_batchnorm(m, torch.randn((4,) + IMAGE_SHAPE[1:], generator=torch.Generator().manual_seed(seed + 1)),
                        seed)
    return m


def _bert(seed: int) -> nn.Module:
    m = BertEncoder()
    bert_init(m, seed)
    return m.eval()


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "torch_resnet50": lambda seed: _vision(ResNet50, seed),
    "torch_mobilenetv2": lambda seed: _vision(MobileNetV2, seed),
    "torch_bert_base": _bert,
}


def names() -> list[str]:
    return list(MODELS)


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(module in eval mode, example inputs); the same (name, seed) always gives the same weights and inputs."""
    if name not in MODELS:
        raise KeyError(f"unknown torch model {name!r}; valid names: {', '.join(MODELS)}")
    return MODELS[name](seed), (_input(name, seed),)


def example_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """The inputs of `build(name, seed)` by the forward's argument name, without building the model."""
    if name not in MODELS:
        raise KeyError(f"unknown torch model {name!r}; valid names: {', '.join(MODELS)}")
    return {"x": _input(name, seed).numpy()}
