"""Audio encoding for the wire: PCM16, streamable WAV, G.711 mu-law, resampling.

Pure functions plus two small stateful helpers (`Resampler`, `StreamEncoder`) that carry
filter state across chunks, so a stream encoded chunk by chunk equals the one-shot result.
"""

from __future__ import annotations

import struct
from typing import Literal

import numpy as np
import soxr

from voxgate.types import UnsupportedFormat, UnsupportedSampleRate

AudioFormat = Literal["pcm", "wav", "mulaw"]
FORMATS: tuple[str, ...] = ("pcm", "wav", "mulaw")
COMPRESSED: tuple[str, ...] = ("mp3", "opus", "aac", "flac")  # HTTP only: `audio_encode.CompressedEncoder`
OPUS_RATES: tuple[int, ...] = (8000, 12000, 16000, 24000, 48000)  # what libopus takes
SAMPLE_RATES: tuple[int, ...] = (8000, 16000, 22050, 24000, 44100, 48000)
MULAW_RATE = 8000

_STREAMING_SIZE = 0xFFFFFFFF  # RIFF/data size for a WAV of unknown length (as ffmpeg pipes it)
_MULAW_BIAS = 0x84
_MULAW_CLIP14 = 8159
_MULAW_SEG_END = np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF], dtype=np.int32)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] to int16, clipping out-of-range values."""
    scaled = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0
    return np.round(scaled).astype(np.int16)


def pcm16_bytes(samples: np.ndarray) -> bytes:
    """Float samples to little-endian signed 16-bit PCM bytes."""
    return to_pcm16(samples).astype("<i2").tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    """Little-endian signed 16-bit PCM bytes back to float32 samples."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0


def mulaw_encode(pcm: np.ndarray) -> np.ndarray:
    """G.711 mu-law encode int16 samples to uint8 codes (the ITU/Sun reference rounding)."""
    x = np.asarray(pcm, dtype=np.int32) >> 2  # 14-bit magnitude, arithmetic shift as in g711.c
    mask = np.where(x < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(x), _MULAW_CLIP14) + (_MULAW_BIAS >> 2)
    segment = np.searchsorted(_MULAW_SEG_END, magnitude, side="left")
    code = (np.minimum(segment, 7) << 4) | ((magnitude >> (np.minimum(segment, 7) + 1)) & 0x0F)
    code = np.where(segment >= 8, 0x7F, code)
    return ((code ^ mask) & 0xFF).astype(np.uint8)


def mulaw_decode(codes: np.ndarray | bytes) -> np.ndarray:
    """G.711 mu-law decode uint8 codes to int16 samples."""
    u = ~np.frombuffer(bytes(codes), dtype=np.uint8).astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + _MULAW_BIAS) << exponent) - _MULAW_BIAS
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def wav_header(sample_rate: int, num_samples: int | None = None, *, mulaw: bool = False) -> bytes:
    """A 44-byte mono WAV header; `num_samples=None` marks a stream of unknown length."""
    sample_width = 1 if mulaw else 2
    fmt_tag = 7 if mulaw else 1  # 7 = WAVE_FORMAT_MULAW, 1 = PCM
    if num_samples is None:
        data_size = riff_size = _STREAMING_SIZE
    else:
        data_size = num_samples * sample_width
        riff_size = 36 + data_size
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", riff_size, b"WAVE", b"fmt ", 16, fmt_tag, 1,
        sample_rate, sample_rate * sample_width, sample_width, 8 * sample_width,
        b"data", data_size,
    )  # fmt: skip


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A complete PCM16 WAV file with exact sizes."""
    return wav_header(sample_rate, len(samples)) + pcm16_bytes(samples)


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """A PCM16 WAV file (mono, or stereo mixed down) -> (float32 samples, sample rate)."""
    import io
    import wave

    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise UnsupportedFormat(f"not a readable WAV file: {exc}") from None
    if width != 2 or channels not in (1, 2):
        raise UnsupportedFormat(f"WAV must be 16-bit mono or stereo, got {8 * width}-bit with {channels} channels")
    samples = np.frombuffer(frames[: len(frames) // (2 * channels) * 2 * channels], dtype="<i2").astype(np.float32)
    samples = samples.reshape(-1, channels).mean(axis=1) / 32767.0
    return samples.astype(np.float32), rate


def check_output(fmt: str, sample_rate: int | None, native_rate: int, formats: tuple[str, ...] = FORMATS) -> int:
    """Validate a requested format (one of `formats`) and rate; return the output sample rate."""
    if fmt not in formats:
        raise UnsupportedFormat(f"format {fmt!r} is not supported here; use one of {', '.join(formats)}")
    if fmt == "opus":
        return _opus_rate(sample_rate, native_rate)
    if fmt == "mulaw":
        if sample_rate not in (None, MULAW_RATE):
            raise UnsupportedSampleRate(f"mulaw is 8000 Hz only, got sample_rate={sample_rate}")
        return MULAW_RATE
    if sample_rate is None:
        return native_rate
    if sample_rate not in SAMPLE_RATES and sample_rate != native_rate:
        rates = ", ".join(str(r) for r in SAMPLE_RATES)
        raise UnsupportedSampleRate(f"sample_rate {sample_rate} is not supported; use one of {rates}")
    return sample_rate


def _opus_rate(sample_rate: int | None, native_rate: int) -> int:
    """The rate Opus is encoded at: the one asked for, which must be one libopus takes; when
    none was asked for, the engine's rate raised to the next one libopus takes (Piper's 22050
    Hz to 24000), so that the default request works and no band of the voice is lost."""
    if sample_rate is None:
        return next((rate for rate in OPUS_RATES if rate >= native_rate), OPUS_RATES[-1])
    if sample_rate not in OPUS_RATES:
        rates = ", ".join(str(r) for r in OPUS_RATES)
        raise UnsupportedSampleRate(f"opus takes sample_rate {rates}, not {sample_rate}")
    return sample_rate


class Resampler:
    """Streaming resampler (libsoxr, high quality); a pass-through when rates match."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = (
            None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
        )

    @property
    def passthrough(self) -> bool:
        """The rates match: samples go through untouched."""
        return self._stream is None

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next chunk; `last=True` also drains the filter."""
        x = np.ascontiguousarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x, last=last)

    def flush(self) -> np.ndarray:
        """The samples still held in the filter, at the end of a stream."""
        return self.process(np.zeros(0, dtype=np.float32), last=True)


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole signal."""
    r = Resampler(in_rate, out_rate)
    head = r.process(samples)
    return np.concatenate([head, r.flush()])


class StreamEncoder:
    """Turns float chunks at the engine rate into wire bytes of one format and rate.

    The WAV header (unknown length) is prepended to the first non-empty output, so the
    first bytes a client sees always include audio.
    """

    def __init__(self, fmt: AudioFormat, in_rate: int, out_rate: int) -> None:
        self.fmt = fmt
        self.out_rate = out_rate
        self.bytes_per_sample = 1 if fmt == "mulaw" else 2
        self._resampler = Resampler(in_rate, out_rate)
        self._header_pending = fmt == "wav"
        self.samples_out = 0

    @property
    def media_type(self) -> str:
        return {"pcm": "audio/pcm", "wav": "audio/wav", "mulaw": "audio/basic"}[self.fmt]

    def encode(self, samples: np.ndarray, pcm16: np.ndarray | None = None) -> bytes:
        """Wire bytes for the next chunk of float samples at the input rate. `pcm16`: the same
        samples as 16-bit PCM, when the engine made them: PCM and WAV at the engine's rate send
        them as they are (the same bytes, no conversion here)."""
        if pcm16 is not None and self.fmt != "mulaw" and self._resampler.passthrough:
            self.samples_out += len(pcm16)
            return self._framed(pcm16.astype("<i2", copy=False).tobytes(), final=False)
        return self._emit(self._resampler.process(samples))

    def flush(self) -> bytes:
        """The last bytes of the stream (what the resampler still held)."""
        return self._emit(self._resampler.flush(), final=True)

    def close(self) -> None:
        """Nothing to free (a compressed encoder frees its codec here)."""

    def _emit(self, out: np.ndarray, final: bool = False) -> bytes:
        self.samples_out += len(out)
        if self.fmt == "mulaw":
            data = mulaw_encode(to_pcm16(out)).tobytes()
        else:
            data = pcm16_bytes(out)
        return self._framed(data, final)

    def _framed(self, data: bytes, final: bool) -> bytes:
        """`data` with the WAV header before the first audio (or the end, when there was none)."""
        if self._header_pending and (data or final):
            self._header_pending = False
            data = wav_header(self.out_rate) + data
        return data


def split_bytes(data: bytes, piece: int) -> list[bytes]:
    """Cut `data` into pieces of at most `piece` bytes (the last may be shorter)."""
    if piece <= 0 or len(data) <= piece:
        return [data] if data else []
    return [data[i : i + piece] for i in range(0, len(data), piece)]
