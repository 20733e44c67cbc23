"""Finding and loading the vendor libraries' shared objects (the pip wheels put them in the interpreter's lib
dir or in their own package directory, without RUNPATHs), shared by the per-library modules."""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path


def prefix_lib(*names: str) -> Path | None:
    """First of `names` in the interpreter's lib dir (where the mkl/onednn wheels put their .so files)."""
    for base in dict.fromkeys((sys.prefix, sys.base_prefix, os.path.join(sys.prefix, "local"))):
        for n in names:
            p = Path(base) / "lib" / n
            if p.exists():
                return p
    return None


def load_global(path: Path) -> ctypes.CDLL:
    """dlopen with RTLD_GLOBAL so later libraries find it by soname (the wheels set no RUNPATH)."""
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)

