"""Audio for the wire in pieces: each engine chunk encoded as it comes, then cut into pieces of
at most `chunk_ms` of audio, so that a stop takes effect within one piece on every transport
that writes pieces (HTTP streams, bridge replies). Compressed pieces are smaller than PCM's for
the same audio; they are cut at the PCM size, which bounds them."""

from __future__ import annotations

import numpy as np

from voxgate.audio import split_bytes
from voxgate.audio_encode import make_encoder


class WirePieces:
    """`pieces(samples)` -> encoded pieces; `flush()` the encoder's tail; `close()` frees a
    codec left open (a stream that ended early)."""

    def __init__(self, fmt: str, in_rate: int, out_rate: int, chunk_ms: int) -> None:
        self.encoder = make_encoder(fmt, in_rate, out_rate)
        self.size = self.encoder.bytes_per_sample * (out_rate * chunk_ms // 1000)
        self.bytes_per_s = self.encoder.bytes_per_sample * out_rate  # of PCM: what a piece's audio lasts

    @property
    def media_type(self) -> str:
        return self.encoder.media_type

    @property
    def audio_s(self) -> float:
        """Audio encoded so far, in seconds."""
        return self.encoder.samples_out / self.encoder.out_rate

    def pieces(self, samples: np.ndarray, pcm16: np.ndarray | None = None) -> list[bytes]:
        """`samples` encoded and cut; `pcm16`: the same as 16-bit PCM when the engine made them."""
        return split_bytes(self.encoder.encode(samples, pcm16), self.size)

    def flush(self) -> bytes:
        return self.encoder.flush()

    def close(self) -> None:
        self.encoder.close()


def cut_audio(data: bytes, samples: int, most: int) -> list[tuple[bytes, int]]:
    """`data`, which carries `samples` samples, cut into pieces of at most `most` bytes, each
    with its share of the samples by bytes (exact for PCM and mu-law when `most` is a whole
    number of samples; a compressed piece's share is as near as its bytes say)."""
    out: list[tuple[bytes, int]] = []
    done = at = 0
    for piece in split_bytes(data, most):
        at += len(piece)
        upto = samples * at // len(data)
        out.append((piece, upto - done))
        done = upto
    return out
