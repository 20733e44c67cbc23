"""Kiln as one of the measured systems, with the same interface as the peer adapters.

Strategies: "direct" is the compiler's default (vector code emitted directly); "ukernel" and
"library:<name>" are passed on as `strategy=` (kiln/strategy.py).
"ablate:-OPT" compiles the default with one option of `kiln.PASS_OPTIONS` switched off
(`kiln.compile(model, OPT=False)`). "tuned" (`kiln bench --tuned`) is the default strategy with the tuned
schedules of the tuning database (`kiln tune`, `kiln.compile(tuning="auto")`); every other Kiln column compiles
with `tuning="off"`, so "direct" is always the untuned default and "tuned ÷ direct" what tuning contributes.
Any Kiln strategy may name a narrower x86 width of the host after "@" ("direct@avx2", "tuned@avx2",
"ukernel@sse"): compiled with `target=` that width (`kiln bench --tuned --tuned-widths avx2` adds the
direct@avx2 and tuned@avx2 columns), so both code paths of an AVX-512 host are measured — and tuned — on it.
"torch-compile" is Kiln as a torch.compile backend (`torch.compile(module, backend="kiln")`, kiln/torch) on the
torch module — a torch workload's own nn.Module, or the ONNX model translated to aten ops — compiled at the first
call, which prepare() makes (so compile_s is the first-call compile time, as for inductor). Asked for explicitly
(`--strategy kiln=torch-compile`), not among the default strategies. A torch workload under any other strategy is
compiled ahead of time by `kiln.from_torch` with that strategy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .workload import Workload

ABLATE_PREFIX = "ablate:-"
TORCH_COMPILE = "torch-compile"
TUNED = "tuned"
WIDTH_SEP = "@"   # "<strategy>@<x86 width>": that strategy built for a narrower width of the host
# What the compiler will offer; listed here so reports can say plainly which have no records yet.
PLANNED_STRATEGIES: tuple[str, ...] = ("direct", "ukernel", "library")


def ablation_strategy(option: str) -> str:
    return f"{ABLATE_PREFIX}{option}"


def pass_options() -> tuple[str, ...] | None:
    """The compiler's switchable options, or None when it does not list them (yet)."""
    try:
        import kiln
    except ImportError:
        return None
    opts = getattr(kiln, "PASS_OPTIONS", None)
    # the bf16-only switches (lower_precision, amx) change nothing in the fp32 builds the benchmark ablates
    fp32_only = set(getattr(getattr(kiln, "compiler", None), "PRECISION_OPTIONS", ()))
    return tuple(o for o in opts if o not in fp32_only) if opts is not None else None


def compiler_strategies() -> tuple[str, ...]:
    """The strategies Kiln can build on this host (kiln.autostrategy.candidates: direct, ukernel if the ISA has
    a microkernel, library:<name> per installed library); ("direct",) for a Kiln without strategies."""
    try:
        from kiln.autostrategy import candidates
        from kiln.target import host
    except ImportError:
        return ("direct",)
    return tuple(candidates(host()))


def split_width(strategy: str) -> tuple[str, str | None]:
    """("tuned", "avx2") for "tuned@avx2"; (strategy, None) without a width."""
    base, sep, width = strategy.partition(WIDTH_SEP)
    if not sep:
        return strategy, None
    from kiln.target import X86_WIDTHS
    if width not in X86_WIDTHS:
        raise ValueError(f"Kiln strategy {strategy!r}: the width after {WIDTH_SEP!r} must be one of "
                         f"{', '.join(X86_WIDTHS)}")
    return base, width


def compile_kwargs(strategy: str, threads: int) -> dict[str, Any]:
    """The keyword arguments of kiln.compile for one strategy name."""
    kwargs: dict[str, Any] = {"num_threads": threads}
    strategy, width = split_width(strategy)
    if width is not None:
        kwargs["target"] = width
    if strategy.startswith(ABLATE_PREFIX):
        kwargs[strategy[len(ABLATE_PREFIX):]] = False
    elif strategy == TUNED:
        kwargs["tuning"] = "auto"
    elif strategy not in ("direct", "default"):
        kwargs["strategy"] = strategy
    return kwargs


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    import inspect
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class KilnSystem:
    name: str = "kiln"
    kinds: frozenset[str] = frozenset({"gemm", "conv", "network", "torch"})
    strategies: tuple[str, ...] = field(default_factory=lambda: compiler_strategies())
    _exes: list[Any] = field(default_factory=list, repr=False)

    def available(self) -> tuple[bool, str]:
        try:
            import kiln
        except ImportError as exc:
            return False, f"cannot import kiln: {exc}"
        if not callable(getattr(kiln, "compile", None)):
            return False, "kiln.compile does not exist yet"
        return True, ""

    def version(self) -> str:
        import kiln
        version = getattr(kiln, "__version__", None)
        if version is None:
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as dist_version
            try:
                version = dist_version("kiln")
            except PackageNotFoundError:
                version = "dev"
        return str(version)

    def prepare(self, workload: Workload, threads: int,
                strategy: str = "direct") -> Callable[[], list[np.ndarray]]:
        import kiln
        if strategy == TORCH_COMPILE:
            return self._torch_compile(workload, threads)
        kwargs = compile_kwargs(strategy, threads)
        if _accepts(kiln.compile, "cache"):
            kwargs["cache"] = False  # compile time means compiling, not loading a cached result
        if _accepts(kiln.compile, "tuning"):
            kwargs.setdefault("tuning", "off")  # only the "tuned" column applies the tuning database
        if workload.build_torch is not None:
            module, xs = workload.build_torch()
            exe = kiln.from_torch(module.eval(), xs, **kwargs)
            feeds = dict(zip([s.name for s in exe.inputs], workload.inputs.values()))
        else:
            exe = kiln.compile(workload.build_model(), **kwargs)
            feeds = workload.inputs
        self._exes = [exe]  # keep it alive as long as the callable may run
        return lambda: exe.run(feeds)

    def _torch_compile(self, workload: Workload, threads: int) -> Callable[[], list[np.ndarray]]:
        import torch

        from .peers.torch import module_and_inputs, outputs_to_numpy, set_threads

        set_threads(threads)  # ATen's pool, for any op left to eager PyTorch
        module, xs = module_and_inputs(workload)
        compiled = torch.compile(module, backend="kiln", options={"threads": threads, "cache": False})
        with torch.no_grad():
            compiled(*xs)  # dynamo, AOTAutograd and Kiln compile here
        self._exes = [compiled]

        def run() -> list[np.ndarray]:
            with torch.no_grad():
                return outputs_to_numpy(compiled(*xs))
        return run

    # ---- `kiln bench --precision`: the contracts of kiln.quantize and compile(precision=) --------------------
    precisions: tuple[str, ...] = ("fp32", "int8", "bf16")

    def precision_available(self, precision: str) -> tuple[bool, str]:
        """int8 needs `kiln.quantize(model, calibration_feeds) -> ModelProto` (QDQ), bf16 `kiln.compile(model,
        precision="bf16")`: until a build has them, the row says so."""
        ok, why = self.available()
        if not ok or precision == "fp32":
            return ok, why
        import kiln
        if precision == "int8" and not callable(getattr(kiln, "quantize", None)):
            return False, "not available in this build (kiln.quantize does not exist)"
        if precision == "bf16" and not _accepts(kiln.compile, "precision"):
            return False, "not available in this build (kiln.compile has no precision= keyword)"
        if precision not in self.precisions:
            return False, f"kiln has no {precision} path"
        return True, ""

    def prepare_precision(self, workload: Workload, threads: int, strategy: str, precision: str,
                          calibration: list[dict[str, np.ndarray]]) -> Callable[[dict[str, np.ndarray]], list]:
        import kiln
        kwargs = compile_kwargs(strategy, threads)
        if _accepts(kiln.compile, "cache"):
            kwargs["cache"] = False
        model = workload.build_model()
        if precision == "int8":
            model = kiln.quantize(model, calibration)
        elif precision == "bf16":
            kwargs["precision"] = "bf16"
        exe = kiln.compile(model, **kwargs)
        self._exes.append(exe)
        return exe.run
