"""The command line: compile → file, run --check, explain prints every stage."""
from __future__ import annotations

import re
import subprocess
import sys


def kiln(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True, text=True, timeout=600)


def test_compile_then_run_the_saved_file(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "dw.kiln"
    r = kiln("compile", "zoo:conv_dw", "-o", str(out), "--no-cache")
    assert r.returncode == 0, r.stderr
    assert out.exists()
    r = kiln("run", str(out), "--repeat", "2")
    assert r.returncode == 0, r.stderr
    assert "output: float32[1, 144, 56, 56]" in r.stdout


def test_run_check_reports_error_against_onnxruntime() -> None:
    r = kiln("run", "zoo:gemm_odd", "--check", "--repeat", "2", "--profile")
    assert r.returncode == 0, r.stderr
    assert "vs onnxruntime" in r.stdout and "→ OK" in r.stdout
    assert "profile" in r.stdout and "GFLOP/s" in r.stdout


def test_explain_prints_graph_kernel_llvm_and_assembly() -> None:
    r = kiln("explain", "zoo:resnet18", "--node", "layer1.0.conv1")
    assert r.returncode == 0, r.stderr
    for marker in ("graph IR after import", "graph IR after fold_batchnorm", "compute definitions",
                   "scheduled loop nest", "LLVM IR of", "assembly of"):
        assert marker in r.stdout, marker
    assert re.search(r"vfmadd|mulps", r.stdout)  # the conv's multiply-adds (FMA, or SSE's mulps + addps)


def test_explain_assembly_follows_kernel_families(width: str) -> None:
    """A kernel that is a member of a family (codegen/families.py) calls its family's function: explain's assembly
    section prints that function too — on an AVX2 host resnet18's first Winograd product is one, and the section
    had no multiply-add in it."""
    from kiln import zoo
    from kiln.explain import explain

    out = explain(zoo.build("resnet18"), node="layer1.0.conv1", stages=["asm"], target=width, num_threads=2)
    asm = out.split("assembly of", 1)[1]
    assert re.search(r"vfmadd|mulps", asm), asm[:2000]
    for family in set(re.findall(r"\$([\w.$]+\.family)@", asm)):
        assert f"\n{family}:" in asm, family


def test_errors_are_one_line_not_a_traceback(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    r = kiln("run", str(bad))
    assert r.returncode == 2
    assert "kiln: error: cannot parse ONNX model" in r.stderr and "Traceback" not in r.stderr
