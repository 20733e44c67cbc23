"""Instructions executed under qemu by an int8 GEMM (QLinearMatMul M×K × K×N) built for AArch64 targets, per
feature set and strategy: what SDOT / SMMLA buy over the widening multiply-adds, direct emission against the
hand-written microkernels (qemu's counting plugin, kiln/isa/counting.py; counts, not time).

    python benchmarks/aarch64_int8_counts.py [--targets aarch64-neon,aarch64-sve] [--m 64 --k 256 --n 64] [--vlen 256]
                                             [--zoo mobilenetv2]   (kiln.quantize of a zoo model instead)

Each target with its own features, + dotprod, + dotprod + i8mm; strategies direct and ukernel (exe strategies show
where the microkernel does not apply). Needs the aarch64 cross toolchain and qemu (kiln.cross)."""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile

import numpy as np

import kiln.cross as kc
from kiln.isa.counting import plugin_args, read_counts
from kiln.isa.int8 import qmatmul_model
from kiln.target import resolve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="aarch64-neon,aarch64-sve")
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--vlen", type=int, default=256, help="SVE vector length under qemu (scalable targets)")
    p.add_argument("--zoo", default="", help="count kiln.quantize(zoo model) (2 calibration inputs) instead")
    a = p.parse_args()
    if a.zoo:
        import kiln
        from kiln import zoo
        feeds = zoo.inputs(a.zoo)
        model = kiln.quantize(zoo.build(a.zoo), [feeds] * 2)
        macs = 0
    else:
        model = qmatmul_model(a.m, a.k, a.n)
        feeds = {"a": np.random.default_rng(0).integers(0, 256, (a.m, a.k)).astype(np.uint8)}
        macs = a.m * a.k * a.n
    print("| target | features | strategy | built | instructions executed | per MAC |\n|---|---|---|---|---:|---:|")
    for name in a.targets.split(","):
        base = resolve(name)
        for extra in ("", ",+dotprod", ",+dotprod,+i8mm"):
            t = dataclasses.replace(base, features=base.features + extra)
            for strategy in ("direct", "ukernel"):
                with tempfile.TemporaryDirectory() as d:
                    b = kc.build_binary(model, t, d, strategy=strategy)
                    counts = os.path.join(d, "counts.txt")
                    kc.run_qemu(b, feeds, vlen=a.vlen if t.scalable else None, plugin_args=plugin_args(counts))
                    total = sum(x.count for x in read_counts(counts))
                built = "; ".join(sorted(set(b.strategies.values())))
                per_mac = f"{total / macs:.3f}" if macs else "·"
                print(f"| {name} | {t.features} | {strategy} | {built} | {total:,} | {per_mac} |", flush=True)


if __name__ == "__main__":
    main()
