"""Cross-ISA builds: compile a model for AArch64 (NEON/SVE/SVE2/SME) or RISC-V (RVV), link it with a small C
driver using the cross GCC, and run it under qemu-user at a chosen vector length.

The stable API (also used by `kiln bench --isa` and the QEMU instruction-count plugin):

    binary = kiln.cross.build_binary(model, "riscv64-rvv", workdir, strategy="direct")  # -> CrossBinary
    outputs, stderr = kiln.cross.run_qemu(binary, feeds, vlen=256, plugin_args=None)

`build_binary(model, target, workdir, strategy="direct", options=None, precision="fp32", bounds_check=False)`:
`model` is an onnx.ModelProto, a path or `zoo:NAME`; `target` a name accepted by `kiln.target.resolve`
("aarch64-sve", "riscv64-rvv:sifive-x280", ...) or a `Target`. Compiles with ONE thread (the driver's
`kiln_parallel` runs chunks serially), writes into `workdir`: `model.o` (the object), `model.s` (its assembly),
`weights.bin`, `driver` (the static executable). Raises `kiln.errors.CrossToolError` when the cross GCC is missing,
`kiln.errors.TargetError` for a target LLVM cannot lower. `strategy`: "direct" (emitted code) or "ukernel"
(MatMul/Conv on the target's hand-written microkernels, kiln/ukernels/aarch64.py and riscv.py; anchors they do not
apply to stay direct); the others raise ValueError. `bounds_check=True`: the debug build (every access checked,
kiln/codegen/bounds.py); the driver exits with 5 on a recorded violation and `run_qemu` raises `CrossRunError`
naming the kernel call, buffer and index (fixed-width targets only: ValueError for a scalable one).

`CrossBinary` fields: `target` (Target), `workdir`, `exe` (path of the static executable), `obj`, `asm`,
`weights`, `arena_bytes`, `inputs` / `outputs` (lists of IOSpec: name, dtype, shape), `vector_loops`
({"scalable": n, "fixed": n}, plus "sme": n ZA outer-product tiles on aarch64-sme: how the vector loops
were emitted), `kernel_functions`, `compile_s`, `strategies` ({node: "direct" | "ukernel"}: how each MatMul/Conv
was actually built).

`run_qemu(binary, feeds, vlen=None, plugin_args=None, timeout=600)`: writes the inputs, runs the executable
under `qemu-riscv64` / `qemu-aarch64` with the vector length `vlen` in bits (RVV VLEN 128–1024; SVE 128–2048;
None: the qemu CPU's default), returns `(outputs, stderr_text)`. `plugin_args` is a list of extra qemu
arguments inserted before the program (e.g. ["-plugin", "/path/libcount.so,arg=1", "-d", "plugin",
"-D", "/tmp/log"]). Raises `CrossRunError` (with qemu's stderr) on a non-zero exit.
`qemu_command(binary, vlen)` returns the argv it would run (without plugin arguments)."""
from __future__ import annotations

from kiln.cross.build import CrossBinary, build_binary, have_toolchain
from kiln.cross.qemu import qemu_command, run_qemu

__all__ = ["CrossBinary", "build_binary", "have_toolchain", "qemu_command", "run_qemu"]
