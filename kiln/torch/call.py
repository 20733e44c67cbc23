"""Running a Kiln Executable on torch tensors without copies.

Inputs are passed to the compiled code by `data_ptr()` and outputs are allocated by torch and written in place
(`Executable.run_pointers`): a contiguous CPU tensor of the dtype the executable was compiled for goes in and out
as it is. Anything else is converted or refused, saying which input and why: a non-contiguous tensor is made
contiguous (one copy, counted in `kiln.torch.stats()["input_copies"]`); a tensor on another device, of another
dtype or shape is a ValueError (Kiln runs on this machine's CPU, for the dtype and shape it was compiled for)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kiln.runtime.executable import Executable, IOSpec

COPIES = {"inputs": 0}


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def as_input(x: Any, spec: IOSpec, i: int) -> torch.Tensor:
    """The tensor Kiln reads for input `i`: `x` itself when its layout allows, else a contiguous copy."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"kiln: input {i} ('{spec.name}') is a {type(x).__name__}, expected a torch.Tensor")
    if x.device.type != "cpu":
        raise ValueError(f"kiln: input {i} ('{spec.name}') is on {x.device}; Kiln compiled this model for this "
                         "machine's CPU: pass a CPU tensor (x.cpu())")
    want = torch_dtype(spec.dtype)
    if x.dtype != want:
        raise ValueError(f"kiln: input {i} ('{spec.name}') is {x.dtype}, the model was compiled for {want}")
    if x.dim() != len(spec.shape) or any(isinstance(d, int) and d != n for d, n in zip(spec.shape, x.shape)):
        raise ValueError(f"kiln: input {i} ('{spec.name}') has shape {list(x.shape)}, the model was compiled for "
                         f"{list(spec.shape)}")  # (symbolic dims, named: Executable.run checks their sizes)
    if x.requires_grad:
        x = x.detach()
    if x.is_conj() or x.is_neg():
        x = x.resolve_conj().resolve_neg()
    if not x.is_contiguous():
        COPIES["inputs"] += 1
        x = x.contiguous()
    return x


class KilnCall(torch.nn.Module):
    """An Executable as a torch module: tensors in, tensors out (one tensor, or a tuple when `tuple_out`)."""

    def __init__(self, exe: Executable, tuple_out: bool | None = None) -> None:
        super().__init__()
        self.exe = exe
        self.tuple_out = len(exe.outputs) != 1 if tuple_out is None else tuple_out
        self._out = [(spec.shape, torch_dtype(spec.dtype)) for spec in exe.outputs]
        self._specs = list(exe.inputs)

    def forward(self, *xs: Any) -> Any:
        xs = tuple(x for x in xs if not isinstance(x, (int, torch.SymInt)))  # sizes: bound from the tensors' shapes
        if len(xs) != len(self._specs):
            raise TypeError(f"kiln: {len(xs)} inputs for a model of {len(self._specs)} "
                            f"({', '.join(s.name for s in self._specs)})")
        ins = [as_input(x, s, i) for i, (x, s) in enumerate(zip(xs, self._specs))]
        if self.exe.dynamic:  # outputs sized by the run (symbols bound and checked there); NumPy's memory, shared
            res = [torch.from_numpy(o) for o in self.exe.run({s.name: t.numpy() for s, t in zip(self._specs, ins)})]
            return tuple(res) if self.tuple_out else res[0]
        outs = [torch.empty(shape, dtype=dtype) for shape, dtype in self._out]
        self.exe.run_pointers([t.data_ptr() for t in ins], [t.data_ptr() for t in outs])
        return tuple(outs) if self.tuple_out else outs[0]


def as_module(exe: Executable) -> KilnCall:
    """A compiled model (e.g. from `kiln.from_torch` or `kiln.load`) callable on torch tensors, zero-copy:
    `kiln.torch.as_module(exe)(x)` returns what `exe.run({...})` would, as tensors."""
    return KilnCall(exe)


def numpy_feeds(exe: Executable, xs: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """The feeds of `exe.run` for these tensors (views of their memory, no copy where the layout allows)."""
    return {s.name: as_input(x, s, i).numpy() for i, (x, s) in enumerate(zip(xs, exe.inputs))}
