"""Step 3b of compiler.lower: the tuned schedules from the database, per kernel, before the kernels are scheduled.

For each kernel of the program: its workload signature (tune/workload.py); the best record of the database for
that signature *and this target key* (CPU, features, caches, threads — records of another machine kind are never
applied); its configuration checked against the kernel's own knob domains by scheduling a copy (a record that no
longer fits — Kiln changed, the knobs moved — is rejected, and the kernel keeps its default schedule). A record
equal to the default schedule changes nothing and is not reported as tuned. Nor is a record equal to the default
*measured when it was tuned*: it says the heuristics won (the search found nothing better, or step 5 put the record
back), so the heuristics of this Kiln apply — were it applied as a configuration, a later change of the heuristics
would leave the kernel pinned to the old ones (gemm_odd at AVX2: a default-won record from before the dot edge kept
its 4-lane last panel, 1.028× the new default).

Returns {kernel index: configuration} and, per kernel that runs a tuned schedule, what `exe.meta["tuned"]`
says about it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.kernel.build import Program
from kiln.schedule.config import Decisions, IllegalConfig
from kiln.target import Target
from kiln.tune.database import TuningDatabase
from kiln.tune.workload import fresh, signature, target_key


@dataclass
class Applied:
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)   # kernel index → knob values
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)     # kernel name → {sig, config, speedup}
    rejected: dict[str, str] = field(default_factory=dict)             # kernel name → why its record was not used


def apply_tuning(prog: Program, db: TuningDatabase | None, target: Target, threads: int,
                 options: dict[str, bool]) -> Applied:
    from kiln.schedule.default import schedule_kernel

    out = Applied()
    if db is None:
        return out
    tkey = target_key(target, threads)
    bests = db.bests(tkey)
    if not bests:
        return out
    for i, k in enumerate(prog.kernels):
        sig = signature(k)
        best = bests.get(sig)
        if best is None:
            continue
        measured = db.default_of(sig, tkey)  # (an indexed lookup, only for kernels that have a record)
        if measured is not None and best.config == measured[0]:
            continue  # the heuristics won when it was tuned: this Kiln's heuristics apply (module docstring)
        dec = Decisions(best.config, strict=True)
        try:
            schedule_kernel(fresh(k), target, threads, options, dec)
            if dec.unused():
                raise IllegalConfig(f"knobs {dec.unused()} do not exist for this kernel")
        except IllegalConfig as e:
            out.rejected[k.name] = str(e)
            continue
        if all(dec.values[kn.name] == kn.default for kn in dec.knobs):
            continue  # the default schedule won
        out.configs[i] = dict(best.config)
        out.tuned[k.name] = {"sig": sig, "config": dict(best.config), "speedup": round(best.speedup, 3)}
    return out
