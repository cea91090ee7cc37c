import io
import struct
import wave

import numpy as np
import pytest

from voxgate.audio import (
    Resampler,
    StreamEncoder,
    check_output,
    mulaw_decode,
    mulaw_encode,
    pcm16_bytes,
    pcm16_to_float,
    resample,
    split_bytes,
    to_pcm16,
    wav_bytes,
    wav_header,
)
from voxgate.types import UnsupportedFormat, UnsupportedSampleRate

# G.711 mu-law reference values (ITU-T G.711 / Sun g711.c, as CPython's audioop computes them)
MULAW_VECTORS = [(0, 0xFF), (-1, 0x7E), (1, 0xFF), (32767, 0x80), (-32768, 0x00), (100, 0xF2), (-100, 0x72),
                 (1000, 0xCE), (-1000, 0x4E), (8000, 0xA0), (-8000, 0x20)]  # fmt: skip
MULAW_DECODED = [
    (0x00, -32124),
    (0x80, 32124),
    (0xFF, 0),
    (0x7F, 0),
    (0xCE, 988),
    (0x4E, -988),
    (0x9F, 8316),
    (0xA0, 7932),
]


@pytest.mark.parametrize(("linear", "code"), MULAW_VECTORS)
def test_mulaw_encode_matches_g711_vectors(linear, code):
    assert mulaw_encode(np.array([linear], dtype=np.int16))[0] == code


@pytest.mark.parametrize(("code", "linear"), MULAW_DECODED)
def test_mulaw_decode_matches_g711_vectors(code, linear):
    assert mulaw_decode(bytes([code]))[0] == linear


def test_mulaw_matches_audioop_for_every_16_bit_value():
    audioop = pytest.importorskip("audioop")  # in the standard library up to Python 3.12
    everything = np.arange(-32768, 32768, dtype=np.int16)
    assert mulaw_encode(everything).tobytes() == audioop.lin2ulaw(everything.tobytes(), 2)
    codes = np.arange(256, dtype=np.uint8).tobytes()
    assert mulaw_decode(codes).tobytes() == audioop.ulaw2lin(codes, 2)


def test_pcm16_round_trip_and_clipping():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.7, -3.0], dtype=np.float32)
    data = pcm16_bytes(x)
    assert struct.unpack("<7h", data) == (0, 16384, -16384, 32767, -32767, 32767, -32767)
    assert np.allclose(pcm16_to_float(data)[:5], x[:5], atol=1 / 32767)


def test_wav_bytes_is_a_valid_file_with_exact_sizes():
    x = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    with wave.open(io.BytesIO(wav_bytes(x, 16000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, 1000)
        assert w.readframes(1000) == pcm16_bytes(x)


def test_streaming_wav_header_marks_unknown_length_and_is_readable():
    header = wav_header(24000)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", header[4:8])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    body = pcm16_bytes(np.full(480, 0.25, dtype=np.float32))
    with wave.open(io.BytesIO(header + body)) as w:
        assert w.getframerate() == 24000
        assert w.readframes(480) == body


def test_mulaw_wav_header_uses_format_7():
    header = wav_header(8000, 10, mulaw=True)
    fmt_tag, channels, rate, byte_rate, align, bits = struct.unpack("<HHIIHH", header[20:36])
    assert (fmt_tag, channels, rate, byte_rate, align, bits) == (7, 1, 8000, 8000, 1, 8)


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


@pytest.mark.parametrize(("src", "dst"), [(22050, 24000), (24000, 8000), (24000, 16000), (22050, 48000)])
def test_resample_keeps_length_pitch_and_level(src, dst):
    t = np.arange(src) / src
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    y = resample(x, src, dst)
    assert len(y) == dst
    assert abs(_peak_hz(y, dst) - 440) < 2
    middle = y[dst // 10 : -dst // 10]
    assert np.sqrt(np.mean(middle**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.02)


def test_resampled_sine_equals_the_sine_sampled_at_the_new_rate():
    """Known vector: a 1 kHz sine at 24 kHz, resampled to 8 kHz, is the 1 kHz sine at 8 kHz."""
    x = np.sin(2 * np.pi * 1000 * np.arange(24000) / 24000).astype(np.float32)
    expected = np.sin(2 * np.pi * 1000 * np.arange(8000) / 8000)
    y = resample(x, 24000, 8000)
    assert np.max(np.abs(y[400:-400] - expected[400:-400])) < 1e-3


def test_resampler_in_chunks_equals_one_shot():
    rng = np.random.default_rng(0)
    x = rng.uniform(-0.5, 0.5, 22050).astype(np.float32)
    r = Resampler(22050, 8000)
    chunked = np.concatenate([r.process(x[i : i + 777]) for i in range(0, len(x), 777)] + [r.flush()])
    assert np.array_equal(chunked, resample(x, 22050, 8000))


def test_same_rate_resampler_is_identity():
    x = np.arange(10, dtype=np.float32) / 10
    assert np.array_equal(resample(x, 24000, 24000), x)


def test_stream_encoder_wav_puts_header_before_first_audio_only():
    enc = StreamEncoder("wav", 24000, 24000)
    first = enc.encode(np.zeros(240, dtype=np.float32))
    second = enc.encode(np.zeros(240, dtype=np.float32))
    assert first[:4] == b"RIFF" and len(first) == 44 + 480
    assert len(second) == 480 and enc.flush() == b""


def test_stream_encoder_mulaw_is_one_byte_per_8khz_sample():
    enc = StreamEncoder("mulaw", 24000, 8000)
    out = enc.encode(np.zeros(24000, dtype=np.float32)) + enc.flush()
    assert len(out) == 8000 and set(out) == {0xFF}


def test_split_bytes():
    assert split_bytes(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert split_bytes(b"", 3) == []
    assert split_bytes(b"ab", 0) == [b"ab"]


def test_check_output_rates_and_errors():
    assert check_output("pcm", None, 22050) == 22050
    assert check_output("wav", 16000, 22050) == 16000
    assert check_output("mulaw", None, 24000) == 8000
    with pytest.raises(UnsupportedFormat):
        check_output("mp3", None, 24000)
    with pytest.raises(UnsupportedSampleRate):
        check_output("pcm", 12345, 24000)
    with pytest.raises(UnsupportedSampleRate):
        check_output("mulaw", 16000, 24000)


def test_opus_with_no_rate_asked_takes_the_next_rate_libopus_takes():
    # Piper speaks at 22050 Hz, which libopus does not take: a request that names no rate gets
    # the next Opus rate up (resampled), one that names a rate libopus does not take is refused
    assert check_output("opus", None, 22050, ("opus",)) == 24000
    assert check_output("opus", None, 44100, ("opus",)) == 48000
    assert check_output("opus", None, 16000, ("opus",)) == 16000
    assert check_output("opus", 16000, 22050, ("opus",)) == 16000
    with pytest.raises(UnsupportedSampleRate, match="not 22050"):
        check_output("opus", 22050, 22050, ("opus",))


def test_decode_wav_reads_mono_and_mixes_stereo_down():
    from voxgate.audio import decode_wav

    x = np.linspace(-0.5, 0.5, 100, dtype=np.float32)
    samples, rate = decode_wav(wav_bytes(x, 16000))
    assert rate == 16000 and np.allclose(samples, x, atol=1 / 32767)
    stereo = io.BytesIO()
    with wave.open(stereo, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.array([1000, 3000] * 10, dtype="<i2").tobytes())
    mixed, rate = decode_wav(stereo.getvalue())
    assert rate == 8000 and len(mixed) == 10 and np.allclose(mixed, 2000 / 32767)


def test_decode_wav_refuses_what_it_cannot_read():
    from voxgate.audio import decode_wav

    with pytest.raises(UnsupportedFormat):
        decode_wav(b"not a wav file at all")
    eight_bit = io.BytesIO()
    with wave.open(eight_bit, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(bytes(100))
    with pytest.raises(UnsupportedFormat, match="16-bit"):
        decode_wav(eight_bit.getvalue())


@pytest.mark.parametrize(("fmt", "out_rate"), [("pcm", 24000), ("wav", 24000), ("pcm", 16000), ("mulaw", 8000)])
def test_pcm16_given_by_the_engine_makes_the_same_bytes(fmt, out_rate):
    """An engine's own 16-bit PCM (the batched qwen3 runner's) is sent as it is where no
    resampling is needed, and ignored where it is: the wire bytes are the same either way."""
    rng = np.random.default_rng(0)
    chunks = [np.clip(rng.normal(0, 0.4, n), -1.2, 1.2).astype(np.float32) for n in (1920, 1920, 960, 0)]
    plain, given = StreamEncoder(fmt, 24000, out_rate), StreamEncoder(fmt, 24000, out_rate)
    a = b"".join(plain.encode(c) for c in chunks) + plain.flush()
    b = b"".join(given.encode(c, to_pcm16(c)) for c in chunks) + given.flush()
    assert a == b and plain.samples_out == given.samples_out
    if fmt == "pcm" and out_rate == 24000:  # and they were used: other numbers give other bytes
        wrong = StreamEncoder(fmt, 24000, out_rate)
        assert wrong.encode(chunks[0], np.zeros(1920, dtype=np.int16)) == bytes(2 * 1920)
