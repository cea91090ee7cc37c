"""The speaker encoder of the Base (voice clone) models: 24 kHz audio -> x-vector.

An ECAPA-TDNN over a 128-band log-mel spectrogram (Slaney mel scale, Hann window, n_fft 1024,
hop 256, fmax 12 kHz). The x-vector has the talker's width and stands in for the speaker
id of CustomVoice in the prompt. Parameter names follow the checkpoint's `speaker_encoder.`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000


@dataclass(frozen=True, slots=True)
class SpeakerEncoderConfig:
    enc_dim: int = 1024
    mel_dim: int = 128
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpeakerEncoderConfig:
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        for name in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            if name in known:
                known[name] = tuple(known[name])
        return cls(**known)


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_step = np.log(6.4) / 27.0
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / log_step, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(log_step * (m - 15.0)), m * (200.0 / 3))


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Triangular Slaney-normalised mel filters, (n_mels, n_fft // 2 + 1), float32."""
    fft_freqs = np.linspace(0, sample_rate / 2, 1 + n_fft // 2)
    mel_freqs = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    widths = np.diff(mel_freqs)
    ramps = mel_freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_freqs[2 : n_mels + 2] - mel_freqs[:n_mels]))[:, None]
    return weights.astype(np.float32)


def log_mel(
    wav: torch.Tensor, n_fft: int = 1024, hop: int = 256, n_mels: int = 128, fmax: float = 12000
) -> torch.Tensor:
    """(B, samples) at 24 kHz -> (B, frames, n_mels) log-mel, reflect-padded, not centred."""
    basis = torch.from_numpy(mel_filterbank(SAMPLE_RATE, n_fft, n_mels, 0.0, fmax)).to(wav.device)
    pad = (n_fft - hop) // 2
    padded = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(n_fft, device=wav.device)
    spec = torch.stft(padded, n_fft, hop_length=hop, win_length=n_fft, window=window, center=False,
                      normalized=False, onesided=True, return_complex=True)  # fmt: skip
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, magnitude), min=1e-5)).transpose(1, 2)


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNN(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel, dilation) for _ in range(scale - 1))
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outputs = [parts[0]]
        previous: torch.Tensor | None = None
        for block, part in zip(self.blocks, parts[1:], strict=True):
            previous = block(part if previous is None else part + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, squeeze)
        self.conv2 = _conv(squeeze, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, squeeze: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNN(c_in, c_out, 1, 1)
        self.res2net_block = Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = TDNN(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcite(c_out, squeeze)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class AttentivePooling(nn.Module):
    """Attention-weighted mean and standard deviation over time, with global context."""

    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention, 1, 1)
        self.conv = _conv(attention, channels)

    @staticmethod
    def _stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        uniform = torch.full_like(x[:, :1], 1.0 / t)
        mean, std = self._stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        weights = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, weights)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: SpeakerEncoderConfig) -> None:
        super().__init__()
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNN(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentivePooling(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """(B, frames, mel_dim) -> (B, enc_dim)."""
        x = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, wav: torch.Tensor) -> torch.Tensor:
        """(samples,) float audio at 24 kHz -> (enc_dim,) x-vector."""
        p = self.fc.weight
        mels = log_mel(wav.float().reshape(1, -1).to(p.device))
        return self.forward(mels.to(p.dtype))[0]
