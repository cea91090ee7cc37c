"""The user's side of a case: each step's words said by the project's own Piper voice, padded
like a mic recording, then the case's anomaly and noise applied (`inject`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from voxgate.regress import signals
from voxgate.regress.e2e import inject
from voxgate.regress.e2e.cases import Case

LEAD_S, TAIL_S = 0.3, 0.3  # room tone around the words, as a mic would send
USER_PEAK = 0.3  # the words' peak (-10 dBFS), a mic's level: Piper's own output peaks at full scale


class Voice(Protocol):
    def __call__(self, text: str) -> tuple[np.ndarray, int]: ...


@dataclass(frozen=True, slots=True)
class Utterance:
    """What the bot says for one step: `samples` at `sample_rate`; the words end at
    `speech_end_s` from the clip's start (the user's acoustic end of turn)."""

    samples: np.ndarray
    sample_rate: int
    speech_end_s: float

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def speech_end_s(x: np.ndarray, sample_rate: int) -> float:
    """The end of the last speech frame (10 ms frames, `signals.speech_frames`)."""
    voiced = np.flatnonzero(signals.speech_frames(x, sample_rate))
    return float((voiced[-1] + 1) * signals.FRAME_S) if voiced.size else 0.0


def prepare(clean: np.ndarray, sample_rate: int, case: Case, seed: int = 0) -> Utterance:
    """Set to a mic's level and pad, then the anomaly (it may change the length), then the
    noise over all of it."""
    words = np.asarray(clean, dtype=np.float32)
    words = words * (USER_PEAK / max(float(np.max(np.abs(words))), 1e-9)) if words.size else words
    pad = np.zeros(round(LEAD_S * sample_rate), dtype=np.float32), np.zeros(round(TAIL_S * sample_rate), np.float32)
    x = np.concatenate([pad[0], words, pad[1]])
    if case.anomaly is not None:
        x = inject.apply(x, sample_rate, case.anomaly.kind, case.anomaly.params)
    end = speech_end_s(x, sample_rate)
    if case.noise is not None:
        x = inject.mix_at_snr(x, sample_rate, case.noise.snr_db, case.noise.kind, seed)
    return Utterance(x, sample_rate, end)


def piper_voice() -> Voice:
    """The packaged Piper voice as a `Voice` (loads the model once, ~1 s)."""
    from voxgate.engines.piper import PiperEngine
    from voxgate.types import CancelToken, SynthesisRequest

    engine = PiperEngine()
    voice = engine.voices()[0].id
    cache: dict[str, tuple[np.ndarray, int]] = {}

    def say(text: str) -> tuple[np.ndarray, int]:
        if text not in cache:
            chunks = list(engine.stream(SynthesisRequest(text=text, voice=voice), CancelToken()))
            cache[text] = (np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate)
        return cache[text]

    return say


def trim(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """`x` from its first to its last speech frame (`signals.speech_frames`); empty without speech."""
    voiced = np.flatnonzero(signals.speech_frames(x, sample_rate))
    frame = round(signals.FRAME_S * sample_rate)
    return x[voiced[0] * frame : (voiced[-1] + 1) * frame] if voiced.size else x[:0]


def join_sentences(voice: Voice, sentences: Sequence[str], pauses_ms: Sequence[int],
                   lead_s: float = 0.0) -> tuple[np.ndarray, int, list[tuple[float, float]]]:  # fmt: skip
    """Each sentence said alone, cut to its speech, joined by exactly `pauses_ms` of silence (a
    TTS's own pause after a full stop is shorter and differs by voice); `lead_s` of silence
    first. Returns the audio, its rate and each sentence's (start, end) in seconds."""
    pieces: list[np.ndarray] = []
    spans, rate = [], 0
    for i, sentence in enumerate(sentences):
        x, r = voice(sentence)
        if rate and r != rate:
            raise ValueError("the voice changed its sample rate between sentences")
        rate = r
        pieces.append(np.zeros(round((pauses_ms[i - 1] / 1000 if i else lead_s) * rate), dtype=np.float32))
        start = sum(map(len, pieces))
        pieces.append(trim(np.asarray(x, dtype=np.float32), rate))
        spans.append((start / rate, (start + len(pieces[-1])) / rate))
    return np.concatenate(pieces), rate, spans


def utterances(case: Case, voice: Voice) -> list[Utterance]:
    """One utterance per step of `case` (a step with sentences: joined by its pauses)."""
    out = []
    for i, step in enumerate(case.steps):
        if step.sentences:
            clean, rate, _ = join_sentences(voice, step.sentences, step.pauses_ms)
        else:
            clean, rate = voice(step.text)
        out.append(prepare(clean, rate, case, seed=i))
    return out
