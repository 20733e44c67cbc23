"""Peer adapters for `kiln bench`: the systems kiln is measured against, one module each.

Importing this package is cheap and never fails: every heavy import (torch, jax, tvm, openvino...)
happens inside a peer's `available()`/`prepare()`. `PEERS` maps the report's `system` key to the
adapter class; `get_peers(names)` instantiates them (all when `names` is empty/None).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kiln.bench.peers.base import Peer, PeerError, Runner
from kiln.bench.peers.blis import BlisPeer
from kiln.bench.peers.exo import ExoPeer
from kiln.bench.peers.halide import HalidePeer
from kiln.bench.peers.inductor import InductorPeer
from kiln.bench.peers.iree import IreePeer
from kiln.bench.peers.jax import JaxPeer
from kiln.bench.peers.mkl import MklPeer
from kiln.bench.peers.naive_c import NaiveCPeer
from kiln.bench.peers.onednn import OneDnnPeer
from kiln.bench.peers.onnxruntime import OnnxRuntimePeer
from kiln.bench.peers.openblas import OpenBlasPeer
from kiln.bench.peers.openvino import OpenVinoPeer
from kiln.bench.peers.torch import TorchPeer
from kiln.bench.peers.tvm import TvmPeer
from kiln.bench.peers.xnnpack import XnnpackPeer

PEERS: dict[str, type[Peer]] = {
    p.name: p
    for p in (OnnxRuntimePeer, TorchPeer, InductorPeer, JaxPeer, TvmPeer, IreePeer, OpenVinoPeer,
              OpenBlasPeer, MklPeer, OneDnnPeer, BlisPeer, ExoPeer, XnnpackPeer, HalidePeer,
              NaiveCPeer)
}

# Systems of the investigation's tool list that `kiln bench` cannot run here, each with the reason: shown by
# `kiln bench --list`, in every report, and as the error when one is asked for by name.
NOT_RUN: dict[str, str] = {
    "taco": "no installable package of TACO (the tensor algebra compiler is built from source; PyPI's 'taco*' "
            "names are other projects, and tensora re-implements only TACO's sparse-format code generation, which "
            "for dense operands is an unscheduled loop nest: the naive-c row)",
    "glow": "no installable package (PyTorch's Glow builds only from source against its own LLVM; PyPI's 'glow' "
            "is an unrelated project)",
    "onnx-mlir": "ONNX Runtime has no MLIR optimizer in its CPU wheels; the ONNX project's MLIR compiler "
                 "(onnx-mlir) ships no pip or Debian package (source builds against a pinned LLVM, or Docker)",
    "cudnn": "GPU-only (NVIDIA CUDA); this host has no GPU and the investigation measures CPUs",
    "cublas": "GPU-only (NVIDIA CUDA); this host has no GPU and the investigation measures CPUs",
    "tensorrt": "GPU-only (NVIDIA CUDA); this host has no GPU and the investigation measures CPUs",
}


def get_peers(names: Iterable[str] | None = None,
              options: dict[str, dict[str, Any]] | None = None) -> list[Peer]:
    """Instantiate peers by report name, in the given order; `options[name]` goes to its constructor
    (e.g. {"tvm": {"trials": 200}}). Unknown names raise KeyError listing the known ones."""
    options = options or {}
    chosen = list(names) if names else list(PEERS)
    unknown = [n for n in chosen if n not in PEERS]
    not_run = [f"{n}: {NOT_RUN[n]}" for n in chosen if n in NOT_RUN]
    if not_run:
        raise KeyError("not run by kiln bench: " + "; ".join(not_run))
    if unknown:
        raise KeyError(f"unknown peer(s) {unknown}; known: {sorted(PEERS)}")
    return [PEERS[n](**options.get(n, {})) for n in chosen]


__all__ = ["NOT_RUN", "PEERS", "Peer", "PeerError", "Runner", "get_peers"]
