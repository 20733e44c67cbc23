"""Finding the systems to measure by name: kiln itself, the peer adapters, or `module:attr`.

A system is anything with the Peer interface: `name`, `kinds`, `strategies`, `available()`,
`version()`, `prepare(workload, threads, strategy) -> zero-arg callable returning the outputs`.
"""
from __future__ import annotations

import importlib
from typing import Any


def peer_systems() -> list[Any]:
    """Every peer adapter of kiln.bench.peers; [] while that package has none."""
    try:
        from . import peers
    except ImportError:
        return []
    found = getattr(peers, "PEERS", None) or []
    found = list(found.values()) if isinstance(found, dict) else list(found)
    return [p() if isinstance(p, type) else p for p in found]


def not_run_systems() -> dict[str, str]:
    """Systems of the tool list the bench cannot run here → why (kiln.bench.peers.NOT_RUN)."""
    try:
        from .peers import NOT_RUN
    except ImportError:
        return {}
    return dict(NOT_RUN)


def approach(system: Any, strategy: str = "default") -> str:
    """How a system builds its kernels, for the report's strategy section: Kiln's strategies by name, a peer by
    its `approach` attribute ('' when it does not say)."""
    if system == "kiln" or getattr(system, "name", None) == "kiln":
        return KILN_APPROACH.get(strategy.split(":")[0].split("@")[0], "")
    return str(getattr(system, "approach", ""))


KILN_APPROACH = {"direct": "direct emission", "default": "direct emission", "ukernel": "hand-written microkernels",
                 "library": "vendor libraries", "auto": "per-operator choice"}


def resolve(name: str) -> Any:
    """One system by name. `pkg.module:attr` imports attr (a class is instantiated) - for tests and
    for systems that live outside the project."""
    if ":" in name:
        module, attr = name.split(":", 1)
        obj = getattr(importlib.import_module(module), attr)
        return obj() if isinstance(obj, type) else obj
    if name == "kiln":
        from .kiln_system import KilnSystem
        return KilnSystem()
    for peer in peer_systems():
        if peer.name == name:
            return peer
    not_run = not_run_systems()
    if name in not_run:
        raise KeyError(f"{name} is not run by kiln bench: {not_run[name]}")
    known = ", ".join(["kiln", *(p.name for p in peer_systems())])
    raise KeyError(f"unknown system {name!r}; known: {known}")


def default_systems() -> list[Any]:
    from .kiln_system import KilnSystem
    return [KilnSystem(), *peer_systems()]


def select(spec: str | None) -> list[Any]:
    """`--systems a,b,c` (None or 'all' = kiln and every peer)."""
    if spec is None or spec.strip() in ("", "all"):
        return default_systems()
    return [resolve(s.strip()) for s in spec.split(",") if s.strip()]
