"""The cost model: rank candidate schedules without running them.

Features come from the *scheduled* loop nest (not from the knob values), per store (Store, accumulator Assign,
or microkernel Call), weighted by how often it runs, and summed into one vector per candidate:

  * work: FLOPs, vector FMA instructions, the fraction of lanes doing work;
  * memory: loads, broadcasts, gathers and stores per FMA; bytes touched by one iteration of each enclosing
    loop level (the working set), and the bytes moved into each cache level (L1, L2, L3, DRAM) by the classic
    reuse model — a loop whose working set fits a cache reuses it across the iterations of the loop around it;
  * registers: accumulator vectors live across the reduction, vector values per step, their sum over the
    target's registers (over 1: spills);
  * loops: the hot store's trip counts (innermost, unrolled), vector width, the parallel loop's extent,
    chunks per thread and load balance over the threads;
  * the analytic estimate below (log seconds).

A kernel over symbolic dims (a model compiled with dynamic shapes) is one piece of code for a distribution of
sizes (tune/sizes.py): its features are its micro-kernel's (at the upper bounds) and `log_spatial`, how well its
tiles cover those sizes, computed analytically (DietCode's f_MK × f_spatial; `LearnedModel(split=True)`).

The analytic model — time = max(FMA issue, load issue, bytes per cache level ÷ that level's bandwidth),
stretched by FMA latency chains too short to fill the pipes, by register spills and by parallel imbalance —
ranks candidates before any is measured. `LearnedModel` refines it: XGBoost with a pairwise ranking objective,
trained online on the tuner's own measurements (every measured candidate of the workloads of one kernel class
on this target, one ranking group per workload), predicting a score whose order is the predicted speed order.
`spearman` reports how well it ranks candidates it was not trained on (kiln/tune/report.py, `kiln tune --report`)."""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.ir import Bin, Call, Const, Expr, If, Kernel, Load, Local, Loop, Stmt, Store, Var, value_at, walk
from kiln.target import Target

FEATURES: tuple[str, ...] = (
    "log_flops", "log_fma_vec", "lane_use", "loads_per_fma", "bcast_per_fma", "gather_per_fma", "stores_per_fma",
    "acc_regs", "step_regs", "pressure", "spill",
    "log_inner_trip", "log_unroll", "vec_ratio", "log_par_ext", "chunks", "balance", "par_loops",
    "log_ws0", "log_ws1", "log_ws2", "log_ws3", "log_l1_bytes", "log_l2_bytes", "log_l3_bytes", "log_dram_bytes",
    "bytes_per_flop_l2", "bytes_per_flop_l3", "ukernel", "log_analytic", "log_spatial",
)
FREQ = 3.0e9            # nominal clock (cancels out of every ranking)
FMA_PORTS = 2
FMA_LATENCY = 4
LOAD_PORTS = 2
# bytes per cycle per core the analytic model assumes for each level (L1, L2, L3, DRAM shared)
BANDWIDTH = (128.0, 48.0, 16.0, 6.0)


def _upper(e: Expr) -> int | None:
    """An upper bound of a loop extent (a constant, or min(constant, ·))."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Bin) and e.op == "min":
        a, b = _upper(e.a), _upper(e.b)
        return min(x for x in (a, b) if x is not None) if a is not None or b is not None else None
    return None


@dataclass
class _Ctx:
    var: Var
    trip: int          # iterations (a vector loop: vector steps)
    kind: str
    lanes: int


@dataclass
class _Acc:
    """Running sums over the stores of one candidate."""
    flops: float = 0.0
    fma_vec: float = 0.0
    lane_work: float = 0.0
    lane_slots: float = 0.0
    loads: float = 0.0
    bcasts: float = 0.0
    gathers: float = 0.0
    stores: float = 0.0
    traffic: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    hot: tuple[float, list[_Ctx], float, float, list[float]] | None = None  # (work, loops, acc, step, ws)
    ukernel: bool = False
    acc_regs: float = 0.0


class _Walker:
    def __init__(self, k: Kernel, target: Target, env: dict[str, int] | None = None):
        self.k, self.t = k, target
        self.env = env or {}  # symbolic dims' values (a symbol not in it: at its upper bound)
        self.native = target.lanes(32)
        self.shapes = {b.name: b.shape for b in list(k.args) + list(k.scratch)}
        self.itemsize = {b.name: np.dtype(b.dtype).itemsize for b in list(k.args) + list(k.scratch)}
        self.acc = _Acc()
        self.locals: dict[str, int] = {}
        self.caches = (target.l1_bytes, target.l2_bytes, target.l3_bytes)

    def stmts(self, body: list[Stmt], loops: list[_Ctx]) -> None:
        for s in body:
            if isinstance(s, Loop):
                ub = self.bound(s.extent)
                trip = -(-ub // s.lanes) if s.kind == "vector" else ub
                self.stmts(s.body, loops + [_Ctx(s.var, max(1, trip), s.kind, s.lanes if s.kind == "vector" else 1)])
            elif isinstance(s, If):
                taken = value_at(s.cond, self.env)  # a regime dispatch on the symbolic dims: the side that runs
                if taken is None and s.share is not None:  # a tail tile: both sides, by their shares
                    self.weighed(s, loops)
                else:
                    self.stmts(s.orelse if taken == 0 else s.body, loops)  # else the common (interior) side
            elif isinstance(s, Local):
                lanes = next((c.lanes for c in reversed(loops) if c.kind == "vector"), 1)
                self.locals[s.name] = s.count * max(1, -(-lanes // self.native))
            elif isinstance(s, Store):
                self.store(s.buf, s.index, s.value, loops, is_store=True)
            elif isinstance(s, Call):
                self.call(s, loops)
            elif hasattr(s, "value") and hasattr(s, "name"):  # Assign: an accumulator update
                self.store(None, (), s.value, loops, is_store=False, acc=s.name)

    def weighed(self, s: If, loops: list[_Ctx]) -> None:
        """Both sides of an If whose condition reads loop variables, their sums blended by `If.share` at the
        walker's sizes; the common side (`body`) keeps the hot nest and the accumulator count."""
        part, whole = (value_at(e, self.env) for e in s.share)
        w = part / whole if part is not None and whole else 0.0
        before = copy.deepcopy(self.acc)
        self.stmts(s.body, loops)
        common, self.acc = self.acc, copy.deepcopy(before)
        self.stmts(s.orelse, loops)
        tail = self.acc
        for name in ("flops", "fma_vec", "lane_work", "lane_slots", "loads", "bcasts", "gathers", "stores"):
            b = getattr(before, name)
            setattr(common, name, b + (1 - w) * (getattr(common, name) - b) + w * (getattr(tail, name) - b))
        common.traffic = [b + (1 - w) * (c - b) + w * (t - b)
                          for b, c, t in zip(before.traffic, common.traffic, tail.traffic)]
        common.ukernel = common.ukernel or tail.ukernel
        self.acc = common

    def bound(self, e: Expr) -> int:
        """A loop extent's value at the walker's sizes, or an upper bound of it (an edge tile's min(MR, ·))."""
        v = value_at(e, self.env)
        return v if v is not None and v > 0 else (_upper(e) or 1)

    def _iters(self, loops: list[_Ctx]) -> float:
        return float(np.prod([c.trip for c in loops])) if loops else 1.0

    def _footprints(self, loads: list[Load], loops: list[_Ctx]) -> list[float]:
        """Bytes touched by one iteration of each enclosing loop level, innermost first (index 0: one step)."""
        out = []
        for depth in range(len(loops), -1, -1):
            inner = loops[depth:]
            total = 0.0
            for ld in loads:
                shape = self.shapes.get(ld.buf)
                if shape is None:
                    continue
                flat = flat_index(ld.index, shape)
                n = 1.0
                for c in inner:
                    cf = coef(flat, c.var)
                    if cf != 0:
                        n *= c.trip * c.lanes
                size = float(np.prod(shape)) if shape else 1.0
                total += min(n, size) * self.itemsize.get(ld.buf, 4)
            out.append(total)
        return out  # out[0]: innermost step, out[-1]: the whole nest

    def _traffic(self, ws: list[float], loops: list[_Ctx]) -> list[float]:
        """Bytes moved into L1, L2, L3 and from DRAM: per cache, the largest loop level whose working set fits is
        reloaded once per iteration of the loops around it."""
        levels = len(ws) - 1
        out = []
        for cap in (*self.caches, float("inf")):
            j = max((i for i in range(levels + 1) if ws[i] <= cap), default=0)
            outer = loops[:levels - j]
            out.append(ws[j] * (float(np.prod([c.trip for c in outer])) if outer else 1.0))
        return out

    def store(self, buf: str | None, index: tuple, value: Expr, loops: list[_Ctx], is_store: bool,
              acc: str | None = None) -> None:
        a = self.acc
        iters = self._iters(loops)
        vec = next((c for c in reversed(loops) if c.kind == "vector"), None)
        lanes = vec.lanes if vec else 1
        regs_per = max(1, -(-lanes // self.native))
        nodes = walk(value)
        ops = sum(1 for e in nodes if isinstance(e, Bin) and e.dtype.startswith("float"))
        loads = [e for e in nodes if isinstance(e, Load)]
        flops = ops * lanes * iters
        a.flops += flops
        fma = ops / 2.0 * regs_per * iters
        a.fma_vec += fma
        a.lane_work += lanes * iters
        a.lane_slots += regs_per * self.native * iters
        for ld in loads:
            flat = flat_index(ld.index, self.shapes.get(ld.buf, ()))
            cf = coef(flat, vec.var) if vec else 0
            if cf == 0:
                a.bcasts += iters
            elif cf == 1:
                a.loads += iters * regs_per
            else:
                a.gathers += iters * regs_per
        if is_store:
            a.stores += iters * regs_per
        ws = self._footprints(loads, loops)
        for i, b in enumerate(self._traffic(ws, loops)):
            a.traffic[i] += b
        acc_regs = float(self.locals.get(acc, 0)) if acc else 0.0
        a.acc_regs = max(a.acc_regs, acc_regs)
        step = len(loads) * regs_per
        if a.hot is None or flops > a.hot[0]:
            a.hot = (flops, list(loops), acc_regs, float(step), ws)

    def call(self, s: Call, loops: list[_Ctx]) -> None:
        """A microkernel call as an MR×NR×K tile of `steps` vector instructions per row and vector:
        kiln_ukr_<isa>_f32_<MR>x<NR>…(A, B, C, ldc, K, …) (float FMA); kiln_ukr_<method>_<ab>_<MR>x<NR>(A, lda,
        rows, B, C, ldc, n2, sa2, n1, sa1, n0, sa0, K4) (8-bit / bf16 dot products, a group of 4 / 2 per lane: 2 with
        int16 weights, <ab> u8s16 / s8s16);
        kiln_amx_<dtype>_<MT>x<NT>_m<MR>_k<KB>…(A0, A1, lda, B, C, ldc, n2, sa2, n1, sa1, n0, sa0, 0) (AMX tiles:
        one tile product per tile pair and step). Other calls (tile configuration, release) are not work."""
        shape = ukernel_shape(s.fn)
        if shape is None:
            return
        a = self.acc
        a.ukernel = True
        mr, nr, group, elem_bytes = shape
        if group == 0:  # float FMA: K is the fifth argument, one element per instruction
            k_len, group = self.bound(s.args[4]), 1
        else:           # dot / AMX: n2·n1·n0 steps of K4 groups (the AMX kernel: of one group, KB elements)
            steps = self.bound(s.args[6]) * self.bound(s.args[8]) * self.bound(s.args[10])
            k_len = steps * group * (self.bound(s.args[12]) if s.fn.startswith("kiln_ukr_") else 1)
        k_len = max(1, k_len)
        iters = self._iters(loops)
        nvec = max(1, nr // self.native)
        flops = 2.0 * mr * nr * k_len * iters
        a.flops += flops
        a.fma_vec += mr * nvec * k_len * iters / group
        a.lane_work += mr * nr * k_len * iters / group
        a.lane_slots += mr * nvec * self.native * k_len * iters / group
        a.bcasts += mr * k_len * iters / group
        a.loads += nvec * k_len * iters / group
        a.stores += mr * nvec * iters
        step_bytes = (mr + nr) * float(elem_bytes)
        nest = list(loops) + [_Ctx(Var("uk"), k_len, "serial", 1)]  # the kernel's K loop, innermost
        ws = [step_bytes * float(np.prod([c.trip for c in nest[len(nest) - j:]])) if j else step_bytes
              for j in range(len(nest) + 1)]
        for i, b in enumerate(self._traffic(ws, nest)):
            a.traffic[i] += b
        acc_regs = float(mr * nvec)
        a.acc_regs = max(a.acc_regs, acc_regs)
        if a.hot is None or flops > a.hot[0]:
            a.hot = (flops, nest, acc_regs, float(nvec + 1), ws)


UKERNEL_NAMES = (  # the microkernel families' names → (MR, NR, K elements per lane group, bytes per element)
    (re.compile(r"kiln_ukr_[a-z0-9]+_f32_(\d+)x(\d+)"), lambda m: (int(m[1]), int(m[2]), 0, 4)),
    (re.compile(r"kiln_ukr_[a-z0-9]+_(u8s8|s8s8|u8s16|s8s16|bf16)_(\d+)x(\d+)"),
     lambda m: (int(m[2]), int(m[3]), 2 if m[1] in ("bf16", "u8s16", "s8s16") else 4, 2 if m[1] == "bf16" else 1)),
    (re.compile(r"kiln_amx_([a-z0-9]+)_(\d)x(\d)_m(\d+)_k(\d+)"),
     lambda m: (int(m[2]) * int(m[4]), int(m[3]) * 16, int(m[5]), 2 if m[1] == "bf16" else 1)),
)


def ukernel_shape(fn: str) -> tuple[int, int, int, int] | None:
    """(MR, NR, group, element bytes) of a microkernel by its name — group 0: a float FMA kernel (K an argument);
    for an AMX kernel the K elements of one step — or None for a call that is not a microkernel's."""
    for pattern, shape in UKERNEL_NAMES:
        m = pattern.match(fn)
        if m:
            return shape(m)
    return None


def _log2(x: float) -> float:
    return math.log2(max(1.0, x))


def analytic_seconds(f: dict[str, float], target: Target, threads: int) -> float:
    """The analytic estimate from the raw sums (see the module doc)."""
    issue = f["fma_vec"] / FMA_PORTS
    # FMA latency: fewer independent accumulator chains than latency × ports leave the pipes idle
    chains = f["acc_regs"] if f["acc_regs"] > 0 else FMA_LATENCY * FMA_PORTS
    issue /= min(1.0, chains / (FMA_LATENCY * FMA_PORTS))
    loads = (f["loads"] + f["bcasts"] + f["stores"] + 4.0 * f["gathers"]) / LOAD_PORTS
    mem = [f["traffic"][i] / BANDWIDTH[i] for i in range(4)]
    cycles = max(issue, loads, *mem[:3]) + 0.0
    if f["pressure"] > 1.0:  # spills: a load and a store per excess register per step
        cycles *= 1.0 + 0.5 * (f["pressure"] - 1.0)
    cycles /= max(1.0, threads * f["balance"]) if f["par_loops"] else 1.0
    cycles = max(cycles, mem[3] / 1.0)  # DRAM is shared
    cycles += 2000.0 * f["par_loops"]   # fork/join of each parallel loop
    return cycles / FREQ


def features_of(k: Kernel, target: Target, threads: int) -> list[float]:
    """The feature vector (FEATURES, in order) of a scheduled kernel. A kernel over symbolic dims (tune/sizes.py) is
    described DietCode's way: its micro-kernel's features — the kernel at the upper bounds, where every tile is whole
    — and `log_spatial`, the analytic cost of how its tiles cover the sizes it is measured at; `log_analytic` is
    the mean of the analytic estimate's log over those sizes."""
    from kiln.tune.sizes import iterations_at, size_distribution

    feats, top = _features(k, target, threads, {})
    sizes = size_distribution(k)
    if sizes:
        spatial, est = [], []
        top_lanes = top["slots"] / max(iterations_at(k, {}), 1)
        for size in sizes:
            raw = raw_sums(k, target, threads, size)
            # vector lanes executed per useful iteration against the whole tiles' (≥ 1: partial tiles and vectors,
            # a regime variant's extra rows), and the parallel balance against the whole tiles'
            waste = raw["slots"] / max(iterations_at(k, size), 1) / max(top_lanes, 1e-30)
            spatial.append(math.log(max(waste, 1e-6)) - math.log(max(raw["balance"], 1e-6) / max(top["balance"], 1e-6)))
            est.append(math.log(max(analytic_seconds(raw, target, threads), 1e-12)))
        feats["log_spatial"] = float(np.mean(spatial))
        feats["log_analytic"] = float(np.mean(est))
    return [float(feats[n]) for n in FEATURES]


def feature_dict(k: Kernel, target: Target, threads: int) -> tuple[dict[str, float], list[float]]:
    """The features of a scheduled kernel (a symbolic one's at its upper bounds, `log_spatial` 0), by name and as
    the vector."""
    feats, _ = _features(k, target, threads, {})
    return feats, [float(feats[n]) for n in FEATURES]


def raw_sums(k: Kernel, target: Target, threads: int, env: dict[str, int] | None = None) -> dict:
    """What the analytic model reads, summed over the scheduled kernel at the sizes `env` (symbol → value; a symbol
    not in it at its upper bound): FMAs, loads, traffic per cache level, the parallel balance, vector lanes run."""
    return _walk(k, target, threads, env)[0]


def _walk(k: Kernel, target: Target, threads: int, env: dict[str, int] | None) -> tuple[dict, _Walker, dict]:
    w = _Walker(k, target, env)
    w.stmts(k.body, [])
    a = w.acc
    par = [s for s in k.body if isinstance(s, Loop) and s.kind == "parallel"]
    par_ext = max((w.bound(s.extent) for s in par), default=1)
    chunks = max((s.chunks for s in par), default=0)
    per = threads * (chunks or 4)
    chunk = max(1, -(-par_ext // per))
    n_chunks = -(-par_ext // chunk)
    rounds = -(-n_chunks // threads)
    balance = (par_ext / (rounds * threads * chunk)) if par else 1.0
    hot = a.hot or (0.0, [], 0.0, 0.0, [0.0])
    _, loops, acc_regs, step_regs, ws = hot
    pressure = (acc_regs + step_regs + 2) / target.vector_registers
    raw = {"flops": a.flops, "fma_vec": a.fma_vec, "acc_regs": acc_regs, "loads": a.loads, "bcasts": a.bcasts,
           "gathers": a.gathers, "stores": a.stores, "traffic": a.traffic, "pressure": pressure,
           "balance": balance, "par_loops": float(len(par)), "slots": a.lane_slots}
    return raw, w, {"par_ext": par_ext, "chunks": chunks, "loops": loops, "step_regs": step_regs, "ws": ws}


def _features(k: Kernel, target: Target, threads: int, env: dict[str, int]) -> tuple[dict[str, float], dict]:
    raw, w, x = _walk(k, target, threads, env)
    a, loops, ws = w.acc, x["loops"], x["ws"]
    inner = next((c.trip for c in reversed(loops) if c.kind in ("serial", "parallel")), 1)
    unroll = float(np.prod([c.trip for c in loops if c.kind == "unroll"])) if loops else 1.0
    vec = next((c.lanes for c in reversed(loops) if c.kind == "vector"), 1)
    fma = max(a.fma_vec, 1.0)
    est = analytic_seconds(raw, target, threads)
    ws4 = (list(ws) + [ws[-1]] * 4)[:4] if ws else [0.0] * 4
    feats = {
        "log_flops": _log2(a.flops), "log_fma_vec": _log2(a.fma_vec),
        "lane_use": a.lane_work / a.lane_slots if a.lane_slots else 1.0,
        "loads_per_fma": a.loads / fma, "bcast_per_fma": a.bcasts / fma, "gather_per_fma": a.gathers / fma,
        "stores_per_fma": a.stores / fma, "acc_regs": raw["acc_regs"], "step_regs": x["step_regs"],
        "pressure": raw["pressure"], "spill": max(0.0, raw["pressure"] - 1.0), "log_inner_trip": _log2(inner),
        "log_unroll": _log2(unroll), "vec_ratio": vec / w.native, "log_par_ext": _log2(x["par_ext"]),
        "chunks": float(x["chunks"]), "balance": raw["balance"], "par_loops": raw["par_loops"],
        "log_ws0": _log2(ws4[0]), "log_ws1": _log2(ws4[1]), "log_ws2": _log2(ws4[2]),
        "log_ws3": _log2(ws4[3]), "log_l1_bytes": _log2(a.traffic[0]), "log_l2_bytes": _log2(a.traffic[1]),
        "log_l3_bytes": _log2(a.traffic[2]), "log_dram_bytes": _log2(a.traffic[3]),
        "bytes_per_flop_l2": a.traffic[1] / max(a.flops, 1.0), "bytes_per_flop_l3": a.traffic[2] / max(a.flops, 1.0),
        "ukernel": float(a.ukernel), "log_analytic": math.log(max(est, 1e-12)), "log_spatial": 0.0,
    }
    return feats, raw


def analytic_of(features: Sequence[float]) -> float:
    """The analytic estimate (seconds) stored in a feature vector."""
    return math.exp(features[FEATURES.index("log_analytic")])


def _padded(feats: Sequence[Sequence[float]]) -> np.ndarray:
    """Feature rows as an array; rows recorded before a feature was added get it as 0 — what every feature added
    since means for the kernels measured then (log_spatial: a kernel of constant extents)."""
    return np.asarray([list(f) + [0.0] * (len(FEATURES) - len(f)) for f in feats], dtype=np.float32)


_SPATIAL = FEATURES.index("log_spatial")


class LearnedModel:
    """XGBoost ranking model (objective rank:pairwise) over FEATURES; groups are workloads. Before it has seen
    two measured candidates of some workload it ranks by the analytic estimate.

    `split=True` (a workload over symbolic dims: tune/sizes.py) is DietCode's split, cost = f_MK × f_spatial: a
    regression (XGBoost, squared error) learns the micro-kernel's log time from its features — the measured log
    time less the analytic `log_spatial`, centred per workload so that workloads of other sizes train it too — and
    the candidate's predicted log time is that plus its own `log_spatial`."""

    MIN_ROWS = 8

    def __init__(self, seed: int = 0, split: bool = False):
        self.seed, self.split = seed, split
        self.booster = None
        self.rows = 0

    def fit(self, groups: Sequence[tuple[Sequence[Sequence[float]], Sequence[float]]]) -> bool:
        """groups: per workload, (feature vectors, measured seconds). Returns whether a model was trained."""
        xs, ys, sizes = [], [], []
        for feats, secs in groups:
            if len(feats) < 2:
                continue
            x = _padded(feats)
            if self.split:  # the micro-kernel's log time: the measured one less the analytic spatial part
                y = np.log(np.asarray(secs, dtype=np.float64)) - x[:, _SPATIAL]
                ys += list(y - y.mean())
            else:  # relevance: speed relative to the workload's best, in 0..31 (pairwise pairs form where it differs)
                best = min(secs)
                ys += [float(np.clip(np.round(31 * (best / s) ** 2), 0, 31)) for s in secs]
            xs.append(x)
            sizes.append(len(feats))
        self.rows = sum(sizes)
        if self.rows < self.MIN_ROWS:
            self.booster = None
            return False
        import xgboost as xgb  # (imported only now: ≈ 3 s)
        x = np.concatenate(xs)
        if self.split:
            x[:, _SPATIAL] = 0.0  # f_MK sees the micro-kernel alone
        d = xgb.DMatrix(x, label=np.asarray(ys, dtype=np.float32))
        params = {"eta": 0.2, "max_depth": 5, "min_child_weight": 1, "subsample": 0.9, "colsample_bytree": 0.9,
                  "seed": self.seed, "verbosity": 0, "nthread": 1}
        if self.split:
            params["objective"] = "reg:squarederror"
        else:
            d.set_group(sizes)
            params["objective"] = "rank:pairwise"
        self.booster = xgb.train(params, d, num_boost_round=60)
        return True

    def score(self, feats: Sequence[Sequence[float]]) -> np.ndarray:
        """Higher = predicted faster."""
        x = _padded(feats) if len(feats) else np.zeros((0, len(FEATURES)), dtype=np.float32)
        if self.booster is None or not len(x):
            return -x[:, FEATURES.index("log_analytic")] if len(x) else np.zeros(0)
        import xgboost as xgb
        if not self.split:
            return self.booster.predict(xgb.DMatrix(x))
        spatial = x[:, _SPATIAL].copy()
        x[:, _SPATIAL] = 0.0
        return -(self.booster.predict(xgb.DMatrix(x)) + spatial)  # −(log f_MK⁻¹ + log f_spatial⁻¹)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (scipy's, ties averaged)."""
    from scipy.stats import spearmanr
    if len(a) < 3:
        return float("nan")
    r = spearmanr(a, b).statistic
    return float(r)
