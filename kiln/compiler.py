"""The compiler driver. `lower()` is the whole pipeline in one function, in order (as Halide's
Lower.cpp): every stage can be printed between any two passes (`kiln explain`)."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from kiln.cachedir import cache_dir, compiler_fingerprint
from kiln.errors import TargetError
from kiln.frontend.torch.importer import AtenProgram
from kiln.graph.ir import Graph
from kiln.target import Target, host, missing_features, resolve
from kiln.tune.verify import register_model_builder

if TYPE_CHECKING:
    from kiln.kernel.dynamic import BatchChunk

__version__ = "0.1.0"

# every switch the pipeline understands (all on by default); `kiln bench --ablate` turns each off in turn
PASS_OPTIONS: tuple[str, ...] = ("quantize_qdq", "fold_constants", "recognize_gelu", "fold_pad", "fold_batchnorm",
                                 "scale_after_matmul", "elementwise_through_views", "conv1d_as_2d",
                                 "pad_pair_channels", "block_layout", "winograd", "pack_weights", "lower_precision",
                                 "fusion", "fuse_elementwise", "fuse_epilogue", "fuse_axes", "vectorize",
                                 "register_tile", "prefetch", "pack_operands", "parallel", "memory_reuse", "amx",
                                 "dpbf16", "mmla", "compact_rows", "fuse_winograd", "thread_parts",
                                 "fuse_rows", "transpose_blocks", "kernel_families", "word_weights",
                                 "native_bf16_only")
# switches that only matter for a bf16 or int8 build (`kiln bench --ablate` skips them for an fp32 build)
PRECISION_OPTIONS: tuple[str, ...] = ("pad_pair_channels", "lower_precision", "amx", "dpbf16", "mmla",
                                      "word_weights", "native_bf16_only")

Trace = Callable[[str, Any], None]


@dataclass
class Compiled:
    """What `lower` produces: every intermediate stage, kept for `explain` and tests."""
    graph: Graph
    program: Any = None
    plan: Any = None
    llvm_ir: str = ""                                    # the single module's (empty when split into units)
    objs: list[bytes] = field(default_factory=list)     # one object, or the entry module's and one per unit
    kernel_functions: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    tuned: dict[str, dict] = field(default_factory=dict)   # kernel name → the tuning record it runs (apply_tuning)
    chunk: BatchChunk | None = None  # laid out for a chunk of samples: a larger batch runs chunk by chunk

    @property
    def obj(self) -> bytes:
        """The object of a single-module build (jobs=1: cross targets, `explain`), b"" before step 9."""
        if len(self.objs) > 1:
            raise ValueError(f"this build has {len(self.objs)} objects (split into compile units): use .objs")
        return self.objs[0] if self.objs else b""


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_options(options: dict[str, Any]) -> dict[str, bool]:
    unknown = set(options) - set(PASS_OPTIONS)
    if unknown:
        raise TypeError(f"unknown compile option(s) {sorted(unknown)}; known: {', '.join(PASS_OPTIONS)}")
    return {k: bool(v) for k, v in options.items()}


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cycle collector off while the compiler runs: a compile allocates hundreds of thousands of long-lived
    objects (kernel IR, llvmlite instructions), and the collector's passes over them cost resnet50's codegen a third
    of its time (2.4 → 1.6 s CPU). What the compile leaves in cycles is collected afterwards. Also a decorator.

    `_compile` runs whole under it, loading included: enabled between the lowering and the load, the collector's
    first young pass walked every object the lowering made, still alive (resnet50: 0.03–0.04 s; 0.09–0.13 s when
    the expression rewrites still left their memos in cycles: kernel/ir.py rewrite)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@gc_paused()
def lower(model: onnx.ModelProto | str | bytes | AtenProgram, target: Target, num_threads: int,
          options: dict[str, bool], input_shapes: dict[str, Sequence[int]] | None = None, trace: Trace | None = None,
          stop_after: str = "object", strategy: str = "direct",
          strategies: dict[str, str] | None = None, bounds_check: bool = False, tuning: Any = None,
          precision: str = "fp32", dynamic_bounds: dict[str, tuple[int, int]] | None = None,
          jobs: int = 1) -> Compiled:
    """`tuning`: an open kiln.tune.database.TuningDatabase whose best records for this target are applied
    (step 3b), or None for the default schedules. `jobs` > 1: the host JIT's codegen and LLVM over that many
    processes, the kernels in several objects (step 6; c.llvm_ir stays empty) — else ONE module, one object."""
    from kiln.frontend.onnx import import_onnx
    from kiln.frontend.torch import import_aten
    from kiln.graph.passes.precision import assign_precision
    from kiln.strategy import assign_strategies

    t0 = time.perf_counter()
    if isinstance(model, AtenProgram):
        graph = import_aten(model)                                           # 1. torch FX (Core ATen) → graph IR
    else:
        graph = import_onnx(model, input_shapes, dynamic_bounds)             # 1. ONNX → graph IR (symbolic dims)
    graph = assign_strategies(graph, strategy, strategies)                   #    direct/ukernel/library per anchor
    graph = assign_precision(graph, precision, target, options)              #    fp32/bf16 per anchor
    if any(n.attrs.get("strategy") == "auto" for n in graph.nodes):          #    auto: measured on the target
        from kiln.autostrategy import choose_strategies
        graph = choose_strategies(graph, target, num_threads, options, lambda one: executable_of(
            lower_graph(one, target, num_threads, options), target, num_threads))
    if trace:
        trace("import", graph)
    return lower_graph(graph, target, num_threads, options, trace, stop_after, bounds_check, t0, tuning, jobs)


@gc_paused()
def lower_graph(graph: Graph, target: Target, num_threads: int, options: dict[str, bool],
                trace: Trace | None = None, stop_after: str = "object", bounds_check: bool = False,
                t0: float | None = None, tuning: Any = None, jobs: int = 1) -> Compiled:
    """Steps 2–9 of `lower` on a graph that is already imported (and has its strategies assigned)."""
    from kiln.codegen.families import merge_families
    from kiln.codegen.jit import emit_object, opt_level, optimize
    from kiln.codegen.module import build_module_text
    from kiln.codegen.split import split_kernels, start_units
    from kiln.graph.passes import run_graph_passes
    from kiln.kernel.build import build_program
    from kiln.kernel.compact import compact_trailing
    from kiln.kernel.dynamic import DynamicDims, batch_chunk
    from kiln.runtime.memory import plan_memory
    from kiln.schedule.default import schedule_program
    from kiln.schedule.winograd_fuse import fuse_winograd
    from kiln.tune.apply import apply_tuning

    t = t0 if t0 is not None else time.perf_counter()
    times: dict[str, float] = {}

    def lap(stage: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[stage] = now - t
        t = now

    tr = trace or (lambda stage, obj: None)
    chunk = batch_chunk(graph)                                               # 2a. too big whole at the bounds: laid
    if chunk is not None:                                                    #     out for a chunk of samples
        graph.bounds[chunk.symbol] = (1, chunk.samples)
    graph = run_graph_passes(graph, options, target, trace=lambda name, g: tr(f"graph:{name}", g))  # 2. graph passes
    lap("graph")
    out = Compiled(graph, timings=times, chunk=chunk)
    dims = DynamicDims.of(graph)                                             # 3a. symbolic dims → max layouts
    prog = build_program(graph, options, dims)                               # 3. lower + fuse → kernels
    if options.get("compact_rows", True):                                    #    [.., seq] intermediates: rows
        compact_trailing(prog)                                               #    seq apart, not the bound's
    applied = apply_tuning(prog, tuning, target, num_threads, options)       # 3b. tuned schedules (database)
    out.tuned = applied.tuned
    bound = [dict(zip((b.name for b in [*k.args, *k.scratch]), names)) for k, names in zip(prog.kernels, prog.bindings)]
    schedule_program(prog.kernels, target, num_threads, options, applied.configs)  # 4. each distinct kernel once
    # the bindings again, by buffer name: a schedule adds scratch (packs) and takes it away (fuse_rows: one row each)
    for k, names, was in zip(prog.kernels, prog.bindings, bound):
        names[:] = [was.get(b.name) or f"{k.name}.{b.name}" for b in [*k.args, *k.scratch]]
        prog.buffers.update({n: b for n, b in zip(names, [*k.args, *k.scratch]) if n not in prog.buffers})
    if options.get("fuse_winograd", True) and dims is None:                 # 4b. Winograd input transforms into
        fuse_winograd(prog)                                                  #     their products, block by block
    tr("kernels", prog)
    units = split_kernels(prog, jobs if stop_after == "object" else 1, bounds_check)  # 5. kernels → compile units
    families = options.get("kernel_families", True)                         #     (a unit: IR, families, -O3, object)
    building = start_units(prog, units, target, jobs, families) if len(units) > 1 else None  # forked, one per core
    try:
        plan = plan_memory(prog, reuse=options.get("memory_reuse", True))   # 6. static memory plan (meanwhile)
        if dims is not None:                                                 #    (symbolic: at the upper bounds)
            check_dynamic_arena(plan.arena_bytes, dims)
    except BaseException:
        if building:
            building.close()
        raise
    out.program, out.plan = prog, plan
    lap("lower")
    if stop_after == "kernels":
        return out
    if building:                                                             # 7–9. the entry module kiln_main here,
        out.objs, out.kernel_functions, cpu = building.finish(plan)          #      the units' objects collected
        lap("codegen+llvm")
        times.update({f"{k}_cpu": v for k, v in cpu.items()})
        return out
    out.llvm_ir, out.kernel_functions = build_module_text(prog, plan, target, bounds_check)  # 7. ONE LLVM module
    if families:                                                             # 7b. functions equal up to constants:
        out.llvm_ir = merge_families(out.llvm_ir)                            #     one each (codegen/families.py)
    tr("llvm", out.llvm_ir)
    lap("codegen")
    if stop_after == "llvm":
        return out
    mod = optimize(out.llvm_ir, target, opt_level(prog.dims is not None))   # 8. LLVM -O3 (-O2: symbolic dims)
    tr("llvm-opt", str(mod))
    out.objs = [emit_object(mod, target)]                                    # 9. machine code
    lap("llvm")
    return out


MAX_DYNAMIC_ARENA = 8 << 30  # bytes: past this, a symbolic model's upper bounds are almost surely not what was meant


def check_dynamic_arena(arena_bytes: int, dims: Any) -> None:
    """A symbolic model's arena is planned at its upper bounds: refuse one that would not fit in memory, naming the
    bounds to lower (dynamic_bounds=) — the default bound of an unbounded symbol is generous."""
    if arena_bytes > MAX_DYNAMIC_ARENA:
        from kiln.errors import ModelError
        raise ModelError(f"at its upper bounds {dims.bounds} the model needs {arena_bytes / 2**30:.1f} GiB of "
                         f"activations (more than {MAX_DYNAMIC_ARENA >> 30} GiB): pass dynamic_bounds= with smaller "
                         f"upper bounds, or input_shapes=")


HASHED_TENSOR_BYTES = 1 << 16  # initializers this large enter the cache key as their SHA-1


def _itemsize(data_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 1


def model_identity(proto: onnx.ModelProto) -> bytes:
    """What the compile cache knows a model by: its serialization with the raw bytes of each large initializer
    replaced by their SHA-1 (threads hash them: hashlib releases the GIL). Serializing resnet50's 100 MB of
    weights and hashing the result cost a cache hit 0.16 s; the copy without them serializes in 0.02 s."""
    from concurrent.futures import ThreadPoolExecutor

    # sized from dims and type: each read of raw_data copies the bytes out of the proto (100 MB: 0.015 s)
    big = [i for i, t in enumerate(proto.graph.initializer) if t.HasField("raw_data")
           and math.prod(t.dims) * _itemsize(t.data_type) >= HASHED_TENSOR_BYTES]
    if not big:
        return proto.SerializeToString(deterministic=True)
    with ThreadPoolExecutor(min(len(big), default_threads())) as pool:
        digests = list(pool.map(lambda i: hashlib.sha1(proto.graph.initializer[i].raw_data).digest(), big))
    light = onnx.ModelProto()
    light.CopyFrom(proto)  # upb shares the tensors' bytes: cheap
    for i, d in zip(big, digests):
        light.graph.initializer[i].raw_data = d
    return light.SerializeToString(deterministic=True)


def _cache_key(model_bytes: bytes, target: Target, num_threads: int, options: dict[str, bool],
               input_shapes: dict | None, strategy: str = "direct", strategies: dict[str, str] | None = None,
               bounds_check: bool = False, tuning: str = "", precision: str = "fp32",
               dynamic_bounds: dict[str, tuple[int, int]] | None = None) -> str:
    h = hashlib.sha256(model_bytes)
    h.update(json.dumps([__version__, compiler_fingerprint(), target.key, num_threads, sorted(options.items()),
                         sorted((k, list(v)) for k, v in (input_shapes or {}).items()), strategy,
                         sorted((strategies or {}).items()), bool(bounds_check), tuning, precision,
                         sorted((k, [int(x) for x in v]) for k, v in (dynamic_bounds or {}).items())]).encode())
    return h.hexdigest()[:32]


def compile(model: onnx.ModelProto | str | bytes | os.PathLike | AtenProgram, target: str | Target = "host",
            num_threads: int | None = None, input_shapes: dict[str, Sequence[int]] | None = None,
            cache: bool = True, strategy: str = "direct", strategies: dict[str, str] | None = None,
            bounds_check: bool = False, tuning: str | os.PathLike = "auto", precision: str = "fp32",
            dynamic_bounds: dict[str, tuple[int, int]] | None = None, **options: bool):
    """Compile an ONNX model (proto, path or bytes) — or a Core ATen program from the torch frontend
    (kiln.frontend.torch.AtenProgram; `kiln.from_torch` and the "kiln" torch.compile backend make them) — into an
    Executable for `target`.

    `strategy` says how anchor ops (MatMul, Conv) are built — "direct" | "ukernel" | "library[:name]" | "auto"
    (kiln/strategy.py); `strategies` overrides it per node name or op type. `bounds_check=True` is the debug
    build: every access is checked and a run that went out of bounds raises kiln.errors.BoundsError.
    `tuning`: "auto" applies the best records of the tuning database ($KILN_CACHE_DIR/tuning.db, written by
    `kiln tune`) measured on this target; "off" the default schedules; or the path of another database.
    `exe.meta["tuned"]` names the kernels that run tuned schedules.
    `precision="bf16"` multiplies the anchors' operands in bfloat16 with float32 accumulation
    (graph/passes/precision.py; exe.meta["precision"] says how each anchor ran).
    Symbolic input dims (ONNX dim_param, or unnamed dynamic dims) stay symbols: `dynamic_bounds={"seq": (1, 512)}`
    bounds them (inclusive; default (1, kiln.graph.symbolic.DEFAULT_BOUND)); `input_shapes` pins them instead."""
    from kiln.frontend.onnx import load_model
    from kiln.graph.passes.precision import check_precision
    from kiln.strategy import check_strategy

    opts = check_options(options)
    check_precision(precision)
    check_strategy(strategy)
    for v in (strategies or {}).values():
        check_strategy(v)
    tgt = resolve(target)
    if tgt.triple != host().triple:  # its machine code cannot be loaded into this process
        raise TargetError(f"target {tgt.name} is another ISA than this machine: build it with "
                          f"kiln.cross.build_binary, or `kiln compile MODEL --target {tgt.name} -o FILE.o`")
    missing = missing_features(tgt)
    if missing:  # an emit-only width (AVX-512 on an AVX2 host): its code would die of SIGILL here
        raise TargetError(f"target {tgt.name} needs {', '.join(missing)}, which this CPU ({host().cpu}) lacks: "
                          f"emit its object with `kiln compile MODEL --target {tgt.name} -o FILE.o` "
                          f"(or kiln.compiler.lower(..., stop_after='object'))")
    threads = int(num_threads) if num_threads else default_threads()
    if threads < 1:
        raise ValueError(f"num_threads must be ≥ 1, got {num_threads}")
    if isinstance(model, AtenProgram):
        if input_shapes or dynamic_bounds:
            raise ValueError("input_shapes and dynamic_bounds are for ONNX models: a torch program has the shapes it "
                             "was traced with")
        proto, identity = model, model.fingerprint()
    else:
        proto = load_model(model)
        identity = model_identity(proto) if cache else b""
    db = _tuning_db(tuning)
    try:
        return _compile(proto, identity, tgt, threads, opts, input_shapes, cache, strategy, strategies,
                        bounds_check, db, precision, dynamic_bounds)
    finally:
        if db is not None:
            db.close()


def _tuning_db(tuning: str | os.PathLike):  # noqa: ANN202 - kiln.tune.database.TuningDatabase | None
    """The database `tuning=` names: None for "off" or a default database that does not exist yet."""
    from kiln.tune.database import TuningDatabase, open_for_compile

    if not isinstance(tuning, (str, os.PathLike)):
        raise TypeError(f"tuning must be 'auto', 'off' or a database path, not {type(tuning).__name__}")
    if tuning == "off":
        return None
    if tuning == "auto":
        return open_for_compile(None)
    return TuningDatabase(tuning, create=False)


@gc_paused()
def _compile(proto: onnx.ModelProto | AtenProgram, identity: bytes, tgt: Target, threads: int,
             opts: dict[str, bool], input_shapes: dict | None, cache: bool, strategy: str,
             strategies: dict[str, str] | None, bounds_check: bool, db: Any, precision: str,
             dynamic_bounds: dict[str, tuple[int, int]] | None = None):
    from kiln.runtime.executable import Executable

    path = None
    if cache:
        tuned = ""
        if db is not None:
            from kiln.tune.workload import target_key
            tuned = db.fingerprint(target_key(tgt, threads))
        key = _cache_key(identity, tgt, threads, opts, input_shapes, strategy,
                         strategies, bounds_check, tuned, precision, dynamic_bounds)
        path = os.path.join(cache_dir(), key + ".kiln")
        _finish_saving(path)  # this process may still be writing it
        if os.path.exists(path):
            try:
                exe = Executable.load(path, num_threads=threads, map_weights=True)
                exe.cached = True
                return exe
            except ValueError:
                pass  # stale or foreign cache entry: recompile and overwrite
    from kiln.codegen.split import compile_jobs

    c = lower(proto, tgt, threads, opts, input_shapes, strategy=strategy, strategies=strategies,
              bounds_check=bounds_check, tuning=db, precision=precision, dynamic_bounds=dynamic_bounds,
              jobs=compile_jobs())
    exe = executable_of(c, tgt, threads, bounds_check)
    if path:  # written while the caller runs the model: resnet50's 100 MB of weights take ~0.3 s to write
        saving = threading.Thread(target=_save_to_cache, args=(exe, path), name="kiln-cache-save")
        _SAVING.setdefault(path, []).append(saving)
        saving.start()
    return exe


_SAVING: dict[str, list[threading.Thread]] = {}  # cache entries being written by this process (two threads may
# compile the same model at once: both write, the last rename wins)


def _save_to_cache(exe: Any, path: str) -> None:
    """`save` writes under a temporary name, then renames: another process sees no entry or a whole one. Not a daemon
    thread, so the interpreter finishes the write before it exits; a failed write (a full disk) only loses the
    entry. At the lowest CPU priority (Linux: this thread alone): it runs beside the caller's first runs, and on the
    core of the pool's pinned worker it took that worker's time slices — a kernel then waited a scheduler tick for the
    worker's chunk (mobilenetv2 right after a cache-miss compile: 2–6 of the first twelve runs at 5.9–9.0 ms instead
    of 1.7–2.7 in three processes without it, none in three with it)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    try:
        exe.save(path)
    except OSError as e:
        import logging
        logging.getLogger("kiln").warning("could not write the compile cache entry %s: %s", path, e)


def _finish_saving(path: str) -> None:
    for saving in _SAVING.pop(path, []):
        saving.join()


def finish_cache_writes() -> None:
    """Wait until every compile cache entry this process started writing is on disk."""
    for path in list(_SAVING):
        _finish_saving(path)


def _int8_meta(g: Graph, tgt: Target, precision: dict[str, str]) -> str | None:
    """How this build's 8-bit dot products run (VNNI or the named fallback; AMX tiles where anchors took them: their
    `precision` is "amx"), when it has integer anchors."""
    anchors = {n.name for n in g.nodes if n.op in ("QConv", "QMatMul", "QPackedConv", "QPackedMatMul")}
    if not anchors:
        return None
    from kiln.codegen.int8 import dot_method
    amx = any(precision.get(a) == "amx" for a in anchors)
    return f"tdpbusd (AMX tiles), elsewhere {dot_method(tgt)}" if amx else dot_method(tgt)


def _bf16_meta(g: Graph, tgt: Target) -> str | None:
    """What the anchors of a precision="bf16" build multiply on (graph/passes/precision.py), when it has them."""
    asked = [n for n in g.nodes if n.attrs.get("precision") == "bf16" or n.attrs.get("bf16_kept_fp32")]
    if not asked:
        return None
    from kiln.graph.passes.precision import bf16_dot_product
    where = f"{tgt.name} ({tgt.cpu}, {tgt.vector_bits}-bit)"
    if bf16_dot_product(tgt):
        return f"bf16 dot products of {where} (per anchor: exe.meta['precision'])"
    if any(n.attrs.get("precision") == "bf16" for n in asked):
        return f"no bf16 dot product on {where}: emulated (bf16 storage, float32 multiply-adds)"
    return (f"no bf16 dot product on {where} (AMX, AVX512_BF16, Arm BF16): the anchors run float32 — emulated bf16 "
            "is 2.2-2.8x slower than float32 there (switch native_bf16_only=False emulates)")


def executable_of(c: Compiled, tgt: Target, threads: int, bounds_check: bool = False):  # noqa: ANN201
    """Load the machine code of a lowered model into this process, with the metadata `run`/`save` need."""
    from kiln.codegen.bounds import buffer_names
    from kiln.runtime.executable import Executable

    g, dims = c.graph, c.program.dims
    shape = (lambda v: list(v.shape)) if dims is None else (lambda v: [dims.code(d) for d in v.shape])
    how_multiplied = {node: how for k in c.program.kernels for node, how in k.precision.items()}
    meta = {
        "inputs": [{"name": v.name, "dtype": v.dtype, "shape": shape(v)} for v in g.inputs],
        "outputs": [{"name": n, "dtype": v.dtype, "shape": shape(v)} for n, v in zip(g.output_names, g.outputs)],
        # symbolic dims (kernel/dynamic.py): their names, bounds, and each input's/output's max layout
        "dynamic": None if dims is None else {
            **dims.meta(g), "max_inputs": [dims.max_layout(v) for v in c.program.graph.inputs],
            "max_outputs": [dims.max_layout(v) for v in c.program.graph.outputs],
            "packed_inputs": [dims.packed(v) for v in c.program.graph.inputs],
            "packed_outputs": [dims.packed(v) for v in c.program.graph.outputs],
            "fallbacks": {k.name: k.fallbacks for k in c.program.kernels if k.fallbacks},
            "chunk": c.chunk.meta() if c.chunk is not None else None},
        "compilations": 1,  # a dynamic executable serves every size in its bounds from this one compilation
        "arena_bytes": c.plan.arena_bytes, "num_threads": threads, "kernels": [k.name for k in c.program.kernels],
        "flops": [k.flops for k in c.program.kernels], "compile_s": c.timings,
        "symbols": sorted({s for k in c.program.kernels for s in k.symbols}),
        "strategies": {node: how for k in c.program.kernels for node, how in k.strategies.items()},
        # how each bf16 / int8 anchor multiplied: "amx" tiles, "avx512bf16" vdpbf16ps, "bfdot", "bfmmla", "emulated",
        # "smmla" (an int8 anchor's direct block tile; others: exe.meta["int8"] names the target's dot product),
        # or "fp32" (kept: no bf16 dot product for its form on this target, graph/passes/precision.py pairs_only)
        "precision": {**{n.name: "fp32" for n in g.nodes if n.attrs.get("bf16_kept_fp32")}, **how_multiplied},
        "amx": "amx" in how_multiplied.values(),
        "bounds_check": bool(bounds_check),
        "int8": _int8_meta(g, tgt, how_multiplied),
        "bf16": _bf16_meta(g, tgt),
        "bounds_buffers": buffer_names(c.program) if bounds_check else [],
        "tuned": c.tuned,
    }
    return Executable(c.objs, c.plan.weights, meta, tgt)


# `kiln tune` checks its records in the whole model (tune/verify.py); the tune package sits below this module and
# builds models through what it is handed here
register_model_builder(compile)
