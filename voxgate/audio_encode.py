"""Compressed audio for the wire, encoded as it streams: mp3, Opus (in Ogg), AAC (ADTS), FLAC.

`CompressedEncoder` has `StreamEncoder`'s interface (`encode` float chunks at the engine
rate, `flush` at the end) and hands back whatever the muxer wrote for each chunk, so the
first bytes leave with the first audio rather than at the end. The codecs and muxers are
FFmpeg's through PyAV (a dependency already, for decoding uploads): LAME for mp3, libopus,
FFmpeg's native AAC and FLAC encoders. Writing our own would gain nothing: these are the
reference encoders. Each codec takes fixed-size frames (mp3 576 samples at 24 kHz, AAC 1024,
Opus 20 ms, FLAC 2304); samples short of a frame wait for the next chunk, and only the last
frame is padded with silence. Muxer options keep the stream live: Ogg pages are flushed every
20 ms of audio (its default holds a page up to a second), mp3 gets no ID3 tag or Xing frame
(both need a seekable file).
"""

from __future__ import annotations

import contextlib
from typing import Any

import av
import numpy as np

from voxgate.audio import COMPRESSED, Resampler, StreamEncoder, to_pcm16

MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac"}
_CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "adts", "flac": "flac"}
_CODECS = {"mp3": "libmp3lame", "opus": "libopus", "aac": "aac", "flac": "flac"}
_OPTIONS = {"opus": {"page_duration": "20000"}, "mp3": {"write_xing": "0", "id3v2_version": "0"}}
_BIT_RATES = {"mp3": 64_000, "opus": 48_000, "aac": 64_000}  # mono speech; FLAC is lossless


def make_encoder(fmt: str, in_rate: int, out_rate: int) -> StreamEncoder | CompressedEncoder:
    """The wire encoder for a format: PCM, WAV and mu-law as they are, the rest compressed."""
    if fmt in COMPRESSED:
        return CompressedEncoder(fmt, in_rate, out_rate)
    return StreamEncoder(fmt, in_rate, out_rate)  # type: ignore[arg-type]


class _Sink:
    """A write-only file for the muxer: collects what it writes until taken (not seekable)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class CompressedEncoder:
    """Float chunks at `in_rate` -> bytes of `fmt` at `out_rate`, as they are encoded."""

    bytes_per_sample = 2  # for sizing wire pieces as PCM would be (compressed pieces are smaller)

    def __init__(self, fmt: str, in_rate: int, out_rate: int) -> None:
        if fmt not in COMPRESSED:
            raise ValueError(f"not a compressed format: {fmt!r}")
        self.fmt, self.out_rate, self.samples_out = fmt, out_rate, 0
        self._resampler = Resampler(in_rate, out_rate)
        self._sink = _Sink()
        self._container = av.open(self._sink, mode="w", format=_CONTAINERS[fmt], options=_OPTIONS.get(fmt, {}))
        self._stream = self._container.add_stream(_CODECS[fmt], rate=out_rate, layout="mono")
        if fmt in _BIT_RATES:
            self._stream.bit_rate = _BIT_RATES[fmt]
        self._frame = self._stream.codec_context.frame_size or 1024
        self._pending = np.zeros(0, dtype=np.int16)
        self._pts = 0
        self._closed = False

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.fmt]

    def encode(self, samples: np.ndarray, pcm16: np.ndarray | None = None) -> bytes:
        """The bytes the muxer has for this chunk (possibly none while a frame fills up);
        `pcm16`: the same samples as 16-bit PCM, used as they are where no resampling is needed."""
        out = self._resampler.process(samples)
        self.samples_out += len(out)
        made = pcm16 if pcm16 is not None and self._resampler.passthrough else to_pcm16(out)
        self._pending = np.concatenate([self._pending, made])
        whole = len(self._pending) - len(self._pending) % self._frame
        for start in range(0, whole, self._frame):
            self._encode(self._pending[start : start + self._frame])
        self._pending = self._pending[whole:]
        return self._sink.take()

    def flush(self) -> bytes:
        """The rest: the resampler's tail, the last frame padded with silence, the trailer."""
        if self._closed:
            return b""
        out = self._resampler.flush()
        self.samples_out += len(out)
        rest = np.concatenate([self._pending, to_pcm16(out)])
        for start in range(0, len(rest), self._frame):
            frame = rest[start : start + self._frame]
            self._encode(np.pad(frame, (0, self._frame - len(frame))))
        self._pending = np.zeros(0, dtype=np.int16)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._closed = True
        return self._sink.take()

    def close(self) -> None:
        """Free the codec if the stream ended early (a cancel, a client gone)."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(av.FFmpegError, ValueError):  # half-written: nothing to save
                self._container.close()

    def _encode(self, pcm: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.out_rate, self._pts
        self._pts += len(pcm)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
