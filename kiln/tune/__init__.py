"""kiln.tune — schedules searched, not guessed.

    report = kiln.tune.tune(model, budget_s=900)      # `kiln tune MODEL --budget-s 900`
    exe = kiln.compile(model)                          # tuning="auto": the best records for this machine

| module | what |
|---|---|
| `workload.py` | the workload signature (compute definition, shapes, dtypes) and the target key (machine kind) |
| `space.py` | the search space of one kernel, as data: the knobs its schedules decide (kiln/schedule/config.py) |
| `cost.py` | features of a scheduled loop nest; the analytic model; the learned (XGBoost ranking) model |
| `search.py` | the evolutionary search of one kernel, filtered by the cost model, verified against the default |
| `measure.py` | one candidate built alone and timed in a child process, with a time limit, checked |
| `database.py` | SQLite: every measurement (failures too) and each workload's best, per target |
| `distributed.py` | candidate compilation on Ray (local by default, or a cluster) |
| `tuner.py` | the whole model: workloads deduplicated, the budget shared by their weight, progress, Ctrl-C |
| `verify.py` | step 5 of a tuning run: the model built with and without its records; records that slow it revert |
| `apply.py` | compiler step 3b: the best records applied to a program's kernels |

This package sits below kiln/compiler.py: the compiler imports it, never the reverse."""
from __future__ import annotations

from typing import Any

__all__ = ["tune", "TuningDatabase", "TuningDatabaseError", "apply_tuning", "default_path"]


def __getattr__(name: str) -> Any:  # light import: kiln.compiler loads this package on every compile
    if name == "tune":
        from kiln.tune.tuner import tune
        return tune
    if name in ("TuningDatabase", "TuningDatabaseError", "default_path"):
        from kiln.tune import database
        return getattr(database, name)
    if name == "apply_tuning":
        from kiln.tune.apply import apply_tuning
        return apply_tuning
    raise AttributeError(name)
