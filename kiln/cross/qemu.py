"""Run a cross-built model under qemu-user at a chosen vector length.

qemu 7.2 (Debian bookworm) runs RVV 1.0 (`-cpu rv64,v=true,vlen=V,elen=64,vext_spec=v1.0`, VLEN 128–1024 here),
SVE/SVE2 (`-cpu max,sve-default-vector-length=BYTES`, 128–2048 bits) and SME (`sme-default-vector-length`);
not SME2 and not vector fp16/bf16."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np

from kiln.cross.build import INSTALL_HINT, TOOLCHAINS, CrossBinary, CrossRunError, CrossToolError, spec_lines
from kiln.target import Target

VLEN_RANGE = {"riscv64": (128, 1024), "aarch64": (128, 2048)}


def check_vlen(t: Target, vlen: int) -> None:
    """ValueError unless qemu can run target `t` at `vlen` bits."""
    lo, hi = VLEN_RANGE[t.arch]
    if vlen < lo or vlen > hi or vlen & (vlen - 1):
        raise ValueError(f"vector length {vlen} for {t.arch}: must be a power of two in [{lo}, {hi}] bits")
    if t.scalable and vlen < t.vector_bits:
        raise ValueError(f"target {t.name} assumes vectors of at least {t.vector_bits} bits (cpu {t.cpu}); "
                         f"cannot run it at {vlen}")
    if not t.scalable and t.arch == "aarch64" and vlen != 128:
        raise ValueError(f"target {t.name} is fixed-width NEON (128 bits); --vlen {vlen} does not apply")


def qemu_command(binary: CrossBinary, vlen: int | None = None) -> list[str]:
    """The qemu-user argv prefix (up to, not including, the program) for `binary` at `vlen` bits."""
    t = binary.target
    qemu = TOOLCHAINS[t.arch][1]
    if t.arch == "riscv64":
        vlen = vlen or max(128, t.vector_bits)
        check_vlen(t, vlen)
        return [qemu, "-cpu", f"rv64,v=true,vlen={vlen},elen=64,vext_spec=v1.0"]
    vlen = vlen or 128
    check_vlen(t, vlen)
    cpu = f"max,sve-default-vector-length={vlen // 8}"
    if "+sme" in t.features.split(","):
        cpu += f",sme-default-vector-length={min(vlen, 2048) // 8}"
    return [qemu, "-cpu", cpu]


def run_qemu(binary: CrossBinary, feeds: dict[str, np.ndarray], vlen: int | None = None,
             plugin_args: list[str] | None = None, timeout: float = 600, repeat: int = 1
             ) -> tuple[list[np.ndarray], str]:
    """Run once (or `repeat` times; outputs of the last run) under qemu; returns (outputs, qemu's stderr)."""
    qemu = TOOLCHAINS[binary.target.arch][1]
    if shutil.which(qemu) is None:
        raise CrossToolError(f"{qemu} not found: install qemu-user ({INSTALL_HINT})")
    cmd = qemu_command(binary, vlen)
    ins = _check_feeds(binary, feeds)
    rundir = tempfile.mkdtemp(prefix="run-", dir=binary.workdir)
    in_paths = [os.path.join(rundir, f"in{i}.bin") for i in range(len(ins))]
    out_paths = [os.path.join(rundir, f"out{i}.bin") for i in range(len(binary.outputs))]
    for p, a in zip(in_paths, ins):
        a.tofile(p)
    spec = os.path.join(rundir, "spec.txt")
    with open(spec, "w") as f:
        f.write("\n".join(spec_lines(binary, in_paths, out_paths)) + "\n")
    argv = cmd + list(plugin_args or []) + [binary.exe, spec, str(repeat)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CrossRunError(f"{' '.join(argv)} timed out after {timeout} s") from None
    if r.returncode == 5 and "kiln_bounds_violation" in r.stderr:  # driver.c: a bounds-checked build's record
        call, buf, index, size, count = (int(v) for v in r.stderr.split("kiln_bounds_violation")[1].split()[:5])
        raise CrossRunError(f"out-of-bounds access in kernel call {call - 1}: buffer {buf}, flat index {index} of "
                            f"{size} elements ({count} violation(s)) — {' '.join(argv)}")
    if r.returncode != 0:
        raise CrossRunError(f"{' '.join(argv)} exited with {r.returncode}:\n{r.stderr.strip()[-3000:]}")
    outs = [np.fromfile(p, dtype=s.dtype).reshape(s.shape) for p, s in zip(out_paths, binary.outputs)]
    shutil.rmtree(rundir, ignore_errors=True)
    return outs, r.stderr


def kiln_main_seconds(stderr: str) -> float | None:
    """The driver's own timing of its last kiln_main call (emulated time, not the target's)."""
    for line in stderr.splitlines():
        if line.startswith("kiln_main_ns "):
            return int(line.split()[1]) / 1e9
    return None


def _check_feeds(binary: CrossBinary, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    names = [s.name for s in binary.inputs]
    unknown = set(feeds) - set(names)
    if unknown:
        raise ValueError(f"unknown input name(s) {sorted(unknown)}; the model's inputs are {names}")
    out = []
    for s in binary.inputs:
        if s.name not in feeds:
            raise ValueError(f"missing input '{s.name}' ({s.dtype}{list(s.shape)})")
        a = np.asarray(feeds[s.name])
        if a.dtype != np.dtype(s.dtype) or tuple(a.shape) != s.shape:
            raise ValueError(f"input '{s.name}' is {a.dtype}{list(a.shape)}, expected {s.dtype}{list(s.shape)}")
        out.append(np.ascontiguousarray(a))
    return out
