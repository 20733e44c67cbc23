"""Vendor libraries behind the `library` strategy (kiln/strategy.py): OpenBLAS, MKL, oneDNN and BLIS through ctypes.

Compiled code calls a library routine by name (a `Call` in the loop nest, kiln/schedule/library.py); the
object file leaves the symbol undefined and `kiln.meta["symbols"]` lists it. When an Executable is loaded,
`bind_symbols` dlopens the libraries those symbols belong to, sets their thread count and hands LLVM each
symbol's address (`llvmlite.binding.add_symbol`) before the object is linked, so the call is a direct call
from the compiled module: no Python in the path.

Each library is an optional install — `pip install kiln[library]`, or its own wheel (scipy-openblas32, mkl,
onednn); a missing one is a `LibraryUnavailable` error naming the wheel, at compile time and at load time.
Thread counts are process-wide library state: the most recently loaded executable's `num_threads` wins."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import ModuleType

import llvmlite.binding as llvm

from kiln.errors import KilnError
from kiln.library import blis, mkl, onednn, openblas
from kiln.strategy import LIBRARIES

MODULES: dict[str, ModuleType] = {m.NAME: m for m in (mkl, openblas, onednn, blis)}
SYMBOL_LIBRARY: dict[str, str] = {s: m.NAME for m in MODULES.values() for s in m.SYMBOLS}
assert set(MODULES) == set(LIBRARIES), "kiln.strategy.LIBRARIES and kiln.library.MODULES disagree"


class LibraryUnavailable(KilnError, RuntimeError):
    """A vendor library the `library` strategy needs is not installed or does not load."""


def _install_hint(name: str) -> str:
    return f"pip install 'kiln[library]' (or just the {MODULES[name].WHEEL} wheel: pip install {MODULES[name].WHEEL})"


def available(name: str) -> tuple[bool, str]:
    """(True, '') when library `name` loads in this process, else (False, why and what to install)."""
    if name not in MODULES:
        raise ValueError(f"unknown library {name!r}; known: {', '.join(LIBRARIES)}")
    try:
        MODULES[name].load()
    except OSError as e:
        return False, f"{name} is not available ({e}); {_install_hint(name)}"
    return True, ""


def require(name: str) -> ModuleType:
    """The module of library `name`, loaded; LibraryUnavailable saying what to install when it does not load."""
    ok, why = available(name)
    if not ok:
        raise LibraryUnavailable(why)
    return MODULES[name]


def default_library() -> str:
    """The library plain `strategy="library"` means: the first of kiln.strategy.LIBRARIES that loads."""
    reasons = []
    for name in LIBRARIES:
        ok, why = available(name)
        if ok:
            return name
        reasons.append(why)
    raise LibraryUnavailable("strategy 'library' needs one of " + ", ".join(LIBRARIES) + ", and none loads: "
                             + "; ".join(reasons))


def library_of(strategy: str) -> str:
    """'library' → the default library, 'library:<name>' → <name> (checked to load)."""
    kind, _, name = strategy.partition(":")
    if kind != "library":
        raise ValueError(f"not a library strategy: {strategy!r}")
    name = name or default_library()
    require(name)
    return name


@dataclass
class BoundLibraries:
    """What bind_symbols loaded: kept by the Executable so the libraries (and their addresses) stay alive."""
    libraries: dict[str, ctypes.CDLL] = field(default_factory=dict)
    addresses: dict[str, int] = field(default_factory=dict)
    num_threads: int = 1


def bind_symbols(symbols: list[str] | dict[str, object], num_threads: int) -> BoundLibraries:
    """Resolve every library symbol a compiled object references: load its library, set the library's thread
    count, and register the address with LLVM (used when the object is linked, which must come after this)."""
    from kiln.codegen.jit import init_llvm

    init_llvm()
    bound = BoundLibraries(num_threads=num_threads)
    for sym in symbols:
        name = SYMBOL_LIBRARY.get(sym)
        if name is None:
            raise KilnError(f"compiled code references library symbol {sym!r}, which no library in kiln.library "
                            f"provides (known: {', '.join(sorted(SYMBOL_LIBRARY))}); recompile it with this Kiln")
        mod = require(name)
        if name not in bound.libraries:
            bound.libraries[name] = mod.load()
            try:
                mod.set_threads(num_threads)
            except OSError as e:
                raise LibraryUnavailable(f"{name}: {e}") from e
        addr = int(ctypes.cast(getattr(bound.libraries[name], sym), ctypes.c_void_p).value or 0)
        if not addr:
            raise LibraryUnavailable(f"{name} loaded but exports no {sym}; {_install_hint(name)}")
        llvm.add_symbol(sym, addr)
        bound.addresses[sym] = addr
    return bound


def integer_gemm(name: str, a_dtype: str) -> str:
    """The symbol of library `name`'s GEMM for `a_dtype` activations × s8 weights → int32, or '' (none)."""
    return getattr(MODULES[name], "IGEMM", {}).get(a_dtype, "")
