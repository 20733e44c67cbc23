"""A compiled model: machine code + weights + memory plan, callable like an onnxruntime session."""
from __future__ import annotations

import contextlib
import ctypes
import io
import json
import mmap
import os
import threading
import time
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.cachedir import atomic_path
from kiln.codegen.bounds import RECORD_ACCESSOR, RECORD_LEN
from kiln.codegen.jit import LoadedObject
from kiln.codegen.module import ENTRY
from kiln.errors import BoundsError
from kiln.runtime.memory import aligned_buffer
from kiln.runtime.threadpool import pool_address
from kiln.target import Target

FORMAT_VERSION = 3  # 3: meta["objects"] names the object files (2: one, module.o; still read)
_ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)
_HOOK_T = ctypes.CFUNCTYPE(None, ctypes.c_int32)
PLANS_KEPT = 64  # input shapes whose run plan a dynamic executable keeps


@dataclass(frozen=True)
class _ShapePlan:
    """A dynamic executable's run for one set of input shapes, but the call (Executable._plan)."""
    out_shapes: list[tuple[int, ...]]
    in_stage: list[np.ndarray | None]   # the max-layout copy an input goes through, or None: used in place
    out_stage: list[np.ndarray | None]  # the same for the outputs
    dims: list[tuple[int, int]]         # (slot in the module's dims array, the symbol's value)


@dataclass
class IOSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]  # a str is a symbolic dim ("seq", "(seq * 3)"; kiln/runtime/shapes.py)


class Executable:
    """`exe.run({name: array}) -> [outputs]`; `exe.save(path)`; `kiln.load(path)`."""

    def __init__(self, objs: bytes | list[bytes], weights: bytes, meta: dict[str, Any], target: Target):
        # the machine code: one object, or the entry module's and one per compile unit (codegen/split.py)
        self.objs: list[bytes] = [objs] if isinstance(objs, bytes) else list(objs)
        self.meta, self.target = meta, target
        self.inputs = [IOSpec(d["name"], d["dtype"], tuple(d["shape"])) for d in meta["inputs"]]
        self.outputs = [IOSpec(d["name"], d["dtype"], tuple(d["shape"])) for d in meta["outputs"]]
        self.kernel_names: list[str] = meta.get("kernels", [])
        self.num_threads: int = meta["num_threads"]
        w = weights if isinstance(weights, np.ndarray) else np.frombuffer(weights, dtype=np.uint8) if len(weights) \
            else None
        if w is not None and w.ndim == 1 and w.dtype == np.uint8 and w.ctypes.data % 64 == 0:
            self._weights = w  # already aligned (the memory plan's blob, or load read into it): no copy
        else:
            self._weights = _aligned(len(weights), zero=False)
            self._weights[:len(weights)] = np.frombuffer(weights, dtype=np.uint8)
        self._arena = _aligned(meta["arena_bytes"])
        # what every call passes, resolved once (a call of a sub-millisecond model is otherwise ~5% Python)
        self._arena_addr, self._weights_addr = self._arena.ctypes.data, self._weights.ctypes.data
        self._names = frozenset(s.name for s in self.inputs)
        self._dtypes = [np.dtype(s.dtype) for s in self.inputs]
        self._in_ptrs = (ctypes.c_void_p * max(1, len(self.inputs)))()
        self._out_ptrs = (ctypes.c_void_p * max(1, len(self.outputs)))()
        self._ptr_addrs = ctypes.addressof(self._in_ptrs), ctypes.addressof(self._out_ptrs)
        if meta.get("symbols"):  # library calls (strategy="library"): bind their symbols before linking
            from kiln.library import bind_symbols
            self._libraries = bind_symbols(meta["symbols"], self.num_threads)
        if meta.get("amx"):  # AMX tiles (precision="bf16"): the process must hold the tile permission first
            from kiln.runtime.amx import ensure
            ensure()
        self._code = LoadedObject(self.objs, target)
        self._entry = _ENTRY_T(self._code.address(ENTRY))
        self._pool = pool_address()
        self._bounds = _bounds_record(self._code) if meta.get("bounds_check") else None
        self.dynamic: dict[str, Any] | None = meta.get("dynamic")
        if self.dynamic:  # symbolic dims: their values go into the module's dims array before each call
            from kiln.codegen.dims import DIMS_ACCESSOR, MAX_DIMS
            addr = ctypes.CFUNCTYPE(ctypes.c_void_p)(self._code.address(DIMS_ACCESSOR))()
            self._dims = (ctypes.c_int64 * MAX_DIMS).from_address(addr)
            self._staging: dict[tuple[str, int], np.ndarray] = {}  # max-layout copies of inputs/outputs
            from kiln.runtime.shapes import shape_function
            self._out_shapes = [shape_function(s.shape) for s in self.outputs]
            self._plans: dict[tuple[tuple[int, ...], ...], _ShapePlan] = {}
        self._lock = threading.Lock()  # one arena: one run at a time
        self.cached = False  # kiln.compile served it from its compile cache

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    def _check(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not isinstance(feeds, dict):
            raise ValueError(f"feeds must be a dict of input name → array; inputs are {self.input_names}")
        unknown = feeds.keys() - self._names
        if unknown:
            raise ValueError(f"unknown input name(s) {sorted(unknown)}; the model's inputs are "
                             + ", ".join(f"{s.name}: {s.dtype}{list(s.shape)}" for s in self.inputs))
        arrays = []
        for s, dtype in zip(self.inputs, self._dtypes):
            if s.name not in feeds:
                raise ValueError(f"missing input '{s.name}' ({s.dtype}{list(s.shape)})")
            a = np.asarray(feeds[s.name])
            if a.dtype != dtype:
                raise ValueError(f"input '{s.name}' has dtype {a.dtype}, expected {s.dtype}")
            if self.dynamic:
                arrays.append(np.ascontiguousarray(a))
                continue
            if tuple(a.shape) != s.shape:
                raise ValueError(f"input '{s.name}' has shape {list(a.shape)}, expected {list(s.shape)}")
            arrays.append(np.ascontiguousarray(a))
        return arrays

    def run(self, feeds: dict[str, np.ndarray], profile: dict[str, float] | None = None) -> list[np.ndarray]:
        """Run once. With `profile` (a dict), adds the seconds spent in each kernel to it."""
        ins = self._check(feeds)
        if self.dynamic:
            if self.dynamic.get("chunk"):
                return self._run_chunks(ins, profile, self.dynamic["chunk"])
            return self._run_dynamic(ins, profile)
        outs = [np.empty(s.shape, dtype=s.dtype) for s in self.outputs]
        self._run_arrays(ins, outs, profile)
        return outs

    def _run_chunks(self, ins: list[np.ndarray], profile: dict[str, float] | None,
                    chunk: dict[str, Any]) -> list[np.ndarray]:
        """A model laid out for a chunk of samples (kernel/dynamic.py: batch_chunk): a larger batch runs chunk by
        chunk — the inputs that lead with the batch symbol cut along it, the others whole —, the outputs (each
        leading with it) concatenated."""
        from kiln.runtime.shapes import bind

        sym, samples = chunk["symbol"], chunk["samples"]
        # the whole batch checked against the bounds it was compiled for (the layout's bound is the chunk's)
        n = bind(self.inputs, ins, {**self.dynamic["bounds"], sym: tuple(chunk["bounds"])})[sym]
        lead = [i for i, s in enumerate(self.inputs) if s.shape and s.shape[0] == sym]
        if n <= samples:
            return self._run_dynamic(ins, profile)
        parts = [self._run_dynamic([a[start:start + samples] if i in lead else a for i, a in enumerate(ins)], profile)
                 for start in range(0, n, samples)]
        return [np.concatenate([p[j] for p in parts]) for j in range(len(self.outputs))]

    def _run_dynamic(self, ins: list[np.ndarray], profile: dict[str, float] | None) -> list[np.ndarray]:
        """Bind the symbols from the inputs (checked before anything runs), place the inputs in their max layouts,
        run, and cut the outputs to their actual shapes (kernel/dynamic.py, runtime/shapes.py)."""
        key = tuple(a.shape for a in ins)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(ins)
            if len(self._plans) >= PLANS_KEPT:  # a decode loop's shapes change every step: keep the newest
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan
        outs = [np.empty(shape, dtype=s.dtype) for s, shape in zip(self.outputs, plan.out_shapes)]
        with self._lock:  # the dims array and the staging copies are the executable's, like its arena
            placed = []
            for a, stage in zip(ins, plan.in_stage):
                if stage is not None:
                    stage[tuple(slice(0, n) for n in a.shape)] = a
                    a = stage
                placed.append(a)
            direct = [o if stage is None else stage for o, stage in zip(outs, plan.out_stage)]
            for i, v in plan.dims:
                self._dims[i] = v
            self._run_arrays(placed, direct, profile, locked=True)
            for o, d in zip(outs, direct):
                if d is not o:
                    o[...] = d[tuple(slice(0, n) for n in o.shape)]
        return outs

    def _plan(self, ins: list[np.ndarray]) -> _ShapePlan:
        """What a run with these input shapes does besides the call: the symbols' values (checked: a ValueError
        here, before anything runs), the outputs' shapes, and which inputs and outputs go through a max-layout
        staging copy. It depends on the shapes alone, so `_run_dynamic` keeps it per shape: a 1-token decode step
        (0.11 ms) paid 9 µs of Python for it on every run."""
        from kiln.runtime.shapes import bind, is_prefix
        dyn = self.dynamic
        values = bind(self.inputs, ins, dyn["bounds"])
        out_shapes = [shape(values) for shape in self._out_shapes]
        whole = dyn.get("per_sample") is None  # (split per sample, an input's samples lie a max sample apart)
        in_stage = [None if packed or (whole and is_prefix(a.shape, full)) else self._stage("in", i, full, s.dtype)
                    for i, (s, a, full, packed)
                    in enumerate(zip(self.inputs, ins, dyn["max_inputs"], dyn["packed_inputs"]))]
        out_stage = [None if packed or (whole and is_prefix(shape, full)) else self._stage("out", i, full, s.dtype)
                     for i, (s, shape, full, packed)
                     in enumerate(zip(self.outputs, out_shapes, dyn["max_outputs"], dyn["packed_outputs"]))]
        dims = [(dyn["symbols"].index(name), v) for name, v in values.items()]
        return _ShapePlan(out_shapes, in_stage, out_stage, dims)

    def _stage(self, kind: str, i: int, shape: list[int], dtype: str) -> np.ndarray:
        key = (kind, i)
        if key not in self._staging:
            self._staging[key] = np.zeros(shape, dtype=dtype)
        return self._staging[key]

    def _run_arrays(self, ins: list[np.ndarray], outs: list[np.ndarray], profile: dict[str, float] | None,
                    locked: bool = False) -> None:
        hook = None
        if profile is not None:
            last = [time.perf_counter()]

            def tick(k: int) -> None:
                now = time.perf_counter()
                name = self.kernel_names[k] if k < len(self.kernel_names) else f"k{k}"
                profile[name] = profile.get(name, 0.0) + now - last[0]
                last[0] = now
            hook = _HOOK_T(tick)
        try:
            self._call([_address(a) for a in ins], [_address(a) for a in outs], hook, locked)
        except BoundsError as err:
            err.outputs = outs
            raise

    def run_pointers(self, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """Run on buffers the caller owns, given by address: C-contiguous, of the dtypes and shapes of `self.inputs`
        and `self.outputs`, which the caller has checked (nothing is copied: kiln/torch passes tensors' data_ptr)."""
        if self.dynamic:
            raise ValueError("run_pointers needs the static shapes of a model without symbolic dims; this executable "
                             f"has symbolic dims {self.dynamic['symbols']}: use run()")
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise ValueError(f"{len(inputs)} input / {len(outputs)} output buffers for a model with "
                             f"{len(self.inputs)} inputs and {len(self.outputs)} outputs")
        self._call(inputs, outputs, None)

    def _call(self, inputs: Sequence[int], outputs: Sequence[int], hook: Any, locked: bool = False) -> None:
        with contextlib.nullcontext() if locked else self._lock:  # (the pointer arrays are the executable's too)
            self._in_ptrs[:len(inputs)], self._out_ptrs[:len(outputs)] = inputs, outputs
            if self._bounds is not None:
                ctypes.memset(self._bounds, 0, ctypes.sizeof(self._bounds))
            self._entry(self._ptr_addrs[0], self._ptr_addrs[1], self._arena_addr,
                        self._weights_addr, self.num_threads,
                        ctypes.cast(hook, ctypes.c_void_p) if hook else None, self._pool)
            violation = list(self._bounds) if self._bounds is not None and self._bounds[0] else None
        if violation:
            raise self._bounds_error(*violation)

    def _bounds_error(self, call: int, position: int, index: int, size: int, count: int) -> BoundsError:
        """Name the first violation a bounds-checked run recorded (layout: kiln/codegen/bounds.py)."""
        k = call - 1
        kernel = self.kernel_names[k] if 0 <= k < len(self.kernel_names) else f"#{k}"
        names = self.meta.get("bounds_buffers", [])
        if 0 <= k < len(names) and 0 <= position < len(names[k]):
            local, bound = names[k][position]
            buffer = f"'{local}'" + (f" (graph buffer '{bound}')" if bound != local else "")
        else:
            buffer = f"#{position} (a buffer the kernel allocates itself)" if position < 0 else f"#{position}"
        return BoundsError(kernel, buffer, index, size, count)

    __call__ = run

    # -- persistence -----------------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Written under a temporary name, then renamed over `path`: a process that mapped the old file's weights
        (`load(map_weights=True)`) keeps reading the old file, never a truncated one."""
        names = ["module.o"] if len(self.objs) == 1 else [f"module{i}.o" for i in range(len(self.objs))]
        with atomic_path(path) as tmp, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr("meta.json", json.dumps({**self.meta, "format": FORMAT_VERSION,
                                                "target_key": self.target.key, "objects": names}))
            for name, obj in zip(names, self.objs):
                z.writestr(name, obj)
            z.writestr(_page_aligned("weights.bin", z.fp.tell()), self._weights.data)

    @staticmethod
    def load(path: str | io.BytesIO, num_threads: int | None = None, map_weights: bool = False) -> Executable:
        """`map_weights`: map the weights from the file instead of reading them (the compile cache's entries, which
        only Kiln writes, and only by renaming a new file over them): no copy into fresh memory, which on this
        virtualized host cost resnet50's 100 MB 0.02 s or 0.25 s by the host's mood."""
        from kiln.target import host

        try:
            with zipfile.ZipFile(path) as z:
                meta = json.loads(z.read("meta.json"))
                if meta.get("format") not in (2, FORMAT_VERSION):
                    raise ValueError(f"{path}: format {meta.get('format')} but this Kiln reads {FORMAT_VERSION}")
                objs = [z.read(name) for name in meta.pop("objects", ["module.o"])]
                weights = _read_stored(path, z.getinfo("weights.bin"), map_weights) \
                    if isinstance(path, (str, os.PathLike)) else None
                if weights is None:
                    weights = z.read("weights.bin")
        except (zipfile.BadZipFile, KeyError, OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not a saved Kiln executable: {e}") from None
        target = _runnable_target(meta.get("target_key"))
        if target is None:
            raise ValueError(f"{path} was compiled for another target ({meta.get('target_key')}), not this host "
                             f"({host().key}) nor a narrower x86 width of it (kiln compile --target avx2 / sse)")
        if num_threads is not None:
            meta["num_threads"] = num_threads
        return Executable(objs, weights, meta, target)


def _runnable_target(key: str | None) -> Target | None:
    """The target a saved executable was compiled for, if this host runs its code: the host's own, or one of its
    narrower x86 widths (`kiln compile --target avx2` on an AVX-512 host); None otherwise."""
    from kiln.target import X86_WIDTHS, host, host_with

    h = host()
    if key == h.key:
        return h
    if h.arch == "x86_64":
        return next((t for t in map(host_with, X86_WIDTHS.values()) if t.vector_bits < h.vector_bits and t.key == key),
                    None)
    return None


PAGE = 4096
_PAD_ID = 0xD935  # the extra-field id Android's zipalign pads with; zip readers skip extra fields they do not know


def _page_aligned(name: str, header_offset: int) -> zipfile.ZipInfo:
    """A stored member whose data starts at a multiple of PAGE in the file (its local header padded by an extra
    field), so a mapping of the file is an aligned array of it."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = header_offset + 30 + len(name.encode()) + 4  # local header, name, the pad field's own id and size
    info.extra = _PAD_ID.to_bytes(2, "little") + ((-start) % PAGE).to_bytes(2, "little") + bytes((-start) % PAGE)
    return info


def _bounds_record(code: LoadedObject) -> ctypes.Array:
    """The i64 record a bounds-checked module keeps its first violation in (kiln/codegen/bounds.py)."""
    addr = ctypes.CFUNCTYPE(ctypes.c_void_p)(code.address(RECORD_ACCESSOR))()
    return (ctypes.c_int64 * RECORD_LEN).from_address(addr)


def _read_stored(path: str | os.PathLike, info: zipfile.ZipInfo, map_weights: bool = False) -> np.ndarray | None:
    """An uncompressed member as an aligned array: mapped from the file (`map_weights`, when its data is 64-byte
    aligned in the file), else read straight into an aligned buffer — one read, no intermediate bytes object and no
    second copy into alignment (a cache hit on resnet50 copied its 100 MB of weights twice). The CRC is checked either
    way. None if compressed."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local header for {info.filename}")
        name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
        start = info.header_offset + 30 + name_len + extra_len
        if map_weights and info.file_size and start % 64 == 0:
            if os.fstat(f.fileno()).st_size < start + info.file_size:
                raise zipfile.BadZipFile(f"{info.filename} is truncated")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: a write never reaches the file
            out = np.frombuffer(mapped, dtype=np.uint8, count=info.file_size, offset=start)
        else:
            out = _aligned(info.file_size, zero=False)
            f.seek(start)
            if info.file_size and f.readinto(memoryview(out)) != info.file_size:
                raise zipfile.BadZipFile(f"{info.filename} is truncated")
    if info.file_size and zlib.crc32(memoryview(out)) != info.CRC:  # a damaged file is an error, never wrong weights
        raise zipfile.BadZipFile(f"{info.filename} fails its CRC check")
    return out


def _address(a: np.ndarray) -> int:
    """The address of a contiguous array's data: through the buffer protocol where the array is writable (a
    fifth of `a.ctypes.data`'s cost, which builds a ctypes helper object per call), else through ctypes."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only (np.frombuffer of bytes, a broadcast view) or empty
        return a.ctypes.data


def _aligned(nbytes: int, align: int = 64, zero: bool = True) -> np.ndarray:
    return aligned_buffer(nbytes, align, zero)
