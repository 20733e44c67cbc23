"""An ISA described as data: what codegen and schedules need to know about a CPU.

Named targets (`resolve(name)`, `resolve("riscv64-rvv:sifive-x280")`, `resolve(name, cpu=...)`):

| name | ISA | vectors | default cpu |
|---|---|---|---|
| host, avx512, avx2, sse | this machine (x86-64), narrowed | fixed 512 / 256 / 128 | the host's |
| aarch64-neon | AArch64 NEON | fixed 128 | neoverse-n1 |
| aarch64-sve | AArch64 SVE | scalable, min 128 | neoverse-v1 |
| aarch64-sve2 | AArch64 SVE2 | scalable, min 128 | neoverse-v2 |
| aarch64-sme | AArch64 SVE2 + SME | scalable, min 128 | neoverse-v2 |
| riscv64-rvv | RISC-V 64 RVV 1.0 | scalable, min = the cpu's VLEN (128) | generic-rv64 |

`aarch64-sme` is SVE2 code in which GEMM register tiles that fit (kiln/codegen/sme.py: MR 2–16, contiguous
operands and stores) accumulate in ZA with `fmopa` outer products, in outlined streaming-mode functions.

A scalable target's `vector_bits` is the *minimum* register width: schedules size tiles for it, and the code is
correct at every larger width (strip-mined loops, kiln/codegen/scalable.py).

`validate_target` checks a target before LLVM sees it: LLVM aborts the whole process (no exception) on an unknown
RISC-V CPU, `+zvl…b` without `+v`, or scalable vectors without SVE / V, so Kiln checks these rules itself and
then probes the target in a subprocess (once per target) instead of in this process."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from dataclasses import dataclass, replace

from kiln.errors import TargetError


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: str            # LLVM feature string, e.g. "+avx512f,+fma"
    vector_bits: int         # width of one vector register
    vector_registers: int    # architectural vector registers
    has_fma: bool = True
    fma_chains: int = 8      # independent FMA chains that keep the FMA pipes busy (latency 4 × 2 pipes)
    scalable: bool = False   # SVE / RVV: vector_bits is the minimum
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 32 * 1024 * 1024

    def lanes(self, dtype_bits: int = 32) -> int:
        """How many elements of a dtype one vector register holds."""
        return max(1, self.vector_bits // dtype_bits)

    @property
    def key(self) -> str:
        return f"{self.triple}|{self.cpu}|{self.features}|{self.vector_bits}"

    @property
    def arch(self) -> str:
        """x86_64, aarch64 or riscv64 (the triple's first component)."""
        return self.triple.split("-", 1)[0]

    @property
    def vscale_block_bits(self) -> int:
        """Bits per `vscale` unit in LLVM's scalable types: SVE 128 (vscale = VL/128), RVV 64 (vscale = VLEN/64)."""
        return 64 if self.arch == "riscv64" else 128

    @property
    def fixed_dot_tiles(self) -> bool:
        """Does the target run the int8/bf16 dot-product tiles (and their packed weights, blocked convs and
        microkernels) in fixed-width registers: every fixed-width target, and AArch64's scalable ones in their NEON
        registers (every SVE CPU has NEON); not RVV, whose integer anchors keep the plain loops."""
        return not self.scalable or self.arch == "aarch64"

    def scalable_count(self, lanes: int) -> int:
        """N of `<vscale x N x T>` holding `lanes` elements at the minimum vector width (at least 1)."""
        return max(1, lanes * self.vscale_block_bits // self.vector_bits)


# the host as if its widest vectors were this many bits (256: as on an AVX2 machine, 128: SSE) — `host` below
HOST_BITS_ENV = "KILN_HOST_VECTOR_BITS"


@functools.cache
def host() -> Target:
    """The machine we run on; vector width from its widest usable feature (AVX-512 → AVX2 → SSE).

    With `KILN_HOST_VECTOR_BITS=256` (or 128) in the environment, an x86 host is taken to be as wide as that: its
    wider features off (AVX-512 and AMX; for 128 also AVX), as `host_with` limits it — so AVX-512 is an emit-only
    width (lowered and emitted, refused to run) and every "host" build is AVX2 code, as on an AVX2 machine of the
    same family. How this repository's tests run as on an AVX2 host on an AVX-512 one (README)."""
    t = _native_host()
    want = os.environ.get(HOST_BITS_ENV, "").strip()
    if not want:
        return t
    if want not in ("128", "256", "512") or t.arch != "x86_64" or int(want) > t.vector_bits:
        raise TargetError(f"{HOST_BITS_ENV}={want!r}: an x86 host takes 128, 256 or 512, no wider than it is (this "
                          f"host: {t.arch}, {t.vector_bits}-bit vectors)")
    return _narrowed(t, int(want), "host") if int(want) < t.vector_bits else t


def _native_host() -> Target:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    feats = llvm.get_host_cpu_features()
    on = {k for k, v in feats.items() if v}
    if "avx512f" in on:
        bits, regs = 512, 32
    elif "avx2" in on or "avx" in on:
        bits, regs = 256, 16
    else:
        bits, regs = 128, 16
    caches = _host_caches()
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), feats.flatten(), bits, regs,
                  has_fma="fma" in on, **{f"l{lvl}_bytes": size for lvl, size in caches.items()})


def _narrowed(h: Target, vector_bits: int, name: str) -> Target:
    """`h` with the features wider than `vector_bits` turned off (`_WIDTH_DROPS`)."""
    drop = _WIDTH_DROPS[vector_bits]
    feats = ",".join(("-" + f[1:]) if f[1:].startswith(drop) else f for f in h.features.split(","))
    return replace(h, name=name, features=feats, vector_bits=vector_bits, vector_registers=16,
                   has_fma=h.has_fma and vector_bits > 128)


def _host_caches() -> dict[int, int]:
    """Per-core data (or unified) cache sizes by level from Linux sysfs (Zen 3: 32 KiB, 512 KiB, 32 MiB), for the
    schedules' blocking; {} elsewhere (the Target defaults stand)."""
    from pathlib import Path

    out: dict[int, int] = {}
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, kind, text = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if kind in ("Data", "Unified") and level in ("1", "2", "3") and digits.isdigit():
            out[int(level)] = int(digits) * unit
    return out


# the x86 vector widths Kiln generates code for, by the name `resolve` takes
X86_WIDTHS: dict[str, int] = {"avx512": 512, "avx2": 256, "sse": 128}
# what an x86 host needs to run each width's code (and what an emit-only target of that width turns on)
_WIDTH_FEATURES: dict[int, tuple[str, ...]] = {
    512: ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx2", "avx", "fma", "f16c", "bmi2"),
    256: ("avx2", "avx", "fma", "f16c", "bmi2"),
    128: ("sse4.2",),
}


# features turned off to limit the host to a width: the wider ones and every feature that implies them (LLVM turns
# AVX back on for +f16c/+vaes/+vpclmulqdq/+sha512/..., and the "SSE" code was then VEX code that an SSE-only CPU
# faults on; legacy-SSE code also faults on a misaligned folded load where VEX code does not)
_WIDER_THAN_256 = ("avx512", "avx10", "amx", "evex512")
_WIDTH_DROPS: dict[int, tuple[str, ...]] = {
    256: _WIDER_THAN_256,
    128: _WIDER_THAN_256 + ("avx", "fma", "f16c", "vaes", "vpclmulqdq", "xop", "sha512", "sm3", "sm4"),
}


def host_with(vector_bits: int) -> Target:
    """The host limited to `vector_bits`-wide vectors (AVX2 / SSE fallbacks, ablations, the per-width tests).

    A width wider than the host's own is an *emit-only* target (AVX-512 on an AVX2 host, AVX2 or AVX-512 on an
    SSE-only one — a VM's baseline x86-64 CPU): same triple and caches, the width's features turned on, cpu
    `x86-64-v4` / `x86-64-v3`; Kiln lowers it and emits objects and assembly for it, and `kiln.compile` refuses to
    load its code here (`runs_here`)."""
    h = host()
    if vector_bits == h.vector_bits:
        return h
    if vector_bits > h.vector_bits:
        if h.arch != "x86_64":
            raise TargetError(f"the x86 widths are targets of an x86 host; this host ({h.cpu}) is {h.arch}")
        if vector_bits not in (256, 512):
            raise TargetError(f"{vector_bits} bits is no x86 vector width (128, 256, 512)")
        feats = ",".join(f"+{f}" for f in _WIDTH_FEATURES[vector_bits])
        name, cpu, regs = ("avx512", "x86-64-v4", 32) if vector_bits == 512 else ("avx2", "x86-64-v3", 16)
        return replace(h, name=name, cpu=cpu, features=feats, vector_bits=vector_bits, vector_registers=regs,
                       has_fma=True)
    return _narrowed(h, vector_bits, f"host-{vector_bits}")


@functools.cache
def features_on(features: str) -> frozenset[str]:
    """The LLVM features a feature string turns on ("+avx512bf16,-amx-tile" → {"avx512bf16"}), parsed once per
    string: codegen asks for every bf16 store and dot product it emits."""
    return frozenset(f.strip()[1:] for f in features.split(",") if f.strip().startswith("+"))


def vnni_widths(target: Target | None) -> tuple[int, ...]:
    """The int32 lane counts of the x86 `vpdpbusd` forms `target` has, widest first."""
    if target is None or target.arch != "x86_64":
        return ()
    f = features_on(target.features)
    out: list[int] = []
    if "avx512vnni" in f and target.vector_bits >= 512:
        out.append(16)
    if ("avx512vnni" in f and "avx512vl" in f and target.vector_bits >= 256) or "avxvnni" in f:
        out += [8, 4]
    return tuple(out)


def dpbf16_widths(target: Target | None) -> tuple[int, ...]:
    """The float32 lane counts of the bf16 pair dot products `target` has, widest first: x86 `vdpbf16ps`
    zmm/ymm/xmm, AArch64 BF16 `bfdot` v.4s (NEON, on SVE targets too); none elsewhere."""
    if target is None:
        return ()
    f = features_on(target.features)
    if target.arch == "aarch64":  # NEON's, also on an SVE target (the tile is then a fixed-width loop)
        return (4,) if "bf16" in f else ()
    if target.arch != "x86_64" or "avx512bf16" not in f:
        return ()
    out: list[int] = [16] if target.vector_bits >= 512 else []
    if "avx512vl" in f and target.vector_bits >= 256:
        out += [8, 4]
    return tuple(out)


# the AMX units Kiln's tile kernels use (kiln/ukernels/amx.py): the tile registers and both dot products
AMX_FEATURES = frozenset({"amx-tile", "amx-bf16", "amx-int8"})


def with_features(t: Target, *names: str) -> Target:
    """`t` with these features turned on (an emit-only CPU variant: an AVX512_BF16 CPU built for on any x86 host)."""
    kept = [f for f in t.features.split(",") if f and f[1:] not in names]
    return replace(t, name=f"{t.name}+{'+'.join(names)}", features=",".join(kept + [f"+{n}" for n in names]))


def without_features(t: Target, *names: str) -> Target:
    """`t` with these features turned off (a CPU variant: Zen 3's AVX2 without VNNI, built on any x86 host)."""
    kept = [f for f in t.features.split(",") if f and f[1:] not in names]
    return replace(t, name=f"{t.name}-{'-'.join(names)}", features=",".join(kept + [f"-{n}" for n in names]))


def missing_features(t: Target) -> list[str]:
    """The features `t`'s code uses that this machine lacks ([] when its code runs here)."""
    h = host()
    if t.triple != h.triple:
        return [f"the {t.arch} ISA"]
    if t.arch != "x86_64":
        return []
    have = _features(h)
    want = _features(t)
    need = [f for f, on in want.items() if on and not have.get(f, False)]
    return need


def runs_here(t: Target) -> bool:
    """Can this process load and run code generated for `t`?"""
    return not missing_features(t)


# -- cross targets ---------------------------------------------------------------------------------------------------
AARCH64 = "aarch64-unknown-linux-gnu"
RISCV64 = "riscv64-unknown-linux-gnu"
RV64GC = "+m,+a,+f,+d,+c"

# CPUs Kiln accepts per architecture, each accepted by llvmlite 0.50's LLVM 22 (checked by tests/test_cross_isa.py
# in a subprocess). RISC-V: the minimum VLEN each CPU implies (LLVM assumes it: code for sifive-x280 needs VLEN
# ≥ 512); None = no vector unit of its own (Kiln adds +v).
KNOWN_CPUS: dict[str, dict[str, int | None]] = {
    "aarch64": {"generic": None, "cortex-a76": None, "cortex-a78": None, "cortex-x2": None, "neoverse-n1": None,
                "neoverse-n2": None, "neoverse-v1": None, "neoverse-v2": None, "neoverse-v3": None, "a64fx": None,
                "apple-m1": None, "apple-m4": None},
    "riscv64": {"generic-rv64": 128, "sifive-x280": 512, "sifive-p670": 128, "spacemit-x60": 256,
                "sifive-u74": None},
    "x86_64": {"x86-64": None, "x86-64-v2": None, "x86-64-v3": None, "x86-64-v4": None, "haswell": None,
               "skylake-avx512": None, "icelake-server": None, "sapphirerapids": None, "znver3": None,
               "znver4": None, "znver5": None},
}

_CROSS: dict[str, Target] = {
    "aarch64-neon": Target("aarch64-neon", AARCH64, "neoverse-n1", "+neon,+fp-armv8", 128, 32),
    "aarch64-sve": Target("aarch64-sve", AARCH64, "neoverse-v1", "+neon,+sve", 128, 32, scalable=True),
    "aarch64-sve2": Target("aarch64-sve2", AARCH64, "neoverse-v2", "+neon,+sve,+sve2", 128, 32, scalable=True),
    "aarch64-sme": Target("aarch64-sme", AARCH64, "neoverse-v2", "+neon,+sve,+sve2,+sme", 128, 32, scalable=True),
    "riscv64-rvv": Target("riscv64-rvv", RISCV64, "generic-rv64", RV64GC + ",+v", 128, 32, scalable=True),
}


def with_cpu(t: Target, cpu: str) -> Target:
    """A cross target on another CPU; for RISC-V the minimum vector width follows the CPU's VLEN."""
    if t.arch not in KNOWN_CPUS or t.name in ("host", "host-256", "host-128", "avx512"):
        raise TargetError(f"--cpu applies to the cross targets ({', '.join(_CROSS)}), not to {t.name!r}")
    known = KNOWN_CPUS[t.arch]
    if cpu not in known:
        raise TargetError(f"unknown {t.arch} CPU {cpu!r}; known: {', '.join(known)}")
    bits = t.vector_bits
    if t.arch == "riscv64" and known[cpu]:
        bits = int(known[cpu])
    return replace(t, cpu=cpu, vector_bits=bits, name=f"{t.name}:{cpu}")


def names() -> list[str]:
    return ["host", "avx512", "avx2", "sse", *_CROSS]


def resolve(target: str | Target, cpu: str | None = None) -> Target:
    """A Target from a name (`aarch64-sve`, `riscv64-rvv:sifive-x280`, ...), validated; `cpu` overrides its CPU."""
    if isinstance(target, Target):
        t = target
    else:
        name, _, cpu_in_name = target.partition(":")
        cpu = cpu or cpu_in_name or None
        named = {"host": host, **{w: functools.partial(host_with, bits) for w, bits in X86_WIDTHS.items()}}
        if name in named:
            if cpu:
                raise TargetError(f"target {name!r} is this host; a CPU can only be chosen for a cross target "
                                  f"({', '.join(_CROSS)})")
            return named[name]()
        if name not in _CROSS:
            raise TargetError(f"unknown target {target!r}; known: {', '.join(names())}")
        t = _CROSS[name]
    if cpu and cpu != t.cpu:
        t = with_cpu(t, cpu)
    if t.triple != host().triple:
        validate_target(t)
    return t


def _features(t: Target) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for f in filter(None, (x.strip() for x in t.features.split(","))):
        if f[0] not in "+-":
            raise TargetError(f"target {t.name}: feature {f!r} must start with + or - (in {t.features!r})")
        out[f[1:]] = f[0] == "+"
    return out


def validate_target(t: Target) -> None:
    """Raise TargetError (never let LLVM abort the process) if LLVM cannot generate code for `t`."""
    arch = t.arch
    if arch not in KNOWN_CPUS:
        raise TargetError(f"target {t.name}: unsupported architecture {arch!r} (triple {t.triple}); "
                          f"Kiln knows {', '.join(KNOWN_CPUS)}")
    if t.cpu not in KNOWN_CPUS[arch] and not (arch == "x86_64" and t.cpu == host().cpu):
        raise TargetError(f"target {t.name}: unknown {arch} CPU {t.cpu!r}; known: {', '.join(KNOWN_CPUS[arch])}")
    feats = _features(t)
    zvl = [f for f, on in feats.items() if on and f.startswith("zvl")]
    if arch == "riscv64" and zvl and not (feats.get("v") or any(feats.get(f) for f in feats if f.startswith("zve"))):
        raise TargetError(f"target {t.name}: {', '.join('+' + z for z in zvl)} needs the vector extension (+v)")
    if t.scalable:
        need = {"aarch64": "sve", "riscv64": "v"}.get(arch)
        if need is None or not feats.get(need):
            raise TargetError(f"target {t.name}: scalable vectors need {'+' + need if need else 'SVE or RVV'} in "
                              f"the features ({t.features!r})")
    if t.vector_bits < 64 or t.vector_bits & (t.vector_bits - 1):
        raise TargetError(f"target {t.name}: vector_bits must be a power of two ≥ 64, got {t.vector_bits}")
    problem = _probe(t.triple, t.cpu, t.features, t.scalable)
    if problem:
        raise TargetError(f"target {t.name}: LLVM cannot generate code for triple {t.triple}, cpu {t.cpu}, "
                          f"features {t.features}: {problem}")


_PROBE = r"""
import sys
import llvmlite.binding as llvm
llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
triple, cpu, feats, scalable = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
vt = "<vscale x 4 x float>" if scalable else "<4 x float>"
ir = f'''define void @f(ptr %p) {{
  %v = load {vt}, ptr %p, align 4
  %w = fadd {vt} %v, %v
  store {vt} %w, ptr %p, align 4
  ret void
}}'''
tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=feats, opt=2, reloc="pic")
m = llvm.parse_assembly(ir)
m.triple = triple
tm.emit_object(m)
print("ok")
"""


@functools.cache
def _probe(triple: str, cpu: str, features: str, scalable: bool) -> str:
    """'' if LLVM (in a child process: it may abort) emits an object for the target, else what went wrong."""
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE, triple, cpu, features, "1" if scalable else "0"],
                           capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "the LLVM probe timed out"
    err = r.stderr.strip()
    if r.returncode != 0 or "ok" not in r.stdout:
        return f"LLVM failed (exit {r.returncode}): {err.splitlines()[-1] if err else 'no message'}"
    if "not a recognized" in err or "not a recognised" in err:
        return err.splitlines()[0]
    return ""
