"""vLLM-Omni's streaming speech socket (`/v1/audio/speech/stream`) over voxgate's gateway.

vLLM-Omni's clients send `session.config`, `input.text` deltas, `input.done` (end of an
utterance; the socket stays open for the next) and `session.close`. Its server answers each
sentence with `audio.start` (`utterance_index`, `sentence_index` counted within the utterance,
`sentence_text`, `format`; with `stream_audio` on PCM also `sample_rate` and `channels`), the
sentence's audio as binary frames (one whole file per sentence, WAV by default, or PCM chunks
as they are made with `stream_audio`), and `audio.done` (`total_bytes`, `error`); after each
`input.done` comes `session.done` (`utterance_index`, `total_sentences`). Errors are
`{"type": "error", "message"}` (ours add `code` and `fatal`). Its PCM is 24 kHz, the Qwen3-TTS
rate, whatever the engine here: a client that reads raw PCM cannot be told otherwise.

Here a sentence is one of the gateway's segments: with `split_granularity` `none` (its
default) the whole text of an `input.done`, else the gateway's segmenter's (a starter clause
first with `clause`), so everything else (admission, deadlines, cancel on
disconnect, backpressure) is the gateway's. This module is the translation only, without I/O:
`OmniConfig` -> our `SessionStart`, and `OmniFraming` turns each message of a session's log
into the frames vLLM-Omni's server would send.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from voxgate.audio import COMPRESSED, check_output, pcm16_to_float, wav_header
from voxgate.audio_encode import CompressedEncoder
from voxgate.serving.protocol import describe_validation
from voxgate.serving.wsproto import Bare, Ping, ProtocolError, SessionStart, TextDelta, decode_frame, parse_data
from voxgate.types import VoxgateError

OMNI_RATE = 24_000  # vLLM-Omni's PCM: Qwen3-TTS's own rate
OMNI_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")


class OmniConfig(BaseModel):
    """vLLM-Omni's `session.config`. Fields it has that change what is said and that voxgate
    cannot do are refused by name (a clone by reference audio, word timestamps); the rest of its
    fields (model, task_type, max_new_tokens, seed, ...) are accepted and have no effect."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["session.config"]
    voice: str | None = Field(None, max_length=128, validation_alias=AliasChoices("voice", "speaker"))
    language: str | None = Field(None, max_length=32)
    instructions: str | None = Field(None, max_length=2000)
    response_format: str = Field("wav", max_length=16)
    sample_rate: int | None = Field(None, ge=8000, le=48000)
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_audio: bool = False
    split_granularity: Literal["none", "sentence", "clause"] = "none"  # 0.30.0's default: one request per input.done
    ref_audio: str | None = Field(None, max_length=64)  # refused when present (see `check`); its size is not ours
    word_timestamps: bool = False

    @classmethod
    def parse(cls, data: dict[str, Any]) -> OmniConfig:
        data = {**data, "ref_audio": "given" if data.get("ref_audio") else None}
        try:
            config = cls.model_validate(data)
        except ValidationError as exc:
            raise ProtocolError("invalid_message", f"session.config: {describe_validation(exc.errors())}") from None
        config.check()
        return config

    def check(self) -> None:
        fmt = "pcm" if self.response_format == "pcm16" else self.response_format
        if fmt not in OMNI_FORMATS:
            raise ProtocolError("unsupported_format", f"response_format {self.response_format!r} is not served "
                                f"here; use one of {', '.join(OMNI_FORMATS)}")  # fmt: skip
        try:
            check_output(fmt, self.sample_rate, OMNI_RATE, OMNI_FORMATS)  # the rate for the format (Opus's few)
        except VoxgateError as exc:
            raise ProtocolError(exc.code, exc.message) from None
        if self.ref_audio:
            raise ProtocolError("not_supported", "cloning from ref_audio in session.config is not supported: "
                                "register the voice with POST /v1/voices and name it in 'voice'")  # fmt: skip
        if self.word_timestamps:
            raise ProtocolError("not_supported", "word_timestamps are not supported on this server")
        self.response_format = fmt

    def session_start(self) -> SessionStart:
        """Our session for it: PCM at the rate its client expects (the framing encodes)."""
        return SessionStart(
            type="session.start",
            voice=self.voice,
            language=self.language,
            format="pcm16",
            sample_rate=self.sample_rate or OMNI_RATE,
            speed=self.speed,
            instructions=self.instructions,
            starter_units=3 if self.split_granularity == "clause" else 0,
            segments="utterance" if self.split_granularity == "none" else "auto",
        )


def parse_omni(raw: str | bytes, max_bytes: int) -> OmniConfig | SessionStart | TextDelta | Bare | Ping:
    """One frame on vLLM-Omni's path: its `session.config`, its other messages as ours."""
    data = decode_frame(raw, max_bytes)
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "session.config":
        return OmniConfig.parse(data)
    if kind == "session.start":
        raise ProtocolError("unknown_type", "on vLLM-Omni's path a session starts with session.config")
    return parse_data(data, compat=True)


class OmniFraming:
    """A session's log -> vLLM-Omni's frames. A sentence is a segment: `audio.start` with its
    first audio (or at its end if it had none), its audio (whole, or as it comes with
    `stream_audio`), `audio.done`; `utterance.done` -> `session.done`. Our `session.started`
    and final `session.done` have no counterpart and are not sent."""

    def __init__(self, config: OmniConfig, sample_rate: int, utterance: int = 0) -> None:
        self.format, self.stream, self.rate = config.response_format, config.stream_audio, sample_rate
        self.utterance = utterance
        self.sentence = 0
        self._started = False
        self._failed = False
        self._sent = 0  # bytes of the sentence's audio sent
        self._pcm: list[bytes] = []  # a whole-file sentence's PCM16, until its end
        self._encoder: CompressedEncoder | None = None

    def frames(self, message: dict[str, Any], payload: bytes | None, text: str | None) -> list[str | bytes]:
        kind = message["type"]
        if kind == "audio":
            return [*self._start(text), *self._audio(payload or b"")]
        if kind == "units.done":
            return [*self._start(text), *self._end()]
        if kind == "utterance.done":
            close = self._end(keep=False) if self._started else []  # cancelled mid-sentence: its start is answered
            done = {"type": "session.done", "utterance_index": self.utterance, "total_sentences": self.sentence}
            self.utterance, self.sentence = self.utterance + 1, 0
            return [*close, json.dumps(done)]
        if kind == "session.done":
            return []
        if kind == "error":  # logged errors are a segment's (its engine failed): its audio.done says so
            self._failed = True
        return [json.dumps(message)]

    def _start(self, text: str | None) -> list[str | bytes]:
        if self._started:
            return []
        self._started = True
        start: dict[str, Any] = {"type": "audio.start", "utterance_index": self.utterance, "sentence_index":
                                 self.sentence, "sentence_text": text or "", "format": self.format}  # fmt: skip
        if self.stream and self.format == "pcm":
            start.update(sample_rate=self.rate, channels=1)
        frames: list[str | bytes] = [json.dumps(start)]
        if self.format in COMPRESSED:
            self._encoder = CompressedEncoder(self.format, self.rate, self.rate)
        if self.stream and self.format == "wav":
            frames.append(self._count(wav_header(self.rate)))  # a stream of unknown length, as a pipe's WAV
        return frames

    def _audio(self, pcm: bytes) -> list[str | bytes]:
        if self._encoder is not None:
            encoded = self._encoder.encode(pcm16_to_float(pcm))
            if not self.stream:
                self._pcm.append(encoded)
                return []
            return [self._count(encoded)] if encoded else []
        if not self.stream:
            self._pcm.append(pcm)
            return []
        return [self._count(pcm)]

    def _end(self, keep: bool = True) -> list[str | bytes]:
        frames: list[str | bytes] = []
        body = b"".join(self._pcm)
        if self._encoder is not None:
            body += self._encoder.flush()
        elif self.format == "wav" and not self.stream:
            body = wav_header(self.rate, len(body) // 2) + body
        if body and keep:
            frames.append(self._count(body))
        done = {"type": "audio.done", "utterance_index": self.utterance, "sentence_index": self.sentence,
                "total_bytes": self._sent, "error": self._failed}  # fmt: skip
        frames.append(json.dumps(done))
        self.sentence += 1
        self._started = self._failed = False
        self._sent, self._pcm, self._encoder = 0, [], None
        return frames

    def _count(self, data: bytes) -> bytes:
        self._sent += len(data)
        return data

    def close(self) -> None:
        """Free a sentence's codec left open (the socket went mid-sentence)."""
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
