"""The real-architecture corpus (kiln/corpus: BERT, Llama, GPT-2, ViT, Swin, ConvNeXt, MobileViT, a TF-padded
MobileNetV2, wav2vec2, Whisper — written in torch.nn as their reference implementations are) exported by both
torch.onnx exporters (TorchScript at opset 17, dynamo at opset 18), compiled by Kiln and compared with onnxruntime.

Exports happen at test time, once per session, into the Kiln cache's corpus/ folder (a temporary directory in CI),
keyed by a hash of the corpus source, the exporter and the torch/onnxscript versions.
Tolerance: max|kiln − ort| ≤ 1e-5 · max|ort| per output (float32 end to end; measured ≤ 7e-7)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from conftest import assert_close, emit_only, run_ort, width_runs

torch = pytest.importorskip("torch")
corpus = pytest.importorskip("kiln.corpus")

RTOL = 1e-5
# CI's default run (a budget of ≈ 90 s with the exports): one family per kind of graph the exporters produce —
# rotary/GQA/causal mask (llama, dynamo), shifted windows (swin, TorchScript), 1-D convs (whisper, dynamo),
# explicit Pads (mobilenet_tf, TorchScript); every family × exporter with --runslow
DEFAULT = {("llama", "dynamo"), ("swin", "torchscript"), ("whisper", "dynamo"), ("mobilenet_tf", "torchscript")}
# compiled for every x86 width in the default run (Pow(x, 3) per width); the others with --runslow
EVERY_WIDTH = ("gpt2",)


def cases() -> list:
    return [pytest.param(n, e, marks=() if (n, e) in DEFAULT else pytest.mark.slow, id=f"{n}-{e}")
            for n in corpus.names() for e in corpus.EXPORTERS]


@pytest.fixture(scope="session")
def exported() -> dict[tuple[str, str], str]:
    return {}


def export(cache: dict[tuple[str, str], str], name: str, exporter: str) -> str:
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript (pip install onnxscript)")
    if (name, exporter) not in cache:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cache[name, exporter] = corpus.export(name, exporter)
    return cache[name, exporter]


def compare(path: str, name: str, **compile_kw: object) -> None:
    import onnx

    model, feeds = onnx.load(path), corpus.feeds(name)
    want = run_ort(model, feeds)
    got = kiln.compile(model, num_threads=2, cache=False, **compile_kw).run(feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, RTOL, f"{name} output {i}")


@pytest.mark.parametrize(("name", "exporter"), cases())
def test_corpus_matches_onnxruntime(name: str, exporter: str, exported: dict) -> None:
    compare(export(exported, name, exporter), name)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in EVERY_WIDTH else pytest.mark.slow)
                                  for n in corpus.names()])
def test_corpus_every_width(name: str, width: str, exported: dict) -> None:
    path = export(exported, name, "torchscript")
    if not width_runs(width):
        import onnx
        emit_only(onnx.load(path), width)
        return
    compare(path, name, target=width)


@pytest.mark.parametrize(("name", "exporter"), cases())
def test_onnxruntime_matches_eager_pytorch(name: str, exporter: str, exported: dict) -> None:
    """The exported graphs compute what the torch modules compute (so the corpus tests what it claims to)."""
    import onnx

    path = export(exported, name, exporter)
    for g, w in zip(run_ort(onnx.load(path), corpus.feeds(name)), corpus.reference(name)):
        assert np.abs(g - w).max() <= 1e-4 * max(np.abs(w).max(), 1e-6), f"{name} {exporter}"
