"""The search space of one kernel, as data: its knobs, each with a domain and a default.

The knobs are not listed here by hand: they are the decisions the schedules themselves make
(kiln/schedule/config.py — `Decisions.knob(name, default, domain)` in schedule/default.py, tile.py, ukernel.py):
scheduling the kernel once with no configuration records every knob it consulted, with the domain the schedule
computed for this compute (legal tile rows for its extent and the target's registers, divisors of its input
channels, powers of two up to its tile counts, ...) and the heuristic's choice — the default point, the
search's first candidate. Knobs that exist only under another knob's value (the microkernel's blocks exist only
when strategy = ukernel) join the space when a candidate first reaches them.

A candidate is realized by scheduling the kernel with its values in *repair* mode: a value that does not fit
its knob's domain under the candidate's other values (a channel block after a change of tile width) is
replaced by that knob's default, so every realized candidate is legal by construction; its canonical form is
the set of values the schedule consulted, which is what is measured, stored and applied.

    space = Space(kernel, target, threads, options)
    space.knobs        {"0:mr": Knob("0:mr", (1, …, 14), 14), "0:order": Knob(…, ("m", "n"), "m"), …}
    space.default      {"0:mr": 14, "0:order": "m", …}
    cand = space.sample(rng) / space.mutate(cfg, rng) / space.crossover(a, b, rng)   # → Candidate or None
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from kiln.kernel.ir import Kernel
from kiln.schedule.config import Decisions, Knob, Value, config_key
from kiln.target import Target
from kiln.tune.workload import fresh

MUTATE_NEAR = 0.6   # a numeric knob's mutation steps to a neighbouring value this often, else anywhere


@dataclass
class Candidate:
    config: dict[str, Value]    # the canonical values (what the schedule consulted)
    kernel: Kernel              # the scheduled kernel (for features)
    features: list[float] | None = None

    @property
    def key(self) -> str:
        return config_key(self.config)


class Space:
    def __init__(self, kernel: Kernel, target: Target, threads: int, options: dict[str, bool]):
        self.kernel, self.target, self.threads, self.options = kernel, target, threads, options
        self.knobs: dict[str, Knob] = {}
        first = self.realize({})
        assert first is not None, "the default schedule failed"
        self.default = dict(first.config)
        self.default_candidate = first

    def realize(self, config: dict[str, Value], sample: Callable[[Knob], Value] | None = None) -> Candidate | None:
        """Schedule the kernel with `config` (repairing values that do not fit, drawing knobs it does not set
        from `sample` or taking their defaults); None if the schedule fails."""
        from kiln.schedule.default import schedule_kernel

        dec = Decisions(config, sample=sample, strict=False)
        k = fresh(self.kernel)
        try:
            schedule_kernel(k, self.target, self.threads, self.options, dec)
        except Exception:  # a schedule bug on an unusual point: that candidate does not exist
            return None
        for kn in dec.knobs:
            self.knobs.setdefault(kn.name, kn)
        return Candidate(dict(dec.values), k)

    @property
    def size(self) -> int:
        """The number of points of the product of the known domains (an upper bound: conditional knobs)."""
        return math.prod(len(k.domain) for k in self.knobs.values())

    def tunable(self) -> bool:
        return any(len(k.domain) > 1 for k in self.knobs.values())

    def sample(self, rng: random.Random) -> Candidate | None:
        return self.realize({}, sample=lambda k: rng.choice(k.domain))

    def mutate(self, config: dict[str, Value], rng: random.Random, changes: int = 1) -> Candidate | None:
        """Change `changes` knobs of `config` (a numeric one mostly to a neighbouring value of its domain)."""
        new = dict(config)
        names = [n for n in config if n in self.knobs and len(self.knobs[n].domain) > 1]
        if not names:
            return None
        for name in rng.sample(names, min(changes, len(names))):
            dom = list(self.knobs[name].domain)
            cur = new[name]
            i = dom.index(cur) if cur in dom else 0
            numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in dom)
            if numeric and rng.random() < MUTATE_NEAR:
                order = sorted(dom)
                j = order.index(dom[i]) + rng.choice((-1, 1))
                new[name] = order[min(max(j, 0), len(order) - 1)]
            else:
                others = [v for v in dom if v != cur]
                new[name] = rng.choice(others)
        return self.realize(new)

    def crossover(self, a: dict[str, Value], b: dict[str, Value], rng: random.Random) -> Candidate | None:
        child = {n: (a if rng.random() < 0.5 else b).get(n, a.get(n, b.get(n))) for n in set(a) | set(b)}
        return self.realize({n: v for n, v in child.items() if v is not None})
