"""Kiln's cache directory: compiled modules, strategy decisions, the tuning database."""
from __future__ import annotations

import os


def cache_dir() -> str:
    """$KILN_CACHE_DIR, else ~/.cache/kiln (created if absent)."""
    d = os.environ.get("KILN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "kiln")
    os.makedirs(d, exist_ok=True)
    return d
