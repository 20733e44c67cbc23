"""The host JIT's codegen and LLVM work spread over the machine's cores.

`split_kernels` deals the model's distinct kernels (one function per structure, `module.distinct_kernels`) into
compile units; `start_units` forks one worker process per core (the scheduled program is inherited, nothing is
pickled) that take units from a shared counter one at a time — LLVM IR text (`module.build_unit_text`), -O3,
object — while this process plans memory and builds the entry module (`kiln_main` calling the kernels as external
symbols; `UnitBuild.finish`). The objects come back through a pipe; MCJIT links them (`jit.LoadedObject`). A unit a
worker did not deliver (it crashed, or raised) is built here, so its error surfaces as if compiled in one process.

Kernels are dealt largest first (those that may form a kernel family, `family_key`, together: codegen/families.py
merges them within a module), each to the unit with the least work so far (by `emitted_size`, which tracks their
codegen + LLVM time), so the units cost about the same (less where a family merges); several units per process
leave at most one small unit of imbalance at the end (dealt round-robin in program order, resnet50's largest unit
cost three times its smallest).
A model with few kernels, a debug build (`bounds_check`), or a single core keeps one module
(cross targets always do: their object is linked with a C driver)."""
from __future__ import annotations

import os
import pickle
import re
import signal
import time
from collections.abc import Callable
from typing import Any

from kiln.codegen import jit
from kiln.codegen.families import merge_families
from kiln.codegen.module import build_module_text, build_unit_text, distinct_kernels, kernel_key
from kiln.kernel.build import Program
from kiln.kernel.ir import Assign, Const, If, Kernel, Loop, Store, walk
from kiln.runtime.memory import MemoryPlan
from kiln.target import Target

MIN_KERNELS = 8      # distinct kernels below which one module compiles faster than forking
UNITS_PER_JOB = 2    # compile units per process: finer balances better, each unit costs a module's fixed overhead
# (2 vs 4, interleaved cold compiles on 2 cores, Emerald Rapids: resnet50 2.24 vs 2.29 s and 3.09 vs 3.15 CPU-s,
# mobilenetv2 1.74 vs 1.80 s, bert_base codegen + LLVM 0.25 vs 0.27 s; 1 per process balanced worse: resnet50 2.55 s)
JOBS_ENV = "KILN_COMPILE_JOBS"
RELOC = "static"     # objects linked with each other: absolute addresses (jit.target_machine)


def compile_jobs() -> int:
    """Processes the LLVM work may use: $KILN_COMPILE_JOBS, else the CPUs this process may run on."""
    env = os.environ.get(JOBS_ENV)
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def split_kernels(prog: Program, jobs: int, bounds_check: bool = False) -> list[list[int]]:
    """Compile units: lists of indices of distinct kernels. One unit (all kernels, the single module) unless the
    work is worth spreading over `jobs` processes. Kernels that may share a function (`family_key`) go to one unit."""
    distinct, _ = distinct_kernels(prog)
    if jobs < 1 or bounds_check or not hasattr(os, "fork") or len(distinct) < MIN_KERNELS:
        jobs = 1
    groups: dict[str, list[int]] = {}
    for i in distinct:
        groups.setdefault(family_key(prog.kernels[i]), []).append(i)
    n = min(len(groups), jobs * UNITS_PER_JOB) if jobs > 1 else 1
    if n == 1:
        return [distinct]
    units: list[list[int]] = [[] for _ in range(n)]
    work = [0] * n
    size = {i: KERNEL_OVERHEAD + emitted_size(prog.kernels[i]) for i in distinct}
    # a group at its members' sum: whether they share one function is decided on their IR (resnet50: 4 of 6 groups);
    # counting merged groups at their largest member instead measured no better (resnet50, 12 interleaved compiles)
    cost = {key: sum(size[i] for i in g) for key, g in groups.items()}
    for key in sorted(groups, key=lambda key: -cost[key]):  # stable: ties in program order
        u = work.index(min(work))
        units[u] += groups[key]
        work[u] += cost[key]
    return [sorted(u) for u in units]


def family_key(k: Kernel) -> str:
    """Kernels whose functions may form one family (codegen/families.py: equal up to constants): the same text up to
    its numbers. A guess made before codegen — the family pass decides on the LLVM IR — so that a family's members
    are compiled in one unit, where they can share."""
    return re.sub(r"\d+", "#", kernel_key(k))


def emitted_size(k: Kernel) -> int:
    """What the codegen emits for `k`, roughly: expression nodes of its stores and assignments, each counted once per
    unrolled copy. Over resnet50's, mobilenetv2's and bert_base's kernels it correlates 0.64–0.82 with their codegen
    + LLVM time (a kernel's own text, where an unrolled loop is one loop, 0.22)."""
    return _emitted(k.body, 1)


KERNEL_OVERHEAD = 1500  # a kernel's fixed cost in emitted_size units (function, parallel wrapper): the fit's intercept


def _emitted(stmts: list, copies: int) -> int:
    n = 0
    for s in stmts:
        if isinstance(s, Loop):
            unrolled = s.kind == "unroll" and isinstance(s.extent, Const)
            n += copies + _emitted(s.body, copies * (int(s.extent.value) if unrolled else 1))
        elif isinstance(s, If):
            n += copies + _emitted(s.body, copies) + _emitted(s.orelse, copies)
        elif isinstance(s, Store):
            n += copies * (len(walk(s.value)) + len(s.index))
        elif isinstance(s, Assign):
            n += copies * (len(walk(s.value)) + 1)
        else:
            n += copies
    return n


class UnitBuild:
    """Compile units being built by forked processes (`start_units`) while this process goes on with the memory plan;
    `finish` builds the entry module here and collects the units' objects."""

    def __init__(self, prog: Program, units: list[list[int]], target: Target, jobs: int, families: bool) -> None:
        self.prog, self.units, self.target, self.families = prog, units, target, families
        self.counter = _Counter()
        # this process builds no unit itself: its memory plan and entry module overlap the workers' LLVM time, and
        # llvmlite IR built here would leave ~10^5 objects in reference cycles, whose collection after the compile
        # cost resnet50 0.2 s
        self.workers = [_fork(lambda: _work(prog, units, target, families, self.counter.take))
                        for _ in range(min(jobs, len(units)))]

    def finish(self, plan: MemoryPlan) -> tuple[list[bytes], list[str], dict[str, float]]:
        """The entry module's object first, then one object per unit; the function each kernel call calls; and the
        CPU seconds spent in codegen and LLVM over all processes."""
        prog, units, target, families, workers = self.prog, self.units, self.target, self.families, self.workers
        try:
            t = time.process_time()
            text, called = build_module_text(prog, plan, target, split=True)
            t1 = time.process_time()
            entry = jit.emit_object(jit.optimize(text, target, jit.opt_level(prog.dims is not None)), target,
                                    reloc=RELOC)
            cpu = {"codegen": t1 - t, "llvm": time.process_time() - t1}
            done: dict[int, list] = {}
            while workers:
                done.update({u: rest for u, *rest in _collect(*workers.pop())})
        finally:  # an error here: stop the workers (they are only building what this build will not use)
            self.close()
        for u in range(len(units)):  # a unit no worker delivered (one crashed, or raised): built here, errors raised
            if u not in done:
                again = iter([u, len(units)]).__next__
                done.update({v: rest for v, *rest in _work(prog, units, target, families, again)})
        for _, codegen_s, llvm_s in done.values():
            cpu["codegen"] += codegen_s
            cpu["llvm"] += llvm_s
        return [entry] + [done[u][0] for u in range(len(units))], called, cpu

    def close(self) -> None:
        """Stop the workers still running (the build is abandoned: an error in this process)."""
        for pid, fd in self.workers:
            os.close(fd)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        self.workers = []


def start_units(prog: Program, units: list[list[int]], target: Target, jobs: int, families: bool = True) -> UnitBuild:
    """Fork the processes that build the compile units; the kernels must be scheduled already. `families`: a unit's
    functions equal up to constants compiled once (codegen/families.py)."""
    return UnitBuild(prog, units, target, jobs, families)


class _Counter:
    """The next unit to build, shared by the processes forked after it was made (an anonymous shared mapping)."""

    def __init__(self) -> None:
        import multiprocessing
        self.value = multiprocessing.get_context("fork").Value("l", 0)

    def take(self) -> int:
        with self.value.get_lock():
            u = self.value.value
            self.value.value = u + 1
            return u


def _work(prog: Program, units: list[list[int]], target: Target, families: bool,
          take: Callable[[], int]) -> list[tuple]:
    """Build the units `take` hands out until it hands out len(units): (unit, object, codegen s, llvm s) each."""
    out = []
    while (u := take()) < len(units):
        t = time.process_time()
        text = build_unit_text(prog, units[u], target)
        if families:
            text = merge_families(text)
        t1 = time.process_time()
        obj = jit.emit_object(jit.optimize(text, target, jit.opt_level(prog.dims is not None)), target, reloc=RELOC)
        out.append((u, obj, t1 - t, time.process_time() - t1))
    return out


def _fork(job: Callable[[], Any]) -> tuple[int, int]:
    """Run `job` in a forked child that pickles its result into a pipe; (pid, read end)."""
    r, w = os.pipe()
    pid = jit.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        code = 0
        try:
            data = pickle.dumps(job(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001 - the parent rebuilds what it did not get, and raises there
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _collect(pid: int, fd: int) -> list[tuple]:
    """A worker's results; [] if it failed (its units are then built by the caller)."""
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        return []
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - a truncated pickle: rebuild here
        return []
