"""How well the cost model ranks candidates it was not trained on (`kiln tune --report`).

From a tuning database's measurements on one target (every correct candidate with its features), per workload
with enough candidates:

  * held-out: a quarter of the workload's candidates (random, seeded) held out; the learned model trained on the
    rest of them plus every other workload of its kernel class; Spearman's ρ between its predicted order and the
    measured times of the held-out quarter (repeated over four disjoint quarters, averaged);
  * unseen workload: trained on the *other* workloads of the class only (what the model knows when a new kernel
    starts tuning);
  * analytic: the analytic model alone.

ρ = 1: the model orders the held-out candidates exactly as the machine does; 0: no better than chance. Reported
per kernel class as the mean over its workloads (and the number of workloads and candidates)."""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from kiln.tune.cost import FEATURES, LearnedModel, spearman
from kiln.tune.database import TuningDatabase

MIN_CANDIDATES = 12
FOLDS = 4


@dataclass
class ClassQuality:
    klass: str
    workloads: int
    candidates: int
    held_out: float
    unseen: float
    analytic: float


def _groups(db: TuningDatabase, tkey: str) -> dict[str, dict[str, tuple[list, list]]]:
    """class → sig → (features, median seconds), one row per distinct configuration (its fastest measurement)."""
    classes = {sig: klass for sig, klass, _ in db.workloads()}
    best: dict[tuple[str, str], tuple[list[float], float]] = {}
    for m in db.measurements(tkey=tkey, status="ok"):
        if m.features is None or m.seconds is None or len(m.features) > len(FEATURES):
            continue
        key = (m.sig, repr(sorted(m.config.items())))
        if key not in best or m.seconds < best[key][1]:
            best[key] = (m.features, m.seconds)
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for (sig, _), (f, s) in best.items():
        g = out.setdefault(classes.get(sig, "?"), {}).setdefault(sig, ([], []))
        g[0].append(f)
        g[1].append(s)
    return out


def model_quality(db: TuningDatabase, tkey: str, seed: int = 0) -> list[ClassQuality]:
    out = []
    dynamic = db.symbolic_sigs()  # tune/sizes.py: their model is the f_MK × f_spatial split
    for klass, sigs in sorted(_groups(db, tkey).items()):
        held, unseen, analytic, n_w, n_c = [], [], [], 0, 0
        for sig, (feats, secs) in sigs.items():
            if len(feats) < MIN_CANDIDATES:
                continue
            n_w += 1
            n_c += len(feats)
            others = [(f, s) for o, (f, s) in sigs.items() if o != sig]
            idx = list(range(len(feats)))
            random.Random(seed).shuffle(idx)
            rhos = []
            for fold in range(FOLDS):
                test = idx[fold::FOLDS]
                train = [i for i in idx if i not in test]
                m = LearnedModel(seed, split=sig in dynamic)
                m.fit(others + [([feats[i] for i in train], [secs[i] for i in train])])
                scores = m.score([feats[i] for i in test])
                rhos.append(spearman(-np.asarray(scores), [secs[i] for i in test]))
            held.append(float(np.nanmean(rhos)))
            m = LearnedModel(seed, split=sig in dynamic)
            if m.fit(others):
                unseen.append(spearman(-m.score(feats), secs))
            a = LearnedModel(seed)  # untrained: the analytic estimate
            analytic.append(spearman(-a.score(feats), secs))
        if n_w:
            mean = (lambda xs: float(np.nanmean(xs)) if xs else float("nan"))  # noqa: E731
            out.append(ClassQuality(klass, n_w, n_c, mean(held), mean(unseen), mean(analytic)))
    return out


def quality_table(rows: list[ClassQuality]) -> str:
    lines = ["| kernel class | workloads | candidates | ρ held-out (learned) | ρ unseen workload (learned) | "
             "ρ analytic |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.klass} | {r.workloads} | {r.candidates} | {r.held_out:.2f} | {r.unseen:.2f} | "
                     f"{r.analytic:.2f} |")
    return "\n".join(lines)
