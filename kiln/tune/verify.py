"""Step 5 of `kiln tune`: the records checked in the model they were tuned for.

A kernel is searched alone (tune/measure.py): the same call again and again, its data in the caches of the
threads that touched it last time. In the model, a kernel's inputs were written by the kernel before it, and
its outputs are read by the kernel after it — by whichever thread each one's schedule gives them to. A knob
that wins alone can lose there: conv_r50_3x3's layout change into blocks, 16 chunks per thread, measured
4.5 → 4.0 µs alone, but 19.9 → 24.3 µs in the model and the Winograd input transform after it 16.6 → 18.3,
the whole model 1.03–1.08× slower than with no record at all.

So after the search, the model is built twice — every record of this target applied, and none — and the two run
interleaved (idle gaps; `compare`: paired ratios, each batch labelled with the host's state — a virtualized host
moves the vCPUs between one L3 and two, and a record may win in one and lose in the other: conv_r50_3x3's AVX2
Winograd product, 0.998× on one L3, 1.073× on two). If the tuned build is slower than the default beyond
`TOLERANCE` in any state judged (or over all rounds, when none is), both run again with a per-kernel profile;
each record whose kernel, together with the kernel after it, takes longer in the tuned build is replaced by its
workload's default configuration (its measurements stay in the database), and the model is measured again; a model
still slower loses the rest of its records. Either way the report says what the model measured. A model with
symbolic dims, whose records were tuned once for every size (tune/sizes.py), is compared at a few sizes across its
bounds and judged by the geometric mean of the per-size ratios (`_verify_sizes`).

The tune package sits below the compiler, so it does not build models itself: `kiln.compiler` registers its
`compile` here when it is imported (`register_model_builder`)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # (kiln.compiler imports this module on every `import kiln`: no sqlite3 for that)
    from kiln.tune.database import TuningDatabase

TOLERANCE = 0.01   # tuned ÷ default above 1 + this: the records are looked at kernel by kernel
ROUNDS = 11        # interleaved rounds per comparison
ROUND_S = 0.15     # each build runs about this long per round (at least 3 calls)
GAP_S = 0.2        # idle before each batch: one build's pool spinning down is not charged to the other
MIN_BATCHES = 3    # paired rounds (both builds in the state) a host state needs before it is judged on its own
MAX_ROUNDS = 25    # rounds go on up to this while a state seen has fewer (compare)
ALL = "all"        # Comparison.kernels' key for every batch, whatever its state
VERIFY_POINTS = 4  # a model with symbolic dims is compared at this many sizes (model_sizes)
SIZE_ROUNDS = 5    # ... in this many interleaved rounds each

# builds the model with tuning = "off" or a database path → an object with run(feeds, profile=None), inputs, meta
ModelBuilder = Callable[[str], Any]
_builder: Callable[..., Any] | None = None


def register_model_builder(compile_fn: Callable[..., Any]) -> None:
    global _builder
    _builder = compile_fn


@dataclass
class InModel:
    default_s: float = 0.0
    tuned_s: float = 0.0               # the last tuned build's time (after any reverts)
    first_tuned_s: float = 0.0         # before any revert
    applied: int = 0                   # kernels of the model that ran tuned schedules at first
    reverted: list[str] = field(default_factory=list)   # signatures put back to their default
    states: str = ""                   # tuned ÷ default per host state judged (first comparison)
    again: str = ""                    # ... in the comparison after the reverts (if any ran)
    note: str = ""

    def line(self) -> str:
        if self.note:
            return f"in the model: {self.note}"
        s = (f"in the model: default {self.default_s * 1e3:.4g} ms, tuned {self.first_tuned_s * 1e3:.4g} ms "
             f"({self.applied} kernels tuned{'; tuned ÷ default on ' + self.states if self.states else ''})")
        if self.again and not self.reverted:  # slower at first, no record's kernels slower: measured again, not slower
            s += f"; no record's kernels slower, measured again: tuned ÷ default on {self.again}"
        if self.reverted:
            s += (f"; slower, so {len(self.reverted)} record(s) went back to the default "
                  f"({', '.join(r[:8] for r in self.reverted)}) → {self.tuned_s * 1e3:.4g} ms")
        return s


def model_builder(model: Any, **compile_kw: Any) -> ModelBuilder:
    if _builder is None:
        raise RuntimeError("no model builder registered (kiln.compiler registers kiln.compile when imported)")
    return lambda tuning: _builder(model, cache=False, tuning=tuning, **compile_kw)


def feeds_for(exe: Any, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs of the model's shapes (its symbolic dims at `sizes`); integers 0 or 1 (valid ids for any
    embedding table)."""
    from kiln.runtime.shapes import random_feeds
    return random_feeds(exe.inputs, np.random.default_rng(seed), sizes, int_high=2)


@dataclass
class Comparison:
    """Each round's batch of every build: its host state (runtime/coreprobe.py: the two vCPUs on one L3 or on two,
    probed just before the batch) and its median seconds per run. Ratios are paired: the median over rounds of one
    build's batch ÷ the other's in the same round (under a second apart), so a slow drift of the host — and on
    this Zen 4 guest the same code drifts by 10% within minutes — cancels instead of landing on one build."""
    rounds: list[dict[str, tuple[str, float]]]              # round → build → (state, s)
    kernels: dict[str, dict[str, dict[str, float]]]         # state (or ALL) → build → kernel → median s

    def _pairs(self, a: str, b: str, state: str | None) -> list[float]:
        return [r[a][1] / r[b][1] for r in self.rounds
                if state is None or r[a][0] == r[b][0] == state]

    def seconds(self, build: str, state: str | None = None) -> float:
        return float(np.median([r[build][1] for r in self.rounds if state is None or r[build][0] == state]))

    @property
    def overall(self) -> dict[str, float]:
        return {n: self.seconds(n) for n in self.rounds[0]}

    def paired(self, state: str) -> int:
        """Rounds in which every build ran in `state`."""
        return sum(len({st for st, _ in r.values()}) == 1 and next(iter(r.values()))[0] == state for r in self.rounds)

    def seen(self) -> list[str]:
        return sorted({st for r in self.rounds for st, _ in r.values()})

    def judged(self) -> list[str]:
        """States with at least MIN_BATCHES rounds in which every build ran in that state."""
        return [st for st in self.seen() if self.paired(st) >= MIN_BATCHES]

    def ratio(self, a: str, b: str, state: str | None = None) -> float:
        return float(np.median(self._pairs(a, b, state)))

    def worst(self, a: str, b: str) -> tuple[str | None, float]:
        """The judged state where a ÷ b is largest (None: no state judged, the ratio over all rounds)."""
        ratios = [(self.ratio(a, b, st), st) for st in self.judged()]
        if not ratios:
            return None, self.ratio(a, b)
        r, st = max(ratios)
        return st, r

    def states_text(self, a: str, b: str) -> str:
        return ", ".join(f"{st}: {self.ratio(a, b, st):.3f} ({self.paired(st)} rounds)" for st in self.judged())


def state_now() -> str:
    from kiln.runtime.coreprobe import host_state  # (runtime/coreprobe.py JIT-compiles with llvmlite: imported late)
    return host_state()


def compare(exes: dict[str, Any], feeds: dict[str, np.ndarray], rounds: int = ROUNDS,
            profile: bool = False, max_rounds: int = MAX_ROUNDS, deadline: float | None = None) -> Comparison:
    """The builds run interleaved (the order reversed every other round), an idle gap before each batch, each batch
    labelled with the host's state. After `rounds`, rounds go on (up to `max_rounds`) while a state was seen in
    fewer than MIN_BATCHES rounds of its own: a host that flips gets judged in both states, one that never does
    costs nothing more. Past `deadline` (a time.perf_counter() value: the end of `kiln tune`'s budget) no round
    beyond `rounds` starts."""
    per_call = {}
    for name, e in exes.items():
        e.run(feeds)
        t = time.perf_counter()
        e.run(feeds)
        per_call[name] = time.perf_counter() - t
    calls = {n: max(3, int(ROUND_S / max(s, 1e-6))) for n, s in per_call.items()}
    out = Comparison([], {})
    per_kernel: dict[str, dict[str, dict[str, list[float]]]] = {}   # state (or ALL) → build → kernel → seconds
    while len(out.rounds) < rounds or (len(out.rounds) < max_rounds and
                                       (deadline is None or time.perf_counter() < deadline) and
                                       any(out.paired(st) < MIN_BATCHES for st in out.seen())):
        this: dict[str, tuple[str, float]] = {}
        order = list(exes) if len(out.rounds) % 2 == 0 else list(exes)[::-1]
        for name in order:
            e = exes[name]
            time.sleep(GAP_S)
            st = state_now()   # (before the warm-up call: after it the pool's workers spin, and the probe would wait)
            e.run(feeds)
            times = []
            for _ in range(calls[name]):
                p: dict[str, float] | None = {} if profile else None
                t = time.perf_counter()
                e.run(feeds, profile=p)
                times.append(time.perf_counter() - t)
                for k, v in (p or {}).items():
                    for key in (st, ALL):
                        per_kernel.setdefault(key, {}).setdefault(name, {}).setdefault(k, []).append(v)
            this[name] = (st, float(np.median(times)))
        out.rounds.append(this)
    out.kernels = {st: {n: {k: float(np.median(x)) for k, x in ks.items()} for n, ks in by.items()}
                   for st, by in per_kernel.items()}
    return out


def slower_records(tuned_meta: dict[str, dict], order: list[str], default_k: dict[str, float],
                   tuned_k: dict[str, float]) -> list[str]:
    """Signatures whose kernel plus the kernel after it (which reads what it wrote) took longer when tuned,
    summed over the model's kernels of that signature."""
    delta: dict[str, float] = {}
    for name, rec in tuned_meta.items():
        if name not in order:
            continue
        i = order.index(name)
        pair = order[i:i + 2]
        delta[rec["sig"]] = delta.get(rec["sig"], 0.0) + sum(tuned_k.get(k, 0.0) - default_k.get(k, 0.0) for k in pair)
    return [sig for sig, d in sorted(delta.items(), key=lambda x: -x[1]) if d > 0]


def revert(db: TuningDatabase, sigs: list[str], tkey: str, run: str) -> list[str]:
    """Each signature's best record := its default configuration (the one measured as the default)."""
    done = []
    for sig in sigs:
        d = db.default_of(sig, tkey)
        if d is None:
            continue
        config, seconds = d
        db.set_best(sig, tkey, config, seconds, seconds, f"{run}:in-model")
        done.append(sig)
    return done


def verify_in_model(build: ModelBuilder, db: TuningDatabase, tkey: str, run: str,
                    deadline: float | None = None) -> InModel:
    out = InModel()
    try:
        default = build("off")
    except Exception as e:  # the tuner's records are kept; the report says why the model was not checked
        out.note = f"not checked: the model did not build ({type(e).__name__}: {e})"
        return out
    if model_sizes(default):
        return _verify_sizes(default, build, db, tkey, run, deadline, out)
    tuned = build(db.path)
    out.applied = len(tuned.meta.get("tuned") or {})
    if not out.applied:
        out.note = "no kernel runs a tuned schedule (every record is the default)"
        return out
    feeds = feeds_for(default)
    both = lambda: {"default": default, "tuned": tuned}  # noqa: E731 - `tuned` is rebuilt after a revert
    c = compare(both(), feeds, deadline=deadline)
    out.default_s, out.tuned_s, out.states = c.overall["default"], c.overall["tuned"], c.states_text("tuned", "default")
    out.first_tuned_s = out.tuned_s
    state, worst = c.worst("tuned", "default")
    if worst <= 1 + TOLERANCE:  # not slower in any host state seen (or overall, when no state was seen enough)
        return out
    order = list(default.kernel_names)
    p = compare(both(), feeds, profile=True, deadline=deadline)
    k = p.kernels.get(state or ALL, {})
    if set(k) != {"default", "tuned"}:  # the profile's batches never saw both builds in that state: all of them
        k = p.kernels[ALL]
    out.reverted = revert(db, slower_records(tuned.meta["tuned"], order, k["default"], k["tuned"]), tkey, run)
    tuned = build(db.path)
    if tuned.meta.get("tuned"):
        c = compare(both(), feeds, deadline=deadline)
        out.default_s, out.tuned_s = c.overall["default"], c.overall["tuned"]
        out.again = c.states_text("tuned", "default") or f"all rounds: {c.ratio('tuned', 'default'):.3f}"
        if c.worst("tuned", "default")[1] > 1 + TOLERANCE:  # still slower: the model keeps none of its records
            _revert_all(db, tuned, tkey, run, out)
    else:
        out.tuned_s = out.default_s
    return out


def _revert_all(db: TuningDatabase, tuned: Any, tkey: str, run: str, out: InModel) -> None:
    rest = sorted({r["sig"] for r in tuned.meta["tuned"].values()})
    done = revert(db, rest, tkey, run)
    out.reverted += done
    if len(done) == len(rest):  # (a record without a measured default stays, and so does its time)
        out.tuned_s = out.default_s


def model_sizes(exe: Any) -> list[dict[str, int]]:
    """The sizes a model with symbolic dims is checked at: VERIFY_POINTS per symbol from its bounds, on the diagonal
    (tune/sizes.py); [] for a static model."""
    from kiln.tune.sizes import diagonal, symbol_points
    bounds = (getattr(exe, "meta", {}).get("dynamic") or {}).get("bounds") or {}
    return diagonal({s: symbol_points(lo, hi, VERIFY_POINTS) for s, (lo, hi) in bounds.items()}) if bounds else []


def _verify_sizes(default: Any, build: ModelBuilder, db: TuningDatabase, tkey: str, run: str,
                  deadline: float | None, out: InModel) -> InModel:
    """Step 5 for a model with symbolic dims, tuned once for every size: the two builds compared at each of
    `model_sizes` (SIZE_ROUNDS interleaved rounds each); the records must not make the geometric mean of the
    per-size ratios slower — the objective they were tuned for. If they do, the kernels are profiled at the size
    where the tuned build lost most and the records whose kernels were slower there go back, as for a static model."""
    sizes = model_sizes(default)
    tuned = build(db.path)
    out.applied = len(tuned.meta.get("tuned") or {})
    if not out.applied:
        out.note = "no kernel runs a tuned schedule (every record is the default)"
        return out
    feeds = [feeds_for(default, sizes=s) for s in sizes]

    def measure(tuned: Any) -> tuple[list[Comparison], float, str]:
        cs = [compare({"default": default, "tuned": tuned}, f, rounds=SIZE_ROUNDS, max_rounds=SIZE_ROUNDS,
                      deadline=deadline) for f in feeds]
        ratios = [c.ratio("tuned", "default") for c in cs]
        geo = float(np.exp(np.mean(np.log(ratios))))
        out.default_s = float(np.exp(np.mean([np.log(c.seconds("default")) for c in cs])))
        out.tuned_s = float(np.exp(np.mean([np.log(c.seconds("tuned")) for c in cs])))
        text = ", ".join(f"{'×'.join(str(v) for v in s.values())}: {r:.3f}" for s, r in zip(sizes, ratios))
        return cs, geo, f"sizes {'×'.join(sizes[0])} {text}; geometric mean {geo:.3f}"
    cs, geo, out.states = measure(tuned)
    out.first_tuned_s = out.tuned_s
    if geo <= 1 + TOLERANCE:
        return out
    worst = max(range(len(cs)), key=lambda i: cs[i].ratio("tuned", "default"))
    k = compare({"default": default, "tuned": tuned}, feeds[worst], rounds=SIZE_ROUNDS, max_rounds=SIZE_ROUNDS,
                profile=True, deadline=deadline).kernels[ALL]
    out.reverted = revert(db, slower_records(tuned.meta["tuned"], list(default.kernel_names), k["default"],
                                             k["tuned"]), tkey, run)
    tuned = build(db.path)
    if not tuned.meta.get("tuned"):
        out.tuned_s = out.default_s
        return out
    _, geo, out.again = measure(tuned)
    if geo > 1 + TOLERANCE:
        _revert_all(db, tuned, tkey, run, out)
    return out
