"""The ISA analysis of one workload on one target with one strategy: what `kiln bench --isa` reports.

Cross targets (AArch64 SVE, RISC-V RVV): the model is built into a static executable (kiln.cross, ONE thread so
the plugin's counts are exact), run under QEMU with the counting plugin, checked against onnxruntime, and every
executed instruction is attributed to a function of the binary and classified (classify.py). Functions defined
by Kiln's object are split into

  * matrix work   — kernels anchored on MatMul / Conv (their fused epilogues included) and microkernels;
  * 1-D vector work — every other kernel: elementwise chains, softmax / layer norm pieces, pooling, reductions;
  * runtime       — kiln_main (the calls between kernels);

and everything else (the C driver, libc, loading weights) is counted apart as "outside Kiln code". Counts are
divided by the workload's FLOPs (2·MACs of its MatMul/Conv). llvm-mca estimates the hot loop of the busiest
matrix kernel and the busiest 1-D kernel (mca.py). The host (x86-64) gets the llvm-mca estimates only: its
kernels are compiled to assembly here, nothing runs under emulation.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.isa.classify import CLASSES, SME_OUTER, VEC_FMA, VECTOR_CLASSES, arch_of
from kiln.isa.counting import attribute, disassemble, fma_loop_addresses, missing_tools, plugin_args, read_counts
from kiln.isa.mca import CPU_VECTOR_BITS, MCA_CPU, estimate

MATRIX_OPS = frozenset({"matmul", "packedmatmul", "conv", "packedconv", "convtranspose", "gemm", "einsum"})
MATRIX, VECTOR_1D, RUNTIME = "matrix", "1-D vector", "runtime"
ROLES = (MATRIX, VECTOR_1D, RUNTIME)
ISA_TARGETS = ("aarch64-sve", "riscv64-rvv")
ISA_STRATEGIES = ("direct", "ukernel")
# default vector length per target (bits) = the llvm-mca core's, so the run and the static model agree
DEFAULT_VLEN = {"aarch64": CPU_VECTOR_BITS[MCA_CPU["aarch64"]], "riscv64": CPU_VECTOR_BITS[MCA_CPU["riscv64"]]}
TOLERANCE = 1e-3   # as kiln bench's protocol: max|out - ref| / max|ref|

_KERNEL = re.compile(r"^k\d+_([a-z0-9]+)$")
UKERNEL_PREFIX = "kiln_ukr_"   # kiln/ukernels: kiln_ukr_<isa>_f32_<MR>x<NR>


def base_function(name: str) -> str:
    """A parallel loop's outlined chunk function (`k3_conv.par0`) belongs to its kernel (`k3_conv`)."""
    return name.split(".", 1)[0]


def role_of(function: str) -> str:
    base = base_function(function)
    if base == "kiln_main":
        return RUNTIME
    m = _KERNEL.match(base)
    if m:
        return MATRIX if m.group(1) in MATRIX_OPS else VECTOR_1D
    # functions the module links in that are not kernels: microkernels (matrix work) and helpers
    return MATRIX if base.startswith(UKERNEL_PREFIX) else RUNTIME


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def summarize(by_function: dict[str, Counter[str]], kiln_functions: set[str], flops: float,
              in_fma_loops: int | None = None) -> dict[str, Any]:
    """The report's numbers from per-function class counts; `in_fma_loops`: how many of the matrix kernels'
    instructions ran inside their FMA loops (counting.fma_loop_addresses)."""
    roles: dict[str, Counter[str]] = {r: Counter() for r in ROLES}
    outside: Counter[str] = Counter()
    per_kernel: dict[str, dict[str, Any]] = {}
    for fn, counts in by_function.items():
        if fn not in kiln_functions:
            outside.update(counts)
            continue
        role = role_of(fn)
        roles[role].update(counts)
        k = per_kernel.setdefault(base_function(fn), {"role": role, "total": 0, "classes": Counter()})
        k["total"] += sum(counts.values())
        k["classes"].update(counts)
    kiln: Counter[str] = Counter()
    for c in roles.values():
        kiln.update(c)
    total = sum(kiln.values())
    vec = {r: sum(v for k, v in c.items() if k in VECTOR_CLASSES) for r, c in roles.items()}
    return {
        "kiln_instructions": total,
        "outside_instructions": sum(outside.values()),
        "classes": {c: kiln.get(c, 0) for c in CLASSES},
        "per_flop": {c: kiln.get(c, 0) / flops if flops else None for c in CLASSES},
        "instructions_per_flop": total / flops if flops else None,
        "roles": {r: {c: n for c, n in roles[r].items()} for r in ROLES},
        "share_1d": _share(sum(roles[VECTOR_1D].values()), total),
        "share_1d_vector": _share(vec[VECTOR_1D], vec[MATRIX] + vec[VECTOR_1D]),
        "share_runtime": _share(sum(roles[RUNTIME].values()), total),
        # matrix kernels' instructions outside their FMA loops: tile setup, packing, edge tiles, fused epilogues
        "share_matrix_outside_fma_loops": None if in_fma_loops is None else
        _share(sum(roles[MATRIX].values()) - in_fma_loops, total),
        # useful f32 lanes per FMA: FLOPs ÷ (2 × FMAs in matrix code); below the vector's lanes = masked or
        # half-empty FMAs (edge tiles, a tile narrower than the register); not defined once SME outer products run
        "lanes_per_fma": _share(flops / 2, roles[MATRIX].get(VEC_FMA, 0)) if not roles[MATRIX].get(SME_OUTER) else None,
        "per_kernel": {k: {**v, "classes": dict(v["classes"])}
                       for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1]["total"])},
    }


def _mca_for(asm: str, triple: str, per_kernel: dict[str, dict[str, Any]], functions: Sequence[str],
             cpu: str | None = None, lanes: float | None = None) -> list[dict[str, Any]]:
    """llvm-mca on the hot loop of the busiest matrix kernel and of the busiest 1-D kernel (each: the function,
    kernel or outlined chunk, whose hot loop has the most FMA FLOPs). `lanes`: the matrix kernels' measured
    useful lanes per FMA, used for their FLOP/cycle."""
    out = []
    for role in (MATRIX, VECTOR_1D):
        kernels = [k for k, v in per_kernel.items() if v["role"] == role]
        if not kernels:
            continue
        kernel = kernels[0]   # per_kernel is sorted by executed (or static) instructions
        best = None
        # a microkernel LLVM did not inline is a function of its own: its loop is the matrix kernel's hot loop
        candidates = [f for f in functions if base_function(f) == kernel or
                      (role == MATRIX and f.startswith(UKERNEL_PREFIX))]
        for fn in candidates:
            try:
                est = estimate(asm, fn, triple, cpu, lanes=lanes if role == MATRIX else None)
            except KeyError:
                continue
            if est and (best is None or (est.flops_per_iteration, est.instructions) >
                        (best.flops_per_iteration, best.instructions)):
                best = est
        if best is not None:
            out.append({"role": role, "kernel": kernel, **best.to_dict()})
    return out


def _record(workload: Any, target: str, strategy: str, **fields: Any) -> dict[str, Any]:
    return {"workload": workload.name, "target": target, "strategy": strategy, "flops": workload.flops, **fields}


def analyze_cross(workload: Any, target: str, strategy: str, workdir: str, vlen: int | None = None,
                  mca_cpu: str | None = None, timeout: float = 3600.0) -> dict[str, Any]:
    """Dynamic counts + llvm-mca for a workload built for a cross target. Never raises for a missing tool or an
    unavailable strategy: the record's status/reason say so."""
    t0 = time.perf_counter()
    try:
        import kiln.cross as cross
        from kiln.target import resolve
        tgt = resolve(target)
    except ImportError as exc:
        return _record(workload, target, strategy, status="unavailable", reason=f"no cross-build support: {exc}")
    arch = arch_of(tgt.triple)
    why = missing_tools(arch)
    if why:
        return _record(workload, target, strategy, status="unavailable", reason=why)
    vlen = vlen or DEFAULT_VLEN.get(arch)
    try:
        binary = cross.build_binary(workload.build_model(), target, workdir, strategy=strategy)
    except ValueError as exc:   # the strategy does not exist for this target (yet)
        return _record(workload, target, strategy, status="unavailable", reason=str(exc))
    except Exception as exc:    # noqa: BLE001 - a failed build is a finding of the report, not a crash of it
        return _record(workload, target, strategy, status="error", reason=f"build: {type(exc).__name__}: {exc}")
    counts_path = os.path.join(workdir, "isa-counts.txt")
    try:
        outputs, _ = cross.run_qemu(binary, workload.inputs, vlen=vlen, plugin_args=plugin_args(counts_path),
                                    timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a crash under emulation is reported, with qemu's message
        return _record(workload, target, strategy, status="error", reason=f"run: {type(exc).__name__}: {exc}")
    ok, err, why = _check(workload, outputs)
    executed = read_counts(counts_path)
    kiln_functions = {i.function for i in disassemble(binary.obj, arch).values()}
    disasm = disassemble(binary.exe, arch)
    profile = attribute(executed, disasm, arch)
    matrix_fns = {f for f in kiln_functions if role_of(f) == MATRIX}
    loops = fma_loop_addresses(disasm, arch, matrix_fns)
    in_loops = sum(e.count for e in executed if e.address in loops)
    summary = summarize(profile.by_function, kiln_functions, workload.flops, in_loops)
    with open(binary.asm) as f:
        asm = f.read()
    mca = _mca_for(asm, tgt.triple, summary["per_kernel"], sorted(kiln_functions), mca_cpu,
                   summary["lanes_per_fma"])
    return _record(workload, target, strategy, status="ok" if ok else "wrong", reason=why, max_rel_err=err,
                   vlen=vlen, mca=mca, seconds=time.perf_counter() - t0, **summary)


def _check(workload: Any, outputs: Sequence[np.ndarray]) -> tuple[bool, float, str]:
    from kiln.bench.reference import check, onnxruntime_outputs
    ref = onnxruntime_outputs(workload.build_model(), workload.inputs, 1)
    return check(list(outputs), ref, TOLERANCE)


def analyze_host(workload: Any, strategy: str, mca_cpu: str | None = None) -> dict[str, Any]:
    """Static analysis for this x86-64 host: llvm-mca (znver4) on the hot loops of Kiln's kernels."""
    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.compiler import lower
    from kiln.target import host
    t0 = time.perf_counter()
    tgt = host()
    try:
        c = lower(workload.build_model(), tgt, 1, {}, stop_after="llvm", strategy=strategy)
    except (ValueError, NotImplementedError, ImportError) as exc:  # the strategy does not exist (yet)
        return _record(workload, "host", strategy, status="unavailable", reason=f"{type(exc).__name__}: {exc}")
    asm = emit_assembly(optimize(c.llvm_ir, tgt), tgt)
    per_kernel: dict[str, dict[str, Any]] = {}
    for fn, k, g in zip(c.kernel_functions, c.program.kernels, c.program.groups):
        # busiest: matrix kernels by FLOPs, 1-D kernels by the elements they compute
        entry = per_kernel.setdefault(fn, {"role": role_of(fn), "total": 0.0})
        entry["total"] += k.flops or _packed_conv_flops(g.nodes) or \
            float(sum(np.prod(cp.extents) for cp in k.computes)) or 1.0
    per_kernel = dict(sorted(per_kernel.items(), key=lambda kv: -kv[1]["total"]))
    from kiln.isa.mca import functions
    mca = _mca_for(asm, tgt.triple, per_kernel, sorted(functions(asm)), mca_cpu)
    return _record(workload, "host", strategy, status="static", reason="llvm-mca only (no emulated run)",
                   mca=mca, seconds=time.perf_counter() - t0)


def _packed_conv_flops(nodes: Sequence[Any]) -> float:
    """2·MACs of PackedConv nodes (Kernel.flops does not count them yet): weight [⌈Co/NR⌉, Ci/g, kh, kw, NR]."""
    total = 0.0
    for n in nodes:
        if n.op == "PackedConv":
            total += 2.0 * float(np.prod(n.outputs[0].shape)) * float(np.prod(n.inputs[1].shape[1:4]))
    return total


def run_isa(workloads: Sequence[Any], targets: Sequence[str] = ISA_TARGETS,
            strategies: Sequence[str] = ISA_STRATEGIES, vlen: int | None = None, host: bool = True,
            progress: Any = None) -> dict[str, Any]:
    """The ISA section's data: one record per workload × target × strategy (host: static only)."""
    records = []
    for w in workloads:
        for strategy in strategies:
            for target in targets:
                if progress:
                    progress(f"isa: {w.name} {target} {strategy}")
                with tempfile.TemporaryDirectory(prefix=f"kiln-isa-{w.name}-") as d:
                    records.append(analyze_cross(w, target, strategy, d, vlen))
            if host:
                if progress:
                    progress(f"isa: {w.name} host {strategy}")
                records.append(analyze_host(w, strategy))
    return {"classes": list(CLASSES), "mca_cpu": dict(MCA_CPU), "vlen": vlen or dict(DEFAULT_VLEN),
            "records": records}
