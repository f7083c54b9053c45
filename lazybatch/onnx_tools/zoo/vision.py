"""CNNs of the paper (ResNet-50, VGG-16, MobileNet-v1) as ONNX graphs with seeded random weights.

Layouts follow the reference architectures (torchvision-style ResNet-50 v1.5 bottlenecks, VGG configuration D,
MobileNet-v1 with width multiplier 1.0). The small variants keep each architecture's structure (residual
bottlenecks with projection shortcuts, depthwise-separable blocks) at a fraction of the width and resolution.
"""

from __future__ import annotations

from ..builder import FLOAT, GraphBuilder

BATCH = "batch"


def _conv_bn(g: GraphBuilder, x: str, c_in: int, c_out: int, k: int, stride: int, name: str, *,
             group: int = 1, relu: bool = True, bn_gain: float = 1.0) -> str:
    w = g.weight(f"{name}.weight", [c_out, c_in // group, k, k], gain=2.0)
    y = g.op("Conv", [x, w], name=name, kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
             group=group)
    y = g.op("BatchNormalization", [y, g.fill(f"{name}.bn.gamma", [c_out], bn_gain),
                                    g.fill(f"{name}.bn.beta", [c_out], 0.0), g.fill(f"{name}.bn.mean", [c_out], 0.0),
                                    g.fill(f"{name}.bn.var", [c_out], 1.0)], name=f"{name}.bn", epsilon=1e-5)
    return g.op("Relu", [y], name=f"{name}.relu") if relu else y


def _head(g: GraphBuilder, x: str, c: int, classes: int) -> None:
    y = g.op("GlobalAveragePool", [x], name="avgpool")
    y = g.op("Flatten", [y], name="flatten", axis=1)
    y = g.op("Gemm", [y, g.weight("fc.weight", [classes, c], fan_in=c), g.bias("fc.bias", classes)], name="fc",
             transB=1)
    y = g.op("Softmax", [y], name="softmax", axis=1)
    g.output(y, "prob", FLOAT, [BATCH, classes])


def resnet50(seed: int = 0, small: bool = False) -> GraphBuilder:
    g = GraphBuilder("resnet50_small" if small else "resnet50", seed)
    res, width, blocks, classes = (32, 8, [1, 2, 1, 1], 10) if small else (224, 64, [3, 4, 6, 3], 1000)
    x = g.input("data", FLOAT, [BATCH, 3, res, res])
    x = _conv_bn(g, x, 3, width, 7, 2, "conv1")
    x = g.op("MaxPool", [x], name="maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = width
    for stage, n in enumerate(blocks):
        mid = width * 2 ** stage
        c_out = mid * 4
        for b in range(n):
            stride = 2 if (b == 0 and stage > 0) else 1
            name = f"layer{stage + 1}.{b}"
            y = _conv_bn(g, x, c_in, mid, 1, 1, f"{name}.conv1")
            y = _conv_bn(g, y, mid, mid, 3, stride, f"{name}.conv2")
            # a small last-BN gain keeps the residual sum's variance bounded over 16 random blocks
            y = _conv_bn(g, y, mid, c_out, 1, 1, f"{name}.conv3", relu=False, bn_gain=0.2)
            sc = x if (b > 0) else _conv_bn(g, x, c_in, c_out, 1, stride, f"{name}.downsample", relu=False)
            x = g.op("Relu", [g.op("Add", [y, sc], name=f"{name}.add")], name=f"{name}.relu")
            c_in = c_out
    _head(g, x, c_in, classes)
    return g


def vgg16(seed: int = 0, small: bool = False) -> GraphBuilder:
    g = GraphBuilder("vgg16_small" if small else "vgg16", seed)
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    div, res, fc, classes = (8, 32, 64, 10) if small else (1, 224, 4096, 1000)
    x = g.input("data", FLOAT, [BATCH, 3, res, res])
    c_in, k = 3, 0
    for v in cfg:
        if v == "M":
            x = g.op("MaxPool", [x], name=f"pool{k}", kernel_shape=[2, 2], strides=[2, 2])
            continue
        c = int(v) // div
        k += 1
        w = g.weight(f"conv{k}.weight", [c, c_in, 3, 3], gain=2.0)
        x = g.op("Conv", [x, w, g.bias(f"conv{k}.bias", c)], name=f"conv{k}", kernel_shape=[3, 3], pads=[1] * 4)
        x = g.op("Relu", [x], name=f"relu{k}")
        c_in = c
    side = res // 32
    x = g.op("Flatten", [x], name="flatten", axis=1)
    d = c_in * side * side
    for i, (a, b) in enumerate([(d, fc), (fc, fc)], start=6):
        x = g.op("Gemm", [x, g.weight(f"fc{i}.weight", [b, a], fan_in=a, gain=2.0), g.bias(f"fc{i}.bias", b)],
                 name=f"fc{i}", transB=1)
        x = g.op("Relu", [x], name=f"fc{i}.relu")
    x = g.op("Gemm", [x, g.weight("fc8.weight", [classes, fc], fan_in=fc), g.bias("fc8.bias", classes)],
             name="fc8", transB=1)
    g.output(g.op("Softmax", [x], name="softmax", axis=1), "prob", FLOAT, [BATCH, classes])
    return g


def mobilenet_v1(seed: int = 0, small: bool = False) -> GraphBuilder:
    g = GraphBuilder("mobilenet_v1_small" if small else "mobilenet_v1", seed)
    blocks = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    if small:
        blocks = [(64, 1), (128, 2), (256, 2), (512, 2), (512, 1), (1024, 2)]
    div, res, classes = (8, 32, 10) if small else (1, 224, 1000)
    x = g.input("data", FLOAT, [BATCH, 3, res, res])
    c_in = 32 // div
    x = _conv_bn(g, x, 3, c_in, 3, 2, "conv0")
    for i, (c, stride) in enumerate(blocks, start=1):
        c //= div
        x = _conv_bn(g, x, c_in, c_in, 3, stride, f"block{i}.dw", group=c_in)
        x = _conv_bn(g, x, c_in, c, 1, 1, f"block{i}.pw")
        c_in = c
    _head(g, x, c_in, classes)
    return g
