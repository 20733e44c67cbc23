"""Build a model for another ISA: Kiln's pipeline with ONE thread for a cross target, LLVM in a child process
(LLVM aborts the process on some inputs, so a Python caller survives them as a CrossBuildError), then the
object linked statically with kiln/cross/driver.c by the cross GCC."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import onnx

from kiln.compiler import Compiled
from kiln.errors import KilnError, TargetError
from kiln.target import Target, resolve

DRIVER_C = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver.c")

# per architecture: the cross C compiler and the qemu-user binary (Debian: gcc-<arch>-linux-gnu, qemu-user)
TOOLCHAINS: dict[str, tuple[str, str]] = {
    "aarch64": ("aarch64-linux-gnu-gcc", "qemu-aarch64"),
    "riscv64": ("riscv64-linux-gnu-gcc", "qemu-riscv64"),
}
INSTALL_HINT = ("apt-get install qemu-user gcc-riscv64-linux-gnu gcc-aarch64-linux-gnu libc6-dev-riscv64-cross "
                "libc6-dev-arm64-cross")

# GCC 12's libgcc lacks the SME lazy-save routine that LLVM's SME functions reference; Kiln's SME code never
# has a lazy-save buffer to commit (no ZA state crosses a call), so the routine has nothing to do.
SME_STUB_C = "void __arm_tpidr2_save(void) {}\n"

# strategies a cross build can use: emitted code, or the target's microkernels (the library strategy binds host
# shared libraries; auto measures on the host)
CROSS_STRATEGIES = ("direct", "ukernel")


class CrossToolError(KilnError, RuntimeError):
    """The cross compiler or qemu is missing (the message says what to install)."""


class CrossBuildError(KilnError, RuntimeError):
    """LLVM or the cross linker failed on a model for a cross target."""


class CrossRunError(KilnError, RuntimeError):
    """The program failed under qemu (the message holds qemu's stderr)."""


@dataclass
class IOSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        import numpy as np
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class CrossBinary:
    """A model built for a cross target: the static executable and what running it needs."""
    target: Target
    workdir: str
    exe: str
    obj: str
    asm: str
    weights: str
    arena_bytes: int
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    vector_loops: dict[str, int] = field(default_factory=dict)
    kernel_functions: list[str] = field(default_factory=list)
    compile_s: float = 0.0
    strategies: dict[str, str] = field(default_factory=dict)   # per MatMul/Conv node: how it was actually built

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]


def have_toolchain(arch: str) -> str | None:
    """None if the cross GCC and qemu-user for `arch` are installed, else the reason they are not."""
    if arch not in TOOLCHAINS:
        return f"no cross toolchain known for {arch}; Kiln cross-builds for {', '.join(TOOLCHAINS)}"
    missing = [tool for tool in TOOLCHAINS[arch] if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed ({INSTALL_HINT})" if missing else None


def _load(model: onnx.ModelProto | str | bytes | os.PathLike) -> onnx.ModelProto:
    from kiln.frontend.onnx import load_model

    if isinstance(model, str) and model.startswith("zoo:"):
        from kiln import zoo
        return zoo.build(model[4:])
    return load_model(model)


def build_binary(model: onnx.ModelProto | str | bytes | os.PathLike, target: str | Target, workdir: str,
                 strategy: str = "direct", options: dict[str, bool] | None = None,
                 precision: str = "fp32", bounds_check: bool = False) -> CrossBinary:
    """Compile `model` for `target` into `workdir` (model.o, model.s, weights.bin, driver); see kiln.cross.
    `bounds_check`: the debug build (kiln/codegen/bounds.py); run_qemu then fails on a recorded violation."""
    from kiln.codegen.scalable import count_vector_loops
    from kiln.codegen.sme import has_sme, match_sme_tile

    t = resolve(target)
    if strategy not in CROSS_STRATEGIES:
        raise ValueError(f"cross builds support strategies {', '.join(CROSS_STRATEGIES)}, got {strategy!r} "
                         "(libraries are host-only; 'auto' measures on the host)")
    if t.arch not in TOOLCHAINS:
        raise TargetError(f"target {t.name} is not a cross target; cross builds are for {', '.join(TOOLCHAINS)}")
    gcc = TOOLCHAINS[t.arch][0]
    if shutil.which(gcc) is None:
        raise CrossToolError(f"{gcc} not found: install the cross toolchain ({INSTALL_HINT})")
    os.makedirs(workdir, exist_ok=True)
    start = time.perf_counter()
    paths = {k: os.path.join(workdir, f) for k, f in
             (("obj", "model.o"), ("asm", "model.s"), ("weights", "weights.bin"), ("exe", "driver"))}
    c = compile_object(model, t, paths["obj"], paths["asm"], options, strategy, precision, bounds_check)
    g = c.graph
    with open(paths["weights"], "wb") as f:
        f.write(c.plan.weights)
    link(t, [paths["obj"]], paths["exe"], workdir)
    return CrossBinary(
        target=t, workdir=workdir, exe=paths["exe"], obj=paths["obj"], asm=paths["asm"], weights=paths["weights"],
        arena_bytes=int(c.plan.arena_bytes),
        inputs=[IOSpec(v.name, v.dtype, tuple(v.shape)) for v in g.inputs],
        outputs=[IOSpec(n, v.dtype, tuple(v.shape)) for n, v in zip(g.output_names, g.outputs)],
        vector_loops=count_vector_loops(c.program.kernels, t.scalable, match_sme_tile if has_sme(t) else None),
        kernel_functions=list(c.kernel_functions), compile_s=time.perf_counter() - start,
        strategies={node: how for k in c.program.kernels for node, how in k.strategies.items()})


def compile_object(model: onnx.ModelProto | str | bytes | os.PathLike, target: str | Target, obj_path: str,
                   asm_path: str | None = None, options: dict[str, bool] | None = None,
                   strategy: str = "direct", precision: str = "fp32", bounds_check: bool = False) -> Compiled:
    """Kiln's pipeline for `target` with one thread, then LLVM (in a child process) writes the object to
    `obj_path`, its assembly to `asm_path` and the LLVM IR beside the object (`.ll`). Returns the stages.
    `strategy` "ukernel": MatMul/Conv on the target's hand-written microkernels (kiln/ukernels/aarch64.py,
    riscv.py) where they apply; c.program's kernels record what each anchor was built with."""
    from kiln.compiler import check_options, lower

    t = resolve(target)
    if bounds_check and t.scalable:
        raise ValueError(f"bounds_check=True: {t.name} has scalable vectors, whose strip-mined loads and stores have "
                         "no bounds checks; a fixed-width target (aarch64-neon) or the host can be built checked")
    c = lower(_load(model), t, 1, check_options(options or {}), stop_after="llvm", strategy=strategy,
              precision=precision, bounds_check=bounds_check)
    ll_path = os.path.splitext(obj_path)[0] + ".ll"
    with open(ll_path, "w") as f:
        f.write(c.llvm_ir)
    emit_in_child(ll_path, t, obj_path, asm_path)
    return c


def emit_in_child(ll_path: str, t: Target, obj_path: str, asm_path: str | None) -> None:
    """LLVM -O3, object and assembly for `t`, in a child process (an LLVM abort becomes a CrossBuildError)."""
    args = [sys.executable, "-c", "import sys; from kiln.cross.build import _emit_main; _emit_main(sys.argv[1:])",
            ll_path, json.dumps(dataclasses.asdict(t)), obj_path, asm_path or ""]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
         os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-6:])
        raise CrossBuildError(f"LLVM failed for target {t.name} (exit {r.returncode}):\n{tail}")


def _emit_main(argv: list[str]) -> None:
    from kiln.codegen.jit import emit_assembly, emit_object, optimize

    ll_path, target_json, obj_path, asm_path = argv
    t = Target(**json.loads(target_json))
    with open(ll_path) as f:
        mod = optimize(f.read(), t)
    with open(obj_path, "wb") as f:
        f.write(emit_object(mod, t))
    if asm_path:
        with open(asm_path, "w") as f:
            f.write(emit_assembly(mod, t))


def link(t: Target, objects: list[str], exe: str, workdir: str) -> None:
    """Statically link objects with the driver (and, for SME, the lazy-save stub) using the cross GCC."""
    gcc = TOOLCHAINS[t.arch][0]
    sources = [DRIVER_C]
    if "+sme" in t.features.split(","):
        stub = os.path.join(workdir, "sme_stub.c")
        with open(stub, "w") as f:
            f.write(SME_STUB_C)
        sources.append(stub)
    cmd = [gcc, "-O2", "-static", "-o", exe, *sources, *objects, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CrossBuildError(f"linking for {t.name} failed: {' '.join(cmd)}\n{r.stderr.strip()[-2000:]}")


def spec_lines(binary: CrossBinary, input_paths: list[str], output_paths: list[str]) -> list[str]:
    """The driver's SPEC file (see driver.c)."""
    lines = [f"weights {binary.weights} {os.path.getsize(binary.weights)}", f"arena {binary.arena_bytes}"]
    lines += [f"input {p} {s.nbytes}" for p, s in zip(input_paths, binary.inputs)]
    lines += [f"output {p} {s.nbytes}" for p, s in zip(output_paths, binary.outputs)]
    return lines
