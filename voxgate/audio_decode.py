"""Reference audio from untrusted bytes (`POST /v1/voices`): any common format, bounded memory.

Nothing a file says about itself is trusted for memory. A WAV header claiming 1 Hz once made
16 KB of upload cost 2.7 GB (resampled to 24 kHz before the length was checked), so the
sample rate (8-48 kHz), the channel count and the duration (0.5-30 s) are checked before a
sample is converted, and decoding stops as soon as the decoded length passes the bound.
Memory is then at most `max_seconds * max_rate` mono float32 samples (5.5 MiB by default)
plus one block or frame, whatever the file claims.

Plain PCM and float WAV (8/16/24/32-bit integer, 32/64-bit float) are read here with numpy,
block by block; every other format goes to FFmpeg (PyAV), with the container chosen from the
file's magic bytes so that FFmpeg never probes (a playlist or concat file cannot make it open
anything else). Channels are mixed to mono by their mean. Resampling is the engine's job,
after this validation.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

from voxgate.types import InvalidAudio

ACCEPTED = "WAV, FLAC, OGG (Vorbis/Opus), MP3, M4A/AAC, WebM or AIFF"
_STREAMING_SIZE = 0xFFFFFFFF  # a WAV data chunk of unknown length (written by pipes, and by voxgate)
_WAV_PCM, _WAV_FLOAT, _WAV_EXTENSIBLE = 1, 3, 0xFFFE
_BLOCK_FRAMES = 1 << 16  # WAV frames converted at a time: bounds the temporary arrays


@dataclass(frozen=True, slots=True)
class AudioBounds:
    """What an uploaded recording may be."""

    min_rate: int = 8000
    max_rate: int = 48000
    min_seconds: float = 0.5
    max_seconds: float = 30.0
    max_channels: int = 8

    def check_rate(self, rate: int) -> None:
        if not self.min_rate <= rate <= self.max_rate:
            raise InvalidAudio(f"the sample rate is {rate} Hz; it must be {self.min_rate}-{self.max_rate} Hz")

    def check_channels(self, channels: int) -> None:
        if not 1 <= channels <= self.max_channels:
            raise InvalidAudio(f"the audio has {channels} channels; 1-{self.max_channels} are accepted")

    def check_frames(self, frames: int, rate: int) -> None:
        seconds = frames / rate
        if not self.min_seconds <= seconds <= self.max_seconds:
            raise InvalidAudio(f"the audio lasts {seconds:.2f} s; it must last {self.span()}")

    def max_frames(self, rate: int) -> int:
        return int(self.max_seconds * rate)

    def span(self) -> str:
        return f"{self.min_seconds:g}-{self.max_seconds:g} s"


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    samples: np.ndarray  # float32 mono in [-1, 1]
    sample_rate: int
    container: str  # what it was read as: "wav", "flac", "ogg", "mp3", ...


def decode_audio(data: bytes, bounds: AudioBounds = AudioBounds()) -> DecodedAudio:
    """Decode an uploaded recording to mono float32, or raise `InvalidAudio` saying why."""
    container = sniff_container(data)
    if container is None:
        raise InvalidAudio(f"the audio is not a recognised file; send {ACCEPTED}")
    if container == "wav":
        layout = parse_wav(data, bounds)
        if layout.encoding in ("pcm", "float"):
            return DecodedAudio(_wav_samples(data, layout, bounds), layout.rate, "wav")
    return _decode_with_ffmpeg(data, container, bounds)


def sniff_container(data: bytes) -> str | None:
    """FFmpeg's demuxer name for the file's magic bytes; None for anything else."""
    head = data[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[4:8] == b"ftyp":
        return "mov"  # MP4 / M4A
    magic = {b"fLaC": "flac", b"OggS": "ogg", b"\x1a\x45\xdf\xa3": "matroska"}
    if head[:4] in magic:
        return magic[head[:4]]
    if head[:3] == b"ID3" and len(data) >= 10:  # an ID3v2 tag, then the audio
        size = 10 + (data[6] << 21 | data[7] << 14 | data[8] << 7 | data[9]) + (10 if data[5] & 0x10 else 0)
        after = sniff_container(data[size : size + 12]) if size < len(data) else None
        return after if after in ("flac", "aac") else "mp3"
    if len(head) >= 2 and head[0] == 0xFF:
        if head[1] & 0xF6 == 0xF0:
            return "aac"  # ADTS: sync word, layer 00
        if head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
            return "mp3"  # MPEG audio frame sync, layer I-III
    return None


# ---------------------------------------------------------------------- WAV


@dataclass(frozen=True, slots=True)
class WavLayout:
    encoding: str  # "pcm", "float", or "tag-<n>" (decoded by FFmpeg)
    channels: int
    rate: int
    bits: int
    data_offset: int
    data_size: int

    @property
    def block(self) -> int:
        return self.channels * self.bits // 8


def parse_wav(data: bytes, bounds: AudioBounds) -> WavLayout:
    """Walk a RIFF/WAVE file's chunks to its data; check rate, channels, sample format and
    the data size (against the bytes really present) before any sample is read."""
    pos, fmt = 12, None
    while pos + 8 <= len(data):
        chunk, size = struct.unpack_from("<4sI", data, pos)
        body = pos + 8
        if chunk == b"fmt ":
            fmt = _parse_fmt(data[body : body + min(size, 40)], bounds)
        elif chunk == b"data":
            if fmt is None:
                raise InvalidAudio("the WAV data chunk comes before its fmt chunk")
            present = len(data) - body
            if size == _STREAMING_SIZE:
                size = present
            elif size > present:
                raise InvalidAudio(f"the WAV data chunk declares {size} bytes but {present} follow (truncated?)")
            encoding, channels, rate, bits = fmt
            return WavLayout(encoding, channels, rate, bits, body, size)
        pos = body + size + (size & 1)
    raise InvalidAudio("the WAV file has no data chunk" if fmt else "the WAV file has no fmt chunk")


def _parse_fmt(raw: bytes, bounds: AudioBounds) -> tuple[str, int, int, int]:
    if len(raw) < 16:
        raise InvalidAudio("the WAV fmt chunk is too short")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", raw)
    if tag == _WAV_EXTENSIBLE and len(raw) >= 26:
        tag = struct.unpack_from("<H", raw, 24)[0]  # the sub-format GUID starts with the tag
    bounds.check_rate(rate)
    bounds.check_channels(channels)
    if tag == _WAV_PCM and bits in (8, 16, 24, 32):
        return "pcm", channels, rate, bits
    if tag == _WAV_FLOAT and bits in (32, 64):
        return "float", channels, rate, bits
    if tag in (_WAV_PCM, _WAV_FLOAT):
        kind = "PCM" if tag == _WAV_PCM else "float"
        raise InvalidAudio(f"{bits}-bit {kind} WAV is not supported; use 8/16/24/32-bit PCM or 32/64-bit float")
    return f"tag-{tag}", channels, rate, bits


def _wav_samples(data: bytes, layout: WavLayout, bounds: AudioBounds) -> np.ndarray:
    """The data chunk as mono float32, a block at a time (length checked first)."""
    frames = layout.data_size // layout.block
    bounds.check_frames(frames, layout.rate)
    out = np.empty(frames, dtype=np.float32)
    view = memoryview(data)
    for start in range(0, frames, _BLOCK_FRAMES):
        n = min(_BLOCK_FRAMES, frames - start)
        first = layout.data_offset + start * layout.block
        block = _pcm_to_float(view[first : first + n * layout.block], layout)
        out[start : start + n] = block.reshape(n, layout.channels).mean(axis=1)
    return _finite(out)


def _pcm_to_float(raw: memoryview, layout: WavLayout) -> np.ndarray:
    if layout.encoding == "float":
        return np.frombuffer(raw, dtype="<f4" if layout.bits == 32 else "<f8").astype(np.float32)
    if layout.bits == 8:  # unsigned
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if layout.bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        packed = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        return ((packed << 8) >> 8).astype(np.float32) / float(1 << 23)  # sign-extend from bit 23
    dtype = "<i2" if layout.bits == 16 else "<i4"
    return np.frombuffer(raw, dtype=dtype).astype(np.float32) / float(1 << (layout.bits - 1))


# ---------------------------------------------------------------------- FFmpeg


# Integer sample formats -> the scale to [-1, 1) (and the offset of the unsigned one).
_INT_SCALE = {"u8": (128.0, 128.0), "s16": (32768.0, 0.0), "s32": (2.0**31, 0.0), "s64": (2.0**63, 0.0)}


class _MonoCollector:
    """Decoded frames mixed to mono, refusing a rate change and anything past the length bound."""

    def __init__(self, bounds: AudioBounds) -> None:
        self.bounds = bounds
        self.rate = 0
        self.frames = 0
        self.parts: list[np.ndarray] = []

    def add(self, frame: object) -> None:
        rate, channels = frame.sample_rate, frame.layout.nb_channels  # type: ignore[attr-defined]
        if self.rate == 0:
            self.bounds.check_rate(rate)
            self.rate = rate
        elif rate != self.rate:
            raise InvalidAudio(f"the sample rate changes mid-stream ({self.rate} -> {rate} Hz)")
        self.bounds.check_channels(channels)
        self.frames += frame.samples  # type: ignore[attr-defined]
        if self.frames > self.bounds.max_frames(self.rate):
            raise InvalidAudio(f"the audio lasts more than {self.bounds.max_seconds:g} s; it must last "
                               f"{self.bounds.span()}")  # fmt: skip
        self.parts.append(_frame_mono(frame, channels))

    def result(self) -> tuple[np.ndarray, int]:
        if self.rate == 0:
            raise InvalidAudio("the file holds no decodable audio")
        self.bounds.check_frames(self.frames, self.rate)
        return _finite(np.concatenate(self.parts)), self.rate


def _frame_mono(frame: object, channels: int) -> np.ndarray:
    """One decoded frame -> mono float32 (planar: one row per channel; packed: interleaved)."""
    fmt = frame.format  # type: ignore[attr-defined]
    x = frame.to_ndarray()  # type: ignore[attr-defined]
    x = x.reshape(channels, -1) if fmt.is_planar else x.reshape(-1, channels).T
    scale = _INT_SCALE.get(fmt.name.rstrip("p"))
    mono = x.astype(np.float32).mean(axis=0) if scale is None else (x.mean(axis=0) - scale[1]) / scale[0]
    return mono.astype(np.float32)


def _decode_with_ffmpeg(data: bytes, container: str, bounds: AudioBounds) -> DecodedAudio:
    import av

    label = "M4A/MP4" if container == "mov" else container.upper()
    collector = _MonoCollector(bounds)
    try:
        with av.open(io.BytesIO(data), mode="r", format=container) as media:
            if not media.streams.audio:
                raise InvalidAudio(f"the {label} file has no audio stream")
            stream = media.streams.audio[0]
            codec = stream.codec_context
            if codec is None:  # FFmpeg has no decoder for it
                raise InvalidAudio(f"the {label} file's audio codec is not supported")
            if codec.sample_rate:  # a header's values, checked early; each frame is checked again
                bounds.check_rate(codec.sample_rate)
            bounds.check_channels(codec.channels or 1)
            for frame in media.decode(stream):
                collector.add(frame)
    except (av.FFmpegError, ValueError, EOFError) as exc:
        raise InvalidAudio(f"the {label} file could not be decoded: {exc}") from None
    samples, rate = collector.result()
    return DecodedAudio(samples, rate, container)


def _finite(samples: np.ndarray) -> np.ndarray:
    """Refuse NaN/inf (a float file can hold them; they would poison the voice's embedding)."""
    if not np.isfinite(samples).all():
        raise InvalidAudio("the audio holds NaN or infinite samples")
    return np.clip(samples, -1.0, 1.0, out=samples)
