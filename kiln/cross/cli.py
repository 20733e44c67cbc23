"""`kiln compile --target aarch64-sve -o model.o` and `kiln run --target riscv64-rvv --check --vlen 128,512`:
the cross-target halves of kiln/cli.py's compile and run commands."""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np

from kiln.checking import check_outputs
from kiln.target import Target


def default_vlens(t: Target) -> list[int]:
    """The vector lengths `kiln run --target` tries when --vlen is not given: the minimum, 2× and 4× it."""
    if not t.scalable:
        return [128]
    top = 1024 if t.arch == "riscv64" else 2048
    return [v for v in (t.vector_bits, 2 * t.vector_bits, 4 * t.vector_bits) if v <= top]


def parse_vlens(spec: list[str] | None, t: Target) -> list[int]:
    if not spec:
        return default_vlens(t)
    out = []
    for item in spec:
        for v in item.split(","):
            try:
                out.append(int(v))
            except ValueError:
                raise ValueError(f"--vlen wants bit widths such as 128,512; got {v!r}") from None
    return out


def compile_cross(args: argparse.Namespace, model, t: Target, options: dict[str, bool],  # noqa: ANN001
                  precision: str = "fp32") -> int:
    from kiln.codegen.scalable import count_vector_loops
    from kiln.cross.build import compile_object

    start = time.perf_counter()
    asm = os.path.splitext(args.output)[0] + ".s"
    c = compile_object(model, t, args.output, asm, options, precision=precision)
    loops = count_vector_loops(c.program.kernels, t.scalable)
    print(f"compiled {args.model} for {t.name} (cpu {t.cpu}) in {time.perf_counter() - start:.2f} s → "
          f"{args.output}, {asm} ({len(c.program.kernels)} kernels, vector loops: {loops['scalable']} scalable, "
          f"{loops['fixed']} fixed-length)")
    return 0


def run_cross(args: argparse.Namespace, model, t: Target, options: dict[str, bool],  # noqa: ANN001
              make_feeds: Callable, precision: str = "fp32") -> int:
    from kiln.cross.qemu import check_vlen

    vlens = parse_vlens(args.vlen, t)
    for vlen in vlens:  # before the build: a bad --vlen should not cost a compile
        check_vlen(t, vlen)
    workdir = tempfile.mkdtemp(prefix=f"kiln-{t.name.replace(':', '-')}-")
    try:  # the executable and weights are scratch: `kiln compile --target` or kiln.cross keep theirs
        return _build_and_run(args, model, t, options, make_feeds, vlens, workdir, precision)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _build_and_run(args: argparse.Namespace, model, t: Target, options: dict[str, bool],  # noqa: ANN001
                   make_feeds: Callable, vlens: list[int], workdir: str, precision: str = "fp32") -> int:
    import kiln.cross as kc
    from kiln.cross.qemu import kiln_main_seconds

    binary = kc.build_binary(model, t, workdir, options=options, precision=precision)
    loops = binary.vector_loops
    sme = f", {loops['sme']} SME tiles" if "sme" in loops else ""
    print(f"{args.model}: built for {t.name} (cpu {t.cpu}) in {binary.compile_s:.2f} s; vector loops: "
          f"{loops['scalable']} scalable, {loops['fixed']} fixed-length{sme}")
    feeds = make_feeds(binary)
    ref = None
    if args.check:
        import onnxruntime as ort

        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    status = 0
    for vlen in vlens:
        start = time.perf_counter()
        outs, err = kc.run_qemu(binary, feeds, vlen=vlen)
        wall = time.perf_counter() - start
        main_s = kiln_main_seconds(err)
        print(f"  {' '.join(kc.qemu_command(binary, vlen))}: wall {wall:.2f} s (kiln_main {main_s or 0:.3f} s "
              f"emulated)")
        if args.output and vlen == vlens[0]:
            np.save(args.output, outs[0])
        if ref is not None:
            status |= check_outputs(binary.output_names, outs, ref, args.rtol, f" at VLEN {vlen}", "    ")
    return status
