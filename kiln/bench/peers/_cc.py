"""Building a peer's C code with the system C compiler at bench time: once per process, in a temp dir.

Used by the naive-c peer (its triple loop), the exo peer (Exo's generated kernels and their driver) and the blis
peer (its OpenMP column-slab driver). Nothing generated is kept in the repository."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_built: dict[str, ctypes.CDLL] = {}


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compiler_version() -> str:
    cc = compiler()
    if cc is None:
        return ""
    r = subprocess.run([cc, "--version"], capture_output=True, text=True)
    return (r.stdout.splitlines() or [""])[0]


def build(name: str, sources: dict[str, str], flags: tuple[str, ...]) -> ctypes.CDLL:
    """Compile `sources` (file name → text; the .c files are compiled, the rest are headers beside them) into
    one shared library with `flags`, load it with ctypes; cached per process by the text and the flags.
    OSError with the compiler's message when it fails."""
    cc = compiler()
    if cc is None:
        raise OSError("no C compiler (cc) on PATH")
    key = hashlib.sha1("\0".join([cc, *flags, *(f"{k}\0{v}" for k, v in sorted(sources.items()))]).encode())
    key_s = key.hexdigest()[:16]
    if key_s not in _built:
        d = Path(tempfile.mkdtemp(prefix=f"kiln-{name}-"))
        for fname, text in sources.items():
            (d / fname).write_text(text)
        so = d / f"{name}_{key_s}.so"
        cfiles = [str(d / f) for f in sources if f.endswith(".c")]
        r = subprocess.run([cc, *flags, "-shared", "-fPIC", "-I", str(d), *cfiles, "-o", str(so)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise OSError(f"{cc} failed building {name}: {r.stderr.strip()[:2000]}")
        _built[key_s] = ctypes.CDLL(str(so))
    return _built[key_s]
