"""Where a model's time goes, by kernel class (convs split by kernel size, stride and depthwise; Winograd's
GEMMs and transforms; packed-weight matmuls; the rest by op): the per-model breakdown of the closing notes.

    python benchmarks/profile_breakdown.py resnet18 resnet50 mobilenetv2 bert_base mlp [--strategy direct]
    python benchmarks/profile_breakdown.py corpus:whisper corpus:llama:dynamo model.onnx   # corpus families, files
    python benchmarks/profile_breakdown.py resnet50 --precision fp32,bf16   # one line per precision

Each model is compiled once (2 threads), warmed up, then profiled over --runs runs through Kiln's profile
hook; GFLOP/s are the kernels' own FLOP counts (Winograd products: the multiply-adds they really execute)."""
from __future__ import annotations

import argparse
import re

from kiln import zoo
from kiln.compiler import check_options, executable_of, lower
from kiln.target import host


def kernel_class(kernel_name: str, group) -> str:  # noqa: ANN001  (a fused group of graph nodes)
    kind = re.sub(r"^k\d+_", "", kernel_name)
    anchor = group.anchor
    if any(n.op == "WinogradOutput" for n in group.nodes):  # named after its fused epilogue (relu, add)
        return "winograd output transform"
    if anchor.op == "PackedConv":
        k, s, g = anchor.attrs["kernel"][0], anchor.attrs["strides"][0], anchor.attrs["group"]
        return ("depthwise " if g > 1 else "") + f"conv {k}x{k}" + (f" s{s}" if s > 1 else "")
    return {"winogradproduct": "winograd 3x3 GEMMs", "winogradinput": "winograd input transform",
            "packedmatmul": "matmul (packed weights)"}.get(kind, kind)


def load(name: str) -> tuple[object, dict]:
    """A zoo name, `corpus:FAMILY[:EXPORTER]` (kiln/corpus, exported on first use) or an .onnx path (random feeds)."""
    import numpy as np
    import onnx

    if name.startswith("corpus:"):
        from kiln import corpus
        fam, _, exporter = name[7:].partition(":")
        return onnx.load(corpus.export(fam, exporter or "torchscript")), corpus.feeds(fam)
    if name.endswith(".onnx"):
        model = onnx.load(name)
        c = lower(model, host(), 1, check_options({}), stop_after="kernels")
        rng = np.random.default_rng(0)
        return model, {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in c.graph.inputs}
    return zoo.build(name), zoo.inputs(name)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="+")
    p.add_argument("--strategy", default="direct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--precision", default="fp32", help="fp32, bf16 or both comma-separated (precision=)")
    a = p.parse_args()
    for name, precision in [(n, q) for n in a.models for q in a.precision.split(",")]:
        model, feeds = load(name)
        c = lower(model, host(), a.threads, check_options({}), strategy=a.strategy, precision=precision)
        exe = executable_of(c, host(), a.threads)
        cls = {k.name: kernel_class(k.name, g) for k, g in zip(c.program.kernels, c.program.groups)}
        flops = {k.name: k.flops or 0 for k in c.program.kernels}
        for _ in range(5):
            exe.run(feeds)
        prof: dict[str, float] = {}
        for _ in range(a.runs):
            exe.run(feeds, profile=prof)
        total = sum(prof.values()) / a.runs * 1e3
        kinds: dict[str, list[float]] = {}
        for k, sec in prof.items():
            row = kinds.setdefault(cls.get(k, k), [0.0, 0, 0.0])
            row[0] += sec / a.runs * 1e3
            row[1] += 1
            row[2] += flops.get(k, 0)
        parts = []
        for kind, (ms, n, fl) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
            if ms / total >= 0.005:
                rate = f", {fl / ms / 1e6:.0f} GFLOP/s" if fl else ""
                parts.append(f"{kind} ×{n} {ms:.2f} ms ({100 * ms / total:.0f}%{rate})")
        print(f"{name} ({a.strategy}, {precision}, {a.threads} threads) {total:.2f} ms: " + "; ".join(parts))


if __name__ == "__main__":
    main()
