"""A kernel's schedule as data: the knobs its schedules decide, each with its legal domain and its default.

Every decision a schedule makes that could be made otherwise — the register tile's rows and columns, the
input-channel block, the order and blocking of the tile loops, packing, unrolling, the parallel split, the
vector width, the strategy — goes through `Decisions.knob(name, default, domain)`:

    mr = dec.knob("mr", pick_mr(M, most), range(1, most + 1))     # the heuristic's value is the default

With no configuration the knob returns the default, so the heuristics are one point of the space (and the code
they give is exactly the code without this module). With a configuration (a tuned record, a search candidate)
it returns the configured value — which must lie in the domain the schedule computed for *this* compute, so a
candidate is legal by construction or rejected (IllegalConfig) before any code is generated. With a `sample`
function it draws each value from its domain: scheduling a compute with a sampler *is* drawing a random legal
candidate, including knobs that exist only under another knob's value (the microkernel's blocks exist only when
strategy = ukernel). As in MetaSchedule, the space is the trace of decisions the schedule made, recorded here
(`Decisions.knobs`); kiln/tune searches it, and this layer never imports kiln/tune.

A kernel's configuration is one flat mapping for all its computes, knob names prefixed by the compute's index
("1:mr" is the register tile rows of the kernel's second compute)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

Value = int | str | bool
Config = Mapping[str, Value]


class IllegalConfig(ValueError):
    """A configured knob value outside the domain this compute allows (or a knob it does not have)."""


@dataclass(frozen=True)
class Knob:
    name: str                  # "<compute index>:<knob>", e.g. "0:mr"
    domain: tuple[Value, ...]  # the legal values here, the default among them
    default: Value             # what the heuristics choose


@dataclass
class Decisions:
    """The decisions of one kernel's schedules: knob values taken from `config`, drawn by `sample`, or the
    heuristic defaults; every knob consulted is recorded with its domain (`knobs`) and its value (`values`).

    `strict`: a configured value outside its domain raises IllegalConfig (a search candidate or a tuning record
    that does not fit this compute); otherwise the default is used."""
    config: Config = field(default_factory=dict)
    sample: Callable[[Knob], Value] | None = None
    strict: bool = True
    prefix: str = ""
    knobs: list[Knob] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)

    def knob(self, name: str, default: Value, domain: Iterable[Value]) -> Value:
        full = self.prefix + name
        dom = tuple(dict.fromkeys(domain))  # ordered, no duplicates
        if default not in dom:
            dom = (default,) + dom
        k = Knob(full, dom, default)
        if full in self.config:
            v = self.config[full]
            if v not in dom:
                if self.strict:
                    raise IllegalConfig(f"knob {full} = {v!r} is not in its domain {list(dom)} for this compute")
                v = default
        elif self.sample is not None and len(dom) > 1:
            v = self.sample(k)
        else:
            v = default
        self.knobs.append(k)
        self.values[full] = v
        return v

    def at(self, index: int) -> Decisions:
        """The same decisions, for compute `index` of the kernel (names prefixed "<index>:")."""
        self.prefix = f"{index}:"
        return self

    def unused(self) -> list[str]:
        """Configured knobs no schedule consulted (a record for another build of the kernel)."""
        return sorted(set(self.config) - set(self.values))


def powers_of_two(lo: int, hi: int) -> list[int]:
    out, v = [], max(1, lo)
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def divisors(n: int, most: int | None = None) -> list[int]:
    return [d for d in range(1, (most or n) + 1) if n % d == 0]


def config_key(config: Config) -> str:
    """A canonical text of a configuration (its identity in the tuning database)."""
    import json
    return json.dumps(sorted(config.items()), separators=(",", ":"))

