"""kiln.corpus: real architectures written in torch.nn the way their reference implementations write them
(small configs: hidden 128, 2 layers, 24 positions, seeded random weights), exported to ONNX by both of
`torch.onnx`'s exporters — TorchScript at opset 17 and dynamo at opset 18 — to test and measure Kiln on the graphs
real exporters produce (the zoo's models are written in ONNX directly).

    >>> path = export("llama", "dynamo")    # an .onnx file, exported once and cached by content hash
    >>> feeds("llama")                      # {input name: numpy array}

Needs torch (the local CPU wheel, `pip install torch==2.13.0`) and, for the dynamo exporter, onnxscript."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kiln.cachedir import atomic_path

FAMILIES_DOC = {
    "bert": "text encoder: BERT-style post-LN, learned positions, token types, padding mask, erf GELU, tanh pooler",
    "llama": "decoder-only LM: RMSNorm, rotary embeddings, grouped-query attention (repeat_kv), causal mask, SwiGLU",
    "gpt2": "decoder-only LM: GPT-2 Conv1D (addmm), causal mask buffer + where, tanh GELU with x³, tied head",
    "vit": "vision transformer: patch conv, class token, pre-LN blocks",
    "swin": "windowed vision transformer: window partition, shifted windows (roll + mask), relative position bias",
    "convnext": "ConvNeXt: depthwise 7×7, channels-last LayerNorm + GELU, layer scale, channels-first LayerNorm",
    "mobilevit": "hybrid conv/attention: MobileNetV2 blocks (SiLU), unfold into patches → transformer → fold",
    "mobilenet_tf": "MobileNetV2 with TensorFlow SAME padding: an explicit Pad before every conv, 1×1 included",
    "wav2vec2": "speech encoder: 1-D conv feature extractor with GroupNorm + GELU, grouped positional conv, post-LN",
    "whisper": "speech encoder: two 1-D convs + GELU over log-mel frames, sinusoidal positions, pre-LN",
}
EXPORTERS = {"torchscript": 17, "dynamo": 18}  # exporter → opset


@dataclass(frozen=True)
class Family:
    module: Callable[[], object]           # builds the torch.nn.Module (called under a fixed seed)
    inputs: Callable[[], tuple]            # example inputs (torch tensors)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def _families() -> dict[str, Family]:
    from kiln.corpus import speech, text, vision

    def with_norms(cls: Callable[[], object]) -> Callable[[], object]:
        def build() -> object:
            m = cls()
            vision.init_norms(m)
            return m
        return build

    return {
        "bert": Family(text.BertEncoder, text.bert_inputs, ("input_ids", "token_type_ids", "attention_mask"),
                       ("last_hidden_state", "pooler_output")),
        "llama": Family(text.LlamaDecoder, text.ids_input, ("input_ids",), ("logits",)),
        "gpt2": Family(text.GPT2Decoder, text.ids_input, ("input_ids",), ("logits",)),
        "vit": Family(vision.ViT, vision.image_input, ("pixel_values",), ("logits",)),
        "swin": Family(vision.Swin, vision.image_input, ("pixel_values",), ("logits",)),
        "convnext": Family(vision.ConvNeXt, vision.image_input, ("pixel_values",), ("logits",)),
        "mobilevit": Family(with_norms(vision.MobileViT), vision.image_input, ("pixel_values",), ("logits",)),
        "mobilenet_tf": Family(with_norms(vision.MobileNetTF), vision.image_input, ("pixel_values",), ("logits",)),
        "wav2vec2": Family(with_norms(speech.Wav2Vec2Encoder), speech.audio_input, ("input_values",),
                           ("last_hidden_state",)),
        "whisper": Family(speech.WhisperEncoder, speech.mel_input, ("input_features",), ("last_hidden_state",)),
    }


def names() -> list[str]:
    return list(FAMILIES_DOC)


def family(name: str) -> Family:
    fams = _families()
    if name not in fams:
        raise KeyError(f"unknown corpus family {name!r}; valid: {', '.join(fams)}")
    return fams[name]


def module(name: str):  # noqa: ANN201 - a torch.nn.Module in eval mode with seeded random weights
    import torch

    torch.manual_seed(0)
    m = family(name).module()
    return m.eval()


def feeds(name: str) -> dict[str, np.ndarray]:
    f = family(name)
    return {n: t.numpy() for n, t in zip(f.input_names, f.inputs())}


def content_key(name: str, exporter: str) -> str:
    """What an exported file depends on: this package's source, the family, the exporter and its versions."""
    import torch

    h = hashlib.sha256()
    d = os.path.dirname(os.path.abspath(__file__))
    for f in sorted(os.listdir(d)):
        if f.endswith(".py"):
            with open(os.path.join(d, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    versions = [torch.__version__]
    if exporter == "dynamo":
        import onnxscript
        versions.append(onnxscript.__version__)
    h.update(repr((name, exporter, EXPORTERS[exporter], versions)).encode())
    return h.hexdigest()[:20]


def export(name: str, exporter: str, directory: str | None = None) -> str:
    """Export family `name` with `exporter` ("torchscript" | "dynamo") into `directory` (default: the Kiln cache's
    corpus/ folder) unless a file with the same content key is already there; returns the .onnx path."""
    if exporter not in EXPORTERS:
        raise KeyError(f"unknown exporter {exporter!r}; valid: {', '.join(EXPORTERS)}")
    if directory is None:
        from kiln.compiler import cache_dir
        directory = os.path.join(cache_dir(), "corpus")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}-{exporter}-{content_key(name, exporter)}.onnx")
    if os.path.exists(path):
        return path
    import torch

    f, m = family(name), module(name)
    with torch.no_grad(), atomic_path(path) as tmp:
        if exporter == "torchscript":
            torch.onnx.export(m, f.inputs(), tmp, dynamo=False, opset_version=EXPORTERS[exporter],
                              input_names=list(f.input_names), output_names=list(f.output_names))
        else:
            prog = torch.onnx.export(m, f.inputs(), dynamo=True, opset_version=EXPORTERS[exporter],
                                     input_names=list(f.input_names), output_names=list(f.output_names))
            prog.save(tmp)
    return path


def reference(name: str) -> list[np.ndarray]:
    """Eager PyTorch's outputs on `feeds(name)`."""
    import torch

    f, m = family(name), module(name)
    with torch.no_grad():
        out = m(*f.inputs())
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]
