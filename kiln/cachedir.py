"""Kiln's cache directory: compiled modules, strategy decisions, the tuning database — and how files in it (and
the executables Kiln saves) are written: under a temporary name, renamed over the target when complete."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import threading
from collections.abc import Iterator


def cache_dir() -> str:
    """$KILN_CACHE_DIR, else ~/.cache/kiln (created if absent)."""
    d = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    os.makedirs(d, exist_ok=True)
    return d


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside `path` to write the file to; renamed over `path` when the block ends normally, removed
    when it raises. A concurrent reader — another process taking the cache entry, an executable that mapped the old
    file's weights — sees the old file or the whole new one, never a truncated one."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of the compiler's own source: a changed Kiln never serves code an older Kiln compiled."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for sub in ("frontend", "graph", "kernel", "schedule", "codegen", "runtime", "ukernels", "library", "tune", ""):
        d = os.path.join(root, sub)
        for dirpath, _, files in sorted(os.walk(d)) if sub else [(root, None, sorted(os.listdir(root)))]:
            for f in sorted(files):
                if f.endswith(".py"):
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        h.update(f.encode() + fh.read())
    return h.hexdigest()[:16]
