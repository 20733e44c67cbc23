"""The Linux permission for AMX tile state, requested once per process before any AMX instruction runs.

Linux keeps the 8 KiB of AMX tile data (XFEATURE_XTILEDATA, xstate component 18) out of a process's signal frames
and context switches until the process asks for it: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`. Without
that, the first `ldtilecfg` faults and the kernel kills the process (SIGILL) — no Python exception. The permission
is per process (granted to every thread, including Kiln's pool workers started before the request); the tile
*state* (the configuration `ldtilecfg` loads) is per thread, so every AMX kernel configures its tiles itself
(kiln/ukernels/amx.py). `Executable` calls `ensure()` before it loads code that uses AMX (exe.meta["amx"]), and the
compiler asks `usable()` before it chooses AMX tiles: a kernel without the permission API (< 5.16) or a host
without AMX gets the vdpbf16ps / emulated code instead, never a crash."""
from __future__ import annotations

import ctypes
import functools
import os

from kiln.target import AMX_FEATURES, features_on

SYS_ARCH_PRCTL = 158            # x86-64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


class AMXError(RuntimeError):
    """This process cannot use AMX tiles (no AMX on the CPU, or the kernel refused the tile state)."""


def cpu_has_amx(features: str) -> bool:
    """Does an LLVM feature string include the AMX tile unit with bf16 and int8 dot products?"""
    return AMX_FEATURES <= features_on(features)


@functools.cache
def _request() -> str:
    """'' when the permission is granted (now or earlier), else why not. Cached: the answer holds for the process."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64") or not os.path.exists("/proc/self"):
        return f"AMX needs Linux on x86-64 (this is {platform.system()} on {platform.machine()})"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0:
        err = ctypes.get_errno()
        return f"arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: {os.strerror(err)} (errno {err})"
    granted = ctypes.c_uint64(0)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(granted)) != 0 \
            or not granted.value >> XFEATURE_XTILEDATA & 1:
        return "arch_prctl granted the request but XTILEDATA is not in the permitted xstate components"
    return ""


def usable(features: str) -> bool:
    """Can this process run AMX code for a target with `features` (requests the permission if it can)?"""
    return cpu_has_amx(features) and _request() == ""


def ensure() -> None:
    """Request the AMX tile permission for this process (once); AMXError if it cannot be had."""
    problem = _request()
    if problem:
        raise AMXError(f"cannot run AMX code in this process: {problem}")
