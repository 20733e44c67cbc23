"""What the tuner tunes: one kernel's compute definition, identified by a signature; and the machine it is tuned
for, identified by a target key.

The workload signature is a hash of the kernel's compute definitions as the schedules see them — its computes
(axes, extents, bodies over the canonical buffer names b0..bn), the lowering's hints (panel width, axes, layout;
not the node's name), and its buffers' dtypes and shapes — so ResNet's repeated blocks, or the same layer in two
models, share one signature and are tuned once. Not part of it: the weights' values, the kernel's name, and the
requested strategy's fallbacks. The requested strategy *is* part of it (a kernel built under `strategy="ukernel"`
is tuned among microkernel schedules only; under "direct", both strategies are in its space).

The target key names the machine kind a measurement is valid for: ISA and CPU name, the LLVM feature string,
vector width and registers, the cache sizes of each level, and the thread count. A record is applied only to a
compile whose target key is the same (kiln/tune/apply.py)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.kernel.ir import Kernel, Load, Reduce, walk
from kiln.target import Target
from kiln.tune.sizes import flops_at, size_distribution

# hints that name a node rather than describe the computation
_NAME_HINTS = ("node", "op")


def definition(k: Kernel) -> str:
    """The canonical text of an unscheduled kernel's computation (no kernel name, no node names)."""
    lines = [f"arg {b.name}: {b.dtype}{list(b.shape)}" for b in k.args]
    lines += [f"scratch {b.name}: {b.dtype}{list(b.shape)}" for b in k.scratch]
    for c in k.computes:
        hints = {h: v for h, v in sorted(c.hints.items()) if h not in _NAME_HINTS}
        lines.append(f"{c}   hints {hints!r}")
    sizes = size_distribution(k)
    if sizes:  # a symbolic kernel's time is its geometric mean over these (tune/sizes.py)
        lines.append(f"sizes {sizes}")
    return "\n".join(lines)


def signature(k: Kernel) -> str:
    return hashlib.sha256(definition(k).encode()).hexdigest()[:24]


def kernel_class(k: Kernel) -> str:
    """The kernel's class, for the cost model and its per-class reports: matmul, conv, depthwise, winograd_gemm,
    winograd_transform, reorder, pool, reduce, elementwise; an anchor's class carries its precision (matmul_int8,
    conv_bf16, ...): the dot-product tiles are another cost landscape."""
    hints: dict = {}
    for c in k.computes:
        hints.update(c.hints)
    op = str(hints.get("op", ""))
    low = "_int8" if op.startswith("Q") else "_bf16" if any(b.dtype == "bfloat16" for b in k.args) else ""
    if op.startswith("Q"):
        op = op[1:]
    if hints.get("depthwise"):
        return "depthwise" + low
    if op == "WinogradProduct":
        return "winograd_gemm" + low
    if op in ("MatMul", "PackedMatMul"):
        return "matmul" + low
    if op in ("Conv", "PackedConv"):
        return "conv" + low
    if "winograd" in hints:
        return "winograd_transform"
    if "reorder" in hints:
        return "reorder"
    reds = [e for c in k.computes for e in walk(c.body) if isinstance(e, Reduce)]
    if reds:
        return "pool" if any(len(r.axes) >= 2 for r in reds) else "reduce"
    return "elementwise"


def target_key(target: Target, threads: int) -> str:
    return json.dumps(target_description(target, threads), sort_keys=True, separators=(",", ":"))


def target_description(target: Target, threads: int) -> dict:
    return {"triple": target.triple, "cpu": target.cpu, "features": target.features,
            "vector_bits": target.vector_bits, "vector_registers": target.vector_registers,
            "l1": target.l1_bytes, "l2": target.l2_bytes, "l3": target.l3_bytes, "threads": int(threads)}


def fresh(k: Kernel) -> Kernel:
    """An unscheduled copy of `k` to schedule again (schedules add scratch buffers and extern IR to theirs)."""
    return Kernel(k.name, list(k.args), list(k.scratch), list(k.computes), flops=k.flops)


@dataclass
class Workload:
    """One distinct kernel of a model: its signature, an unscheduled copy, and how often the model runs it."""
    sig: str
    kernel: Kernel
    klass: str
    count: int
    names: list[str]   # the model's kernels with this signature

    @property
    def flops(self) -> float:
        """Its flops — over symbolic dims, their geometric mean over the sizes it is measured at (as its time is)."""
        sizes = size_distribution(self.kernel)
        if not sizes:
            return self.kernel.flops
        flops = [flops_at(self.kernel, s) for s in sizes]
        return float(np.exp(np.mean(np.log(flops)))) if min(flops) > 0 else 0.0

    def outputs(self) -> list[str]:
        """Argument buffers the kernel writes."""
        written = {c.out for c in self.kernel.computes}
        return [b.name for b in self.kernel.args if b.name in written]


def tunable(k: Kernel) -> bool:
    """Kernels the tuner measures alone: at least one compute, and arguments that random values cannot send out of
    bounds — floating-point ones (bfloat16 included), and integer ones only where no load reads them as an index
    (an 8-bit activation or weight, an int32 accumulator addend: values, not addresses)."""
    indices = {x.buf for c in k.computes for e in walk(c.body) if isinstance(e, Load)
               for ix in e.index for x in walk(ix) if isinstance(x, Load)}
    return bool(k.computes) and all(b.dtype == "bfloat16" or np.dtype(b.dtype).kind == "f"
                                    or (np.dtype(b.dtype).kind in "iu" and b.name not in indices) for b in k.args)


def workloads_of(kernels: Sequence[Kernel]) -> list[Workload]:
    """The distinct kernels of a program, by signature, in first-use order."""
    out: dict[str, Workload] = {}
    for k in kernels:
        s = signature(k)
        if s in out:
            out[s].count += 1
            out[s].names.append(k.name)
        else:
            out[s] = Workload(s, fresh(k), kernel_class(k), 1, [k.name])
    return list(out.values())
