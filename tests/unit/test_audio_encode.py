"""Compressed formats encoded as they stream (voxgate/audio_encode.py), decoded back with PyAV."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from voxgate.audio import COMPRESSED, to_pcm16
from voxgate.audio_encode import CompressedEncoder, make_encoder

RATE = 24000
CHUNK = 2880  # 120 ms, as a tone engine hands them out


def _tone(seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as media:
        frames = [f.to_ndarray().reshape(-1) for f in media.decode(audio=0)]
        rate = media.streams.audio[0].rate
    pcm = np.concatenate(frames)
    return (pcm.astype(np.float32) / 32768.0 if pcm.dtype == np.int16 else pcm.astype(np.float32)), rate


def _encode(fmt: str, signal: np.ndarray) -> tuple[list[bytes], bytes]:
    encoder = CompressedEncoder(fmt, RATE, RATE)
    parts = [encoder.encode(signal[k : k + CHUNK]) for k in range(0, len(signal), CHUNK)]
    return parts, encoder.flush()


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_bytes_leave_with_the_audio_not_at_the_end(fmt):
    parts, tail = _encode(fmt, _tone(2.0))
    assert parts[0] or parts[1], "nothing came out of the first 240 ms"
    assert sum(len(p) for p in parts) > len(tail)  # most of the stream left before the end


@pytest.mark.parametrize("fmt", COMPRESSED)
def test_the_stream_decodes_to_the_same_tone(fmt):
    signal = _tone(1.5)
    parts, tail = _encode(fmt, signal)
    decoded, rate = _decode(b"".join(parts) + tail)
    seconds = len(decoded) / rate
    assert 1.5 <= seconds <= 1.5 + 0.2, seconds  # codec priming and the padded last frame, no more
    spectrum = np.abs(np.fft.rfft(decoded[:rate]))
    assert abs(np.argmax(spectrum) - 440) <= 2  # the pitch (a 1 s window: 1 Hz bins)
    assert 0.15 < np.sqrt(np.mean(decoded[rate // 4 : rate] ** 2)) < 0.25  # its level (0.3 peak: RMS 0.21)


def test_flac_is_lossless():
    signal = _tone(1.0, 523.25)
    parts, tail = _encode("flac", signal)
    decoded, rate = _decode(b"".join(parts) + tail)
    assert rate == RATE
    assert np.array_equal(to_pcm16(decoded[: len(signal)]), to_pcm16(signal))


def test_a_resampled_stream_and_an_early_close():
    encoder = make_encoder("mp3", 22050, 24000)
    assert isinstance(encoder, CompressedEncoder) and encoder.media_type == "audio/mpeg"
    encoder.encode(np.zeros(22050, dtype=np.float32))
    assert 23000 < encoder.samples_out <= 24000  # the resampler holds its filter tail until flush
    encoder.close()  # a client gone mid-stream: the codec is freed, and flush after it is empty
    assert encoder.flush() == b""
    with pytest.raises(ValueError, match="not a compressed format"):
        CompressedEncoder("wav", RATE, RATE)


@pytest.mark.parametrize("fmt", ["mp3", "flac"])
def test_pcm16_given_by_the_engine_encodes_the_same(fmt):
    """A compressed stream fed the engine's own 16-bit PCM beside the float samples gets the same
    bytes as one that converts them itself (encoders with the same input are deterministic)."""
    signal = _tone(1.0)
    plain, given = CompressedEncoder(fmt, RATE, RATE), CompressedEncoder(fmt, RATE, RATE)
    chunks = [signal[k : k + CHUNK] for k in range(0, len(signal), CHUNK)]
    a = b"".join(plain.encode(c) for c in chunks) + plain.flush()
    b = b"".join(given.encode(c, to_pcm16(c)) for c in chunks) + given.flush()
    assert a == b
