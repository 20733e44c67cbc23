"""torchvision ResNet-18/50 and MobileNetV2, written as the PyTorch ONNX exporter lays them out.

BatchNormalization stays a separate node after every Conv (eval-mode export without folding), so
compilers get to do - or skip - the Conv+BN fold themselves. Weights are random; BN running
statistics come from a calibration image pushed through the network as it is built (see
calib.py), the way training leaves them, so activations stay O(1) all the way to the logits.
"""
from __future__ import annotations

import numpy as np
import onnx

from . import calib
from .builder import GraphBuilder

IMAGE_SHAPE = (1, 3, 224, 224)
NUM_CLASSES = 1000
BN_EPS = 1e-5


class VisionBuilder(GraphBuilder):
    """GraphBuilder that also evaluates the graph on one calibration image, to calibrate BatchNorm.

    `acts` maps tensor names to their float64 [C, H, W] value on that image.
    """

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        # A stream of its own, so the calibration image does not shift the weights' random draws.
        image = np.random.default_rng([seed, 0xCA1B]).standard_normal(IMAGE_SHAPE[1:])
        self.acts: dict[str, np.ndarray] = {"input": image}


def conv(b: GraphBuilder, x: str, name: str, cin: int, cout: int, k: int,
         stride: int = 1, group: int = 1, bias: bool = False, out: str | None = None) -> str:
    """Conv with padding k//2, as every conv in these networks uses; weight is `<name>.weight`."""
    fan_in = (cin // group) * k * k
    inputs = [x, b.kaiming(f"{name}.weight", (cout, cin // group, k, k), fan_in)]
    if bias:
        inputs.append(b.normal(f"{name}.bias", (cout,), 0.1))
    p = k // 2
    return b.op("Conv", name, inputs, out=out, dilations=[1, 1], group=group, kernel_shape=[k, k],
                pads=[p, p, p, p], strides=[stride, stride])


def batchnorm(b: VisionBuilder, x: str, name: str, x_val: np.ndarray) -> str:
    """BN whose running stats are the calibration statistics of its input, perturbed.

    gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1); the running mean is off by N(0, 0.1) standard
    deviations and the running variance by a U(0.5, 1.5) factor, so the output is O(1) but not
    exactly standardised, and a botched Conv+BN fold still shows up in the numbers.
    """
    c = x_val.shape[0]
    gamma = b.uniform(f"{name}.weight", (c,), 0.5, 1.5)
    beta = b.normal(f"{name}.bias", (c,), 0.1)
    mu, var = calib.channel_stats(x_val)
    run_mean = (mu + 0.1 * np.sqrt(var) * b.rng.standard_normal(c)).astype(np.float32)
    run_var = (var * b.rng.uniform(0.5, 1.5, size=c)).astype(np.float32)
    mean = b.const(f"{name}.running_mean", run_mean)
    var_name = b.const(f"{name}.running_var", run_var)
    y = b.op("BatchNormalization", name, [x, gamma, beta, mean, var_name], epsilon=BN_EPS, momentum=0.9)
    b.acts[y] = calib.batchnorm(x_val, b.value(gamma), b.value(beta), run_mean, run_var, BN_EPS)
    return y


def conv_bn(b: VisionBuilder, x: str, conv_name: str, bn_name: str, cin: int, cout: int, k: int,
            stride: int = 1, group: int = 1) -> str:
    y = conv(b, x, conv_name, cin, cout, k, stride, group)
    # The conv's own value is only needed here, so it is not kept in b.acts.
    y_val = calib.conv2d(b.acts[x], b.value(f"{conv_name}.weight"), stride, k // 2, group)
    return batchnorm(b, y, bn_name, y_val)


def relu(b: VisionBuilder, x: str, name: str) -> str:
    y = b.op("Relu", name, [x])
    b.acts[y] = np.maximum(b.acts[x], 0.0)
    return y


def relu6(b: VisionBuilder, x: str, name: str) -> str:
    # Opset >= 11 Clip takes min/max as inputs, not attributes.
    lo = b.const("const.relu6.min", np.array(0.0, dtype=np.float32))
    hi = b.const("const.relu6.max", np.array(6.0, dtype=np.float32))
    y = b.op("Clip", name, [x, lo, hi])
    b.acts[y] = np.clip(b.acts[x], 0.0, 6.0)
    return y


def add(b: VisionBuilder, x: str, y: str, name: str) -> str:
    z = b.op("Add", name, [x, y])
    b.acts[z] = b.acts[x] + b.acts[y]
    return z


def classifier(b: GraphBuilder, x: str, cin: int, fc_name: str = "fc", batch: int | str = 1) -> None:
    """GlobalAveragePool -> Flatten -> Linear, the exporter's rendering of avgpool + flatten + fc."""
    x = b.op("GlobalAveragePool", "avgpool", [x])
    x = b.op("Flatten", "flatten", [x], axis=1)
    b.linear_gemm(x, fc_name, cin, NUM_CLASSES, out="logits")
    b.output("logits", (batch, NUM_CLASSES))


# ---- ResNet -------------------------------------------------------------------------------------


def basic_block(b: VisionBuilder, x: str, p: str, cin: int, planes: int, stride: int) -> str:
    y = relu(b, conv_bn(b, x, f"{p}.conv1", f"{p}.bn1", cin, planes, 3, stride), f"{p}.relu1")
    y = conv_bn(b, y, f"{p}.conv2", f"{p}.bn2", planes, planes, 3)
    return residual(b, x, y, p, cin, planes, stride)


def bottleneck(b: VisionBuilder, x: str, p: str, cin: int, planes: int, stride: int) -> str:
    # torchvision's "ResNet v1.5": the stride sits on the 3x3 conv, not the first 1x1.
    y = relu(b, conv_bn(b, x, f"{p}.conv1", f"{p}.bn1", cin, planes, 1), f"{p}.relu1")
    y = relu(b, conv_bn(b, y, f"{p}.conv2", f"{p}.bn2", planes, planes, 3, stride), f"{p}.relu2")
    y = conv_bn(b, y, f"{p}.conv3", f"{p}.bn3", planes, planes * 4, 1)
    return residual(b, x, y, p, cin, planes * 4, stride)


def residual(b: VisionBuilder, x: str, y: str, p: str, cin: int, cout: int, stride: int) -> str:
    if stride != 1 or cin != cout:
        x = conv_bn(b, x, f"{p}.downsample.0", f"{p}.downsample.1", cin, cout, 1, stride)
    return relu(b, add(b, y, x, f"{p}.add"), f"{p}.relu")


def stem(b: VisionBuilder, x: str) -> str:
    x = relu(b, conv_bn(b, x, "conv1", "bn1", 3, 64, 7, stride=2), "relu")
    y = b.op("MaxPool", "maxpool", [x], ceil_mode=0, dilations=[1, 1],
             kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    b.acts[y] = calib.maxpool(b.acts[x], 3, 2, 1)
    return y


def resnet(seed: int, name: str, bottlenecked: bool, depths: tuple[int, int, int, int],
           batch: int | str = 1) -> onnx.ModelProto:
    """`batch`: 1, or a dim_param name ("batch") for the symbolic-batch models (same weights, same graph)."""
    b = VisionBuilder(seed)
    x = stem(b, b.input("input", (batch,) + IMAGE_SHAPE[1:]))
    block, expansion = (bottleneck, 4) if bottlenecked else (basic_block, 1)
    cin = 64
    for stage, (planes, depth) in enumerate(zip((64, 128, 256, 512), depths), start=1):
        for i in range(depth):
            stride = 2 if stage > 1 and i == 0 else 1
            x = block(b, x, f"layer{stage}.{i}", cin, planes, stride)
            cin = planes * expansion
    classifier(b, x, cin, batch=batch)
    return b.model(name)


def resnet18(seed: int = 0) -> onnx.ModelProto:
    return resnet(seed, "resnet18", bottlenecked=False, depths=(2, 2, 2, 2))


def resnet50(seed: int = 0) -> onnx.ModelProto:
    return resnet(seed, "resnet50", bottlenecked=True, depths=(3, 4, 6, 3))


def resnet18_dynamic(seed: int = 0) -> onnx.ModelProto:
    """resnet18 with a symbolic batch: input [batch, 3, 224, 224]."""
    return resnet(seed, "resnet18_dynamic", bottlenecked=False, depths=(2, 2, 2, 2), batch="batch")


def resnet50_dynamic(seed: int = 0) -> onnx.ModelProto:
    """resnet50 with a symbolic batch: input [batch, 3, 224, 224]."""
    return resnet(seed, "resnet50_dynamic", bottlenecked=True, depths=(3, 4, 6, 3), batch="batch")


# ---- MobileNetV2 --------------------------------------------------------------------------------

# (expand ratio t, output channels c, repeats n, first stride s), torchvision width 1.0.
MBV2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                 (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def inverted_residual(b: VisionBuilder, x: str, p: str, cin: int, cout: int, stride: int, t: int) -> str:
    hidden = cin * t
    y = x
    if t != 1:
        y = relu6(b, conv_bn(b, y, f"{p}.expand.conv", f"{p}.expand.bn", cin, hidden, 1), f"{p}.expand.relu6")
    y = conv_bn(b, y, f"{p}.dw.conv", f"{p}.dw.bn", hidden, hidden, 3, stride, group=hidden)
    y = relu6(b, y, f"{p}.dw.relu6")
    # Linear bottleneck: no activation after the projection.
    y = conv_bn(b, y, f"{p}.project.conv", f"{p}.project.bn", hidden, cout, 1)
    if stride == 1 and cin == cout:
        y = add(b, x, y, f"{p}.add")
    return y


def mobilenetv2(seed: int = 0) -> onnx.ModelProto:
    b = VisionBuilder(seed)
    x = b.input("input", IMAGE_SHAPE)
    x = relu6(b, conv_bn(b, x, "features.0.conv", "features.0.bn", 3, 32, 3, stride=2), "features.0.relu6")
    cin, idx = 32, 1
    for t, c, n, s in MBV2_SETTINGS:
        for i in range(n):
            x = inverted_residual(b, x, f"features.{idx}", cin, c, s if i == 0 else 1, t)
            cin, idx = c, idx + 1
    x = conv_bn(b, x, f"features.{idx}.conv", f"features.{idx}.bn", cin, 1280, 1)
    x = relu6(b, x, f"features.{idx}.relu6")
    # Dropout(0.2) vanishes in an eval-mode export.
    classifier(b, x, 1280, fc_name="classifier.1")
    return b.model("mobilenetv2")
