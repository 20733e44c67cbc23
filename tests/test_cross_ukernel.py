"""The ukernel strategy on cross targets: Kiln's AArch64 (NEON, SVE) and RISC-V (RVV) microkernels
(kiln/ukernels/aarch64.py, riscv.py) built with kiln.cross and run under qemu-user at two vector lengths each,
compared with onnxruntime.

Tolerance: max|kiln − ort| ≤ 1e-4 · max|ort| (f32 sums in another order; the issue asks ≤ 1e-3, measured
≈1e-6). Each run also checks that the anchor was really built on the microkernel (CrossBinary.strategies) and
that the object calls it. Skips with the reason when the cross GCC or qemu-user is absent."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import make_model, rand
from kiln import zoo
from kiln.target import resolve
from kiln.ukernels import isa_of, ukernel_for

RTOL = 1e-4
# (target, the two vector lengths): SVE VL 128 runs the kernel's two-vector path, VL ≥ 256 its predicated
# one-vector path; RVV uses evl = 8 on an LMUL-2 group at every VLEN
VLENS = {"aarch64-sve": (128, 512), "riscv64-rvv": (128, 512), "aarch64-neon": (128,)}


def _toolchain_or_skip(arch: str) -> None:
    from kiln.cross import have_toolchain

    missing = have_toolchain(arch)
    if missing:
        pytest.skip(missing)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _run_ukernel(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: str, tmp_path) -> None:  # noqa: ANN001
    import kiln.cross as kc

    t = resolve(target)
    _toolchain_or_skip(t.arch)
    binary = kc.build_binary(model, t, str(tmp_path / target), strategy="ukernel")
    assert binary.strategies and set(binary.strategies.values()) == {"ukernel"}, binary.strategies
    with open(binary.asm) as f:
        assert f"kiln_ukr_{isa_of(t)}_f32_" in f.read(), "the object does not call the microkernel"
    ref = _ort(model, feeds)
    for vlen in VLENS[target]:
        outs, _ = kc.run_qemu(binary, feeds, vlen=vlen)
        for name, o, r in zip(binary.output_names, outs, ref):
            assert o.shape == r.shape, name
            rel = float(np.abs(o.astype(np.float64) - r).max() / max(float(np.abs(r).max()), 1e-6))
            assert rel <= RTOL, f"{target} VLEN {vlen} output {name}: max rel err {rel:.3g} > {RTOL}"


# -- the registry ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target, isa, name", [
    ("aarch64-neon", "neon", "kiln_ukr_neon_f32_12x8"), ("aarch64-sve", "sve", "kiln_ukr_sve_f32_12x8"),
    ("aarch64-sve2", "sve", "kiln_ukr_sve_f32_12x8"), ("riscv64-rvv", "rvv", "kiln_ukr_rvv_f32_14x8"),
    ("riscv64-rvv:sifive-x280", None, None),   # VLEN 512 minimum: 32-wide panels, no kernel (stays direct)
])
def test_registry_cross_families(target: str, isa: str | None, name: str | None) -> None:
    t = resolve(target)
    assert isa_of(t) == isa
    uk = ukernel_for(t)
    assert (uk.name if uk else None) == name
    if uk is not None:
        assert uk.nr == 2 * t.lanes(32)   # the panel width pack_weights gives the weights
        with pytest.raises(ValueError, match="rows"):
            ukernel_for(t, uk.mr + 1)


@pytest.mark.parametrize("isa", ["neon", "sve", "rvv"])
def test_kernel_ir_verifies_for_every_mr(isa: str) -> None:
    """Every family member (MR = 1 … main, plus NEON's one-vector edge kernel) is valid LLVM IR."""
    import llvmlite.binding as llvm

    target = {"neon": "aarch64-neon", "sve": "aarch64-sve", "rvv": "riscv64-rvv"}[isa]
    t = resolve(target)
    main = ukernel_for(t)
    assert main is not None
    kernels = [ukernel_for(t, mr) for mr in range(1, main.mr + 1)]
    if isa == "neon":
        kernels.append(ukernel_for(t, main.mr, 4))
    for uk in kernels:
        assert uk is not None
        mod = llvm.parse_assembly(f'target triple = "{t.triple}"\n' + uk.ir_text)
        mod.verify()
        assert mod.get_function(uk.name) is not None


# -- numbers under qemu --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["riscv64-rvv", "aarch64-sve", "aarch64-neon"])
def test_gemm_odd_ukernel(target: str, tmp_path) -> None:  # noqa: ANN001
    """129×771 · 771×257: M, K, N off every tile, K off the unroll, the last panel 1 column wide."""
    _run_ukernel(zoo.build("gemm_odd"), {"A": rand(129, 771, seed=3)}, target, tmp_path)


@pytest.mark.parametrize("target", ["riscv64-rvv", "aarch64-sve"])
def test_matmul_long_k_accumulates(target: str, tmp_path) -> None:  # noqa: ANN001
    """K = 12000: one tile's A and B slices (K·(5 + 8)·4 bytes) exceed half of a 1 MiB L2, so K is cut into
    blocks and every call after the first runs with accumulate = 1 (the kernel loads C). M = 5 runs a 5-row
    family member; N = 37 (≥ the 32 columns pack_weights needs to pack B) ends in a 5-column panel."""
    w = rand(12000, 37, seed=5, lo=-0.1, hi=0.1)
    x = rand(5, 12000, seed=6)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"x": x}, ["y"], {"w": w})
    model.ir_version = 8
    _run_ukernel(model, {"x": x}, target, tmp_path)


@pytest.mark.parametrize("target", ["riscv64-rvv", "aarch64-sve"])
def test_small_conv_epilogue_ukernel(target: str, tmp_path) -> None:  # noqa: ANN001
    """3×3 conv, 13 output channels (two panels, the second 5 wide), bias + ReLU fused after the kernel,
    9×9 output rows (M = 9 per row tile)."""
    x = rand(1, 6, 11, 11, seed=7)
    w, b = rand(13, 6, 3, 3, seed=8), rand(13, seed=9)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": x}, ["y"], {"w": w, "b": b})
    model.ir_version = 8
    _run_ukernel(model, {"x": x}, target, tmp_path)


@pytest.mark.parametrize("target", ["riscv64-rvv", "aarch64-sve", "aarch64-neon"])
def test_conv_r50_3x3_ukernel(target: str, tmp_path) -> None:  # noqa: ANN001
    """ResNet-50's stage-3 3×3 conv (256 → 256 channels, 14×14): ≈ 2–4 s per target under qemu."""
    _run_ukernel(zoo.build("conv_r50_3x3"), {"input": rand(1, 256, 14, 14, seed=4)}, target, tmp_path)
