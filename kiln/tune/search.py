"""The search over one kernel's space: evolutionary, filtered by the cost model, decided by the machine.

    measure the default (its outputs are the reference every candidate is checked against)
    seed: the best configurations already in the database for this workload and target, then random samples
    repeat until the workload's time is up (the first round whole, however loaded the machine):
        propose  POOL candidates: mutations and crossovers of the fastest measured ("elite"), random samples
        rank     them with the cost model (analytic at first; XGBoost once measurements exist, refit every round)
        build    the best BATCH (and EXPLORE random ones of the pool) — in parallel (Ray)
        measure  each, one at a time; a wrong output is recorded and discarded
    verify: the fastest few and the default, re-timed in interleaved rounds; the winner must beat the default
            by more than NOISE in those rounds (not in the search's own, lucky-minimum times), else the default
            stays; it is written as the workload's best record

How a round proposes is data (`POLICIES`): the evolutionary mix above (the default), and for comparison pure
random search, random samples ranked by the model (Ansor's sampler without its evolution), and a local search
from the elite (one-knob moves only: beam-like). `benchmarks/search_policies.py` runs them side by side with the
same trial budget; the measured comparison that chose the default is in docs/search-policies.md. Mutation keeps
the good knob values of a fast candidate while moving one or two, which suits spaces where a few knobs interact
(tile rows × order × cache block); random samples and the explore share keep it from settling on a local optimum;
the model saves measuring the many obviously bad proposals (a 1-row tile, a vector of 4 lanes on AVX-512)."""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kiln.schedule.config import config_key
from kiln.target import Target
from kiln.tune.cost import LearnedModel, features_of
from kiln.tune.database import Measurement, TuningDatabase
from kiln.tune.measure import Built, Measurer, outputs_match
from kiln.tune.sizes import size_distribution
from kiln.tune.space import Candidate, Space
from kiln.tune.workload import Workload

POOL = 96          # candidates proposed per round
BATCH = 8          # candidates built and measured per round
EXPLORE = 2        # of which drawn at random from the pool (not by the model)
ELITE = 6          # the fastest measured, parents of the next round
VERIFY_TOP = 3     # candidates re-timed against the default at the end
VERIFY_ROUNDS = 3
NOISE = 1.02       # a winner must be this much faster than the default in the verification


@dataclass(frozen=True)
class Policy:
    """How a round fills its pool of POOL proposals: each from a mutation of the elite (one knob moved with
    probability `one_knob`, else two), a crossover of two of them, or a random sample, in these proportions (a
    round with no elite yet samples at random); whether the cost model ranks the pool (else the batch is drawn from
    it at random)."""
    mutate: float
    crossover: float
    ranked: bool = True
    one_knob: float = 0.7


POLICIES: dict[str, Policy] = {
    "evolutionary": Policy(mutate=0.55, crossover=0.15),
    "random": Policy(mutate=0.0, crossover=0.0, ranked=False),        # random search (no model, no evolution)
    "model-random": Policy(mutate=0.0, crossover=0.0),                # random samples, the model picks
    "local": Policy(mutate=1.0, crossover=0.0, one_knob=1.0),         # one-knob moves from the elite (beam-like)
}

# ... and save at least this fraction of the model's time (all its kernels of the workload): a gain below what the
# model's own timing resolves is not worth the risk that a schedule measured alone loses in the model
# (conv_r50_3x3's layout change: 0.5 µs faster alone — 0.08% of the model — and 1.03–1.08× slower in it)
MIN_MODEL_GAIN = 0.001


@dataclass
class SearchContext:
    target: Target
    threads: int
    options: dict[str, bool]
    db: TuningDatabase
    tkey: str
    measurer: Measurer
    pool: object                     # LocalPool | RayPool (tune/distributed.py)
    run: str
    rng: random.Random
    on_measure: Callable[[Workload, float, float], None] | None = None   # (workload, default s, best s)
    training: dict[str, list[tuple[list[float], float]]] = field(default_factory=dict)  # class → rows (all sigs)
    max_trials: int | None = None    # candidates per workload at most (the default's measurement included)
    model_s: float = 0.0             # the model's time under default schedules (Σ default time × count)
    policy: str = "evolutionary"     # how rounds propose (POLICIES)
    interrupted: bool = False        # Ctrl-C seen (set by tune()'s SIGINT handler; see `measure`)


@dataclass
class WorkloadResult:
    sig: str
    klass: str
    default_s: float | None = None
    best_s: float | None = None
    best_config: dict = field(default_factory=dict)
    trials: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""
    phases: dict[str, float] = field(default_factory=dict)   # seconds spent proposing, building, measuring

    @property
    def speedup(self) -> float:
        return (self.default_s / self.best_s) if self.default_s and self.best_s else 1.0


class WorkloadSearch:
    def __init__(self, w: Workload, ctx: SearchContext):
        self.w, self.ctx = w, ctx
        self.space = Space(w.kernel, ctx.target, ctx.threads, ctx.options)
        self.measured: dict[str, tuple[dict, float]] = {}      # config key → (config, median s) — ok ones
        self.tried: set[str] = set()                           # every config key built (any status)
        self.built: dict[str, Built] = {}                      # ok candidates' objects (for the verification)
        self.reference: dict[str, np.ndarray] | None = None
        self.result = WorkloadResult(w.sig, w.klass)
        self.rows: list[tuple[list[float], float]] = []        # this workload's (features, seconds)
        self.model = LearnedModel(ctx.rng.randrange(1 << 30), split=bool(size_distribution(w.kernel)))  # DietCode
        self.durations: list[float] = []                       # wall seconds of each measurement

    # -- measuring -------------------------------------------------------------------------------------------------
    def _record(self, built: Built, status: str, seconds: float | None = None, samples: list | None = None,
                detail: str = "", is_default: bool = False) -> None:
        c = self.ctx
        feats = built.features
        analytic = None
        if feats is not None:
            from kiln.tune.cost import analytic_of
            analytic = analytic_of(feats)
        c.db.add(Measurement(self.w.sig, c.tkey, built.config, status, seconds, samples, feats, analytic,
                             is_default, detail or built.detail, c.run))
        self.result.statuses[status] = self.result.statuses.get(status, 0) + 1
        self.result.trials += 1

    def _lap(self, phase: str, t0: float) -> float:
        now = time.perf_counter()
        self.result.phases[phase] = self.result.phases.get(phase, 0.0) + now - t0
        return now

    def measure(self, built: Built, is_default: bool = False) -> float | None:
        """Time one built candidate; record it (whatever happens); its median seconds if ok and correct."""
        if self.ctx.interrupted:  # a Ctrl-C whose KeyboardInterrupt was lost (raised inside a finalizer or an
            raise KeyboardInterrupt  # import's lock callback, Python prints it as "Exception ignored")
        t0 = time.perf_counter()
        try:
            return self._measure(built, is_default)
        finally:
            self._lap("measure", t0)

    def _measure(self, built: Built, is_default: bool) -> float | None:
        key = config_key(built.config)
        self.tried.add(key)
        if built.status != "ok":
            self._record(built, built.status, is_default=is_default)
            return None
        r = self.ctx.measurer.measure(built, self.ctx.target, self.ctx.threads)
        if r.wall:
            self.durations.append(r.wall)
        if r.status != "ok":
            self._record(built, r.status, detail=r.detail, is_default=is_default)
            return None
        if self.reference is None:
            self.reference = r.outputs
        else:
            ok, why = outputs_match(r.outputs or {}, self.reference)
            if not ok:
                self._record(built, "wrong", r.seconds, r.samples, why, is_default)
                return None
        self._record(built, "ok", r.seconds, r.samples, is_default=is_default)
        self.measured[key] = (built.config, r.seconds)
        self.built[key] = built
        if built.features is not None:
            self.rows.append((built.features, r.seconds))
        return r.seconds

    def build(self, configs: list[dict]) -> list[Built]:
        c = self.ctx
        t0 = time.perf_counter()
        out = c.pool.build(self.w.sig, self.w.kernel, c.target, c.threads, c.options, configs)
        self._lap("build", t0)
        return out

    # -- the search ------------------------------------------------------------------------------------------------
    def run(self, budget_s: float) -> WorkloadResult:
        t0 = time.perf_counter()
        deadline = t0 + budget_s
        res = self.result
        try:
            if self.reference is None:  # (tune/tuner.py measures every workload's default first)
                (default,) = self.build([self.space.default])
                res.default_s = self.measure(default, is_default=True)
            if res.default_s is None:
                res.note = f"default schedule failed: {res.statuses}"
                return res
            self._notify()
            if not self.space.tunable():
                res.note = "nothing to tune (one point)"
                return res
            seeds = self._seeds()
            # leave time for the verification: (VERIFY_TOP + 1) × VERIFY_ROUNDS more measurements
            per_measure = min(self.durations, default=0.0)
            stop = deadline - min(0.3 * budget_s, (VERIFY_TOP + 1) * VERIFY_ROUNDS * per_measure)
            first = True
            cap = self.ctx.max_trials if self.ctx.max_trials is not None else float("inf")
            while (first or time.perf_counter() < stop) and res.trials < cap:
                t1 = time.perf_counter()
                batch = self.propose(seeds)
                self._lap("propose", t1)
                seeds = []
                if not batch:
                    break
                for built in self.build([cand.config for cand in batch]):
                    # the first batch is measured whole, even past the slice on a loaded machine (a searched
                    # workload is then never left with its default alone, its built candidates thrown away)
                    if (time.perf_counter() >= stop and not first) or res.trials >= cap:
                        break
                    self.measure(built)
                    self._notify()
                first = False
            self.finish(verify=True)
        except KeyboardInterrupt:
            self.finish(verify=False)
            raise
        finally:
            res.seconds = time.perf_counter() - t0
        return res

    def _notify(self) -> None:
        if self.ctx.on_measure and self.result.default_s:
            best = min((s for _, s in self.measured.values()), default=self.result.default_s)
            self.ctx.on_measure(self.w, self.result.default_s, best)

    def _seeds(self) -> list[dict]:
        """The fastest configurations measured for this workload and target in earlier runs."""
        past = [m for m in self.ctx.db.measurements(self.w.sig, self.ctx.tkey, "ok") if m.run != self.ctx.run]
        past.sort(key=lambda m: m.seconds or float("inf"))
        out, seen = [], set()
        for m in past:
            k = config_key(m.config)
            if k not in seen:
                seen.add(k)
                out.append(m.config)
            if m.features is not None:
                self.rows.append((m.features, m.seconds))
        return out[:ELITE]

    def propose(self, seeds: list[dict]) -> list[Candidate]:
        """The next batch: POOL proposals ranked by the model, the best BATCH − EXPLORE and EXPLORE at random
        (earlier runs' best configurations, `seeds`, are taken first: each is re-measured once)."""
        rng, space = self.ctx.rng, self.space
        elite = sorted(self.measured.values(), key=lambda cs: cs[1])[:ELITE]
        pool: dict[str, Candidate] = {}
        chosen: dict[str, Candidate] = {}

        def add(c: Candidate | None, into: dict[str, Candidate]) -> None:
            if c is not None and c.key not in self.tried and c.key not in pool and c.key not in chosen:
                into[c.key] = c
        for cfg in seeds:
            add(space.realize(cfg), chosen)
        policy = POLICIES[self.ctx.policy]
        attempts = 0
        while len(pool) < POOL and attempts < 4 * POOL:
            attempts += 1
            r = rng.random()
            if elite and r < policy.mutate:
                parent = elite[min(int(rng.expovariate(1.0)), len(elite) - 1)][0]
                add(space.mutate(parent, rng, changes=1 if rng.random() < policy.one_knob else 2), pool)
            elif len(elite) >= 2 and r < policy.mutate + policy.crossover:
                a, b = rng.sample(elite, 2)
                add(space.crossover(a[0], b[0], rng), pool)
            else:
                add(space.sample(rng), pool)
        cands = list(pool.values())
        if not cands:
            return list(chosen.values())
        if policy.ranked:  # (features only to rank by: a measured candidate's are computed where it is built)
            for c in cands:
                c.features = features_of(c.kernel, self.ctx.target, self.ctx.threads)
            self._fit()
            scores = self.model.score([c.features for c in cands])
            ranked = [cands[i] for i in np.argsort(-scores)]
        else:
            ranked = rng.sample(cands, len(cands))
        picks = ranked[:max(0, BATCH - EXPLORE - len(chosen))]
        rest = ranked[len(picks):]
        explore = rng.sample(rest, min(EXPLORE, len(rest)))
        return list(chosen.values()) + picks + explore

    def _fit(self) -> None:
        """Refit the class's model on every measured candidate of its workloads (this run and the database's)."""
        data = list(self.ctx.training.get(self.w.klass, []))
        if self.rows:
            feats, secs = zip(*self.rows)
            data.append(([list(f) for f in feats], list(secs)))
        self.model.fit(data)

    def finish(self, verify: bool) -> None:
        """Choose the workload's best and write it (the default when nothing beats it beyond noise)."""
        res, c = self.result, self.ctx
        if res.default_s is None:
            return
        default_key = config_key(self.space.default)
        ranked = sorted(((s, k) for k, (_, s) in self.measured.items()), key=lambda x: x[0])
        top = [k for _, k in ranked if k != default_key][:VERIFY_TOP]
        search = {default_key: res.default_s, **{k: self.measured[k][1] for k in top}}
        times: dict[str, list[float]] = {k: [] for k in search}
        t0 = time.perf_counter()
        if verify and top and default_key in self.built:
            for _ in range(VERIFY_ROUNDS):
                for k in [default_key] + top:
                    r = c.measurer.measure(self.built[k], c.target, c.threads, want_outputs=False)
                    if r.status == "ok":
                        times[k].append(r.seconds)
        self._lap("verify", t0)
        # the verification's interleaved times only: a candidate's search time is the minimum of many noisy
        # measurements — the winner's curse — and the default's was taken at another moment of the machine's load;
        # the search time stands in only where the verification did not run (or that candidate failed in it)
        med = {k: float(np.median(v)) if v else search[k] for k, v in times.items()}
        default_s = med[default_key]
        margin = NOISE if verify else 1.05  # without a verification run, demand a clearer win
        best_key = min(med, key=med.__getitem__)
        if best_key != default_key and med[best_key] * margin > default_s:
            best_key = default_key
        if best_key != default_key and (default_s - med[best_key]) * self.w.count < MIN_MODEL_GAIN * c.model_s:
            best_key, res.note = default_key, "gain below 0.1% of the model: default kept"
        config = self.space.default if best_key == default_key else self.measured[best_key][0]
        res.default_s, res.best_s, res.best_config = default_s, med[best_key], dict(config)
        c.db.set_best(self.w.sig, c.tkey, config, med[best_key], default_s, c.run)
        # this workload's rows train the class model of the workloads after it
        if self.rows:
            feats, secs = zip(*self.rows)
            c.training.setdefault(self.w.klass, []).append(([list(f) for f in feats], list(secs)))
