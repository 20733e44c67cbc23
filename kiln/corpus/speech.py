"""Speech encoders in the style of their reference implementations: a wav2vec2-style encoder (1-D conv feature
extractor with GroupNorm + GELU, feature projection, grouped positional convolution, post-LN transformer) and a
Whisper-style encoder (two 1-D convs with GELU over log-mel frames, sinusoidal positions, pre-LN transformer)."""
from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN, LAYERS, HEADS = 128, 2, 4


class SelfAttention(nn.Module):
    """Separate q/k/v projections (Whisper's k_proj has no bias), heads split by view + transpose."""

    def __init__(self, dim: int, heads: int, k_bias: bool = True) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=k_bias)

    def shape(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, d = h.shape
        q, k, v = self.shape(self.q_proj(h) * self.scaling), self.shape(self.k_proj(h)), self.shape(self.v_proj(h))
        w = nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1)
        return self.out_proj(torch.matmul(w, v).transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.intermediate_dense, self.output_dense = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(nn.functional.gelu(self.intermediate_dense(x)))


# -- wav2vec2 --------------------------------------------------------------------------------------------------------
CONV_LAYERS = ((64, 10, 5), (64, 3, 2), (64, 3, 2), (64, 2, 2), (64, 2, 2))  # (channels, kernel, stride)
SAMPLES = 2000  # 24 frames after the feature extractor's ×80 striding


class FeatureExtractor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers, cin = [], 1
        for i, (c, k, s) in enumerate(CONV_LAYERS):
            layers.append(nn.Conv1d(cin, c, k, s, bias=False))
            if i == 0:
                layers.append(nn.GroupNorm(c, c, affine=True))
            layers.append(nn.GELU())
            cin = c
        self.conv_layers = nn.Sequential(*layers)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.conv_layers(audio[:, None])


class PositionalConvEmbedding(nn.Module):
    def __init__(self, dim: int, kernel: int = 16, groups: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=groups)
        self.remove = 1 if kernel % 2 == 0 else 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.conv(h.transpose(1, 2))
        if self.remove:
            x = x[:, :, : -self.remove]
        return nn.functional.gelu(x).transpose(1, 2)


class Wav2Vec2Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.layer_norm = SelfAttention(HIDDEN, HEADS), nn.LayerNorm(HIDDEN, eps=1e-5)
        self.feed_forward, self.final_layer_norm = FeedForward(HIDDEN, 4 * HIDDEN), nn.LayerNorm(HIDDEN, eps=1e-5)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.layer_norm(h + self.attention(h))
        return self.final_layer_norm(h + self.feed_forward(h))


class Wav2Vec2Encoder(nn.Module):
    """raw audio [1, samples] → hidden states [1, frames, 128]."""

    def __init__(self) -> None:
        super().__init__()
        self.feature_extractor = FeatureExtractor()
        self.fp_norm, self.fp_proj = nn.LayerNorm(CONV_LAYERS[-1][0], eps=1e-5), nn.Linear(CONV_LAYERS[-1][0], HIDDEN)
        self.pos_conv_embed = PositionalConvEmbedding(HIDDEN)
        self.layer_norm = nn.LayerNorm(HIDDEN, eps=1e-5)
        self.layers = nn.ModuleList(Wav2Vec2Layer() for _ in range(LAYERS))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        feats = self.feature_extractor(audio).transpose(1, 2)
        h = self.fp_proj(self.fp_norm(feats))
        h = self.layer_norm(h + self.pos_conv_embed(h))
        for layer in self.layers:
            h = layer(h)
        return h


def audio_input() -> tuple[torch.Tensor]:
    return (torch.randn(1, SAMPLES, generator=torch.Generator().manual_seed(4)),)


# -- Whisper encoder -------------------------------------------------------------------------------------------------
MELS, FRAMES = 80, 48  # 24 positions after conv2's stride 2


def sinusoids(length: int, channels: int, max_timescale: float = 10000) -> torch.Tensor:
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2))
    t = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class WhisperLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(HIDDEN), SelfAttention(HIDDEN, HEADS, k_bias=False)
        self.final_layer_norm = nn.LayerNorm(HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h))
        return h + self.fc2(nn.functional.gelu(self.fc1(self.final_layer_norm(h))))


class WhisperEncoder(nn.Module):
    """log-mel [1, 80, frames] → hidden states [1, frames / 2, 128]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(MELS, HIDDEN, 3, padding=1)
        self.conv2 = nn.Conv1d(HIDDEN, HIDDEN, 3, stride=2, padding=1)
        self.register_buffer("embed_positions", sinusoids(FRAMES // 2, HIDDEN), persistent=False)
        self.layers = nn.ModuleList(WhisperLayer() for _ in range(LAYERS))
        self.layer_norm = nn.LayerNorm(HIDDEN)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(mel)))).permute(0, 2, 1)
        h = h + self.embed_positions
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h)


def mel_input() -> tuple[torch.Tensor]:
    return (torch.randn(1, MELS, FRAMES, generator=torch.Generator().manual_seed(6)),)
