"""Semantic end of turn: a pause the VAD found is asked whether the user is done talking.

The VAD alone ends a turn at the first pause of the hangover's length, so "Okay. So, what is
the tallest mountain in the world?" was answered at "Okay. So," and then again. `TurnDetector`
sits on the VAD's events (`StreamingVad(turn=...)`): at each pause it asks a turn model for
the probability that the turn so far is complete. Complete (>= `threshold`) ends the turn
now; incomplete holds it open, and speech that resumes continues the same turn (its
`SpeechStarted` is swallowed, its `SpeechEnded` spans the whole turn), while a silence of
`max_silence_ms` ends it anyway, so a turn is never stuck on the model's doubt.

The model is Smart Turn v3.2 (pipecat-ai, BSD-2), an 8.7 MB ONNX file that ships inside the
`pipecat-ai` wheel; it is found as package data and run with ONNX Runtime here, without
importing pipecat. It reads the Whisper log-mel features (80 bins, 100 frames a second) of
the last 8 s of the turn at 16 kHz, zero-padded at the front, and says whether the speech
sounds finished, from the audio alone (prosody and words). Its input features come from
faster-whisper's numpy `FeatureExtractor` (the STT's dependency already); they match the
features pipecat feeds the model to within 2e-6.

Measured on this project's 2-core CPU machine (one ONNX thread; the input is always 8 s, so
the length of the turn does not matter): one call takes 103 ms at the median and 126 ms at
p95 with the machine nearly idle (load 1.6), of which the features are 16 ms; with other
work on both cores (load 7-8) 140-290 ms. Two ONNX threads were no faster (139 ms idle).
That is too long for the event loop, so the service runs the model on its executor and the
detector takes the verdict at the first window after it arrives: a complete turn ends about
the model's latency after the hangover (`TurnDecision.silence_ms` says how long exactly).

What it cannot do: it judges sound, not meaning, and synthetic voices say every fragment
with a final fall, so Piper's "Hi there." (0.985) and "I want to book a table for" (0.97)
sound complete to it (a greeting before a question still ends a turn), while "What is the"
(0.34) and "Okay. So," (0.02) do not.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from voxgate.agent.vad import VAD_RATE, SpeechEnded, SpeechStarted, VadEvent
from voxgate.types import InvalidRequest, VoxgateError

log = logging.getLogger(__name__)

MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
MODEL_SECONDS = 8  # the model hears the last 8 s of a turn


class TurnModelMissing(VoxgateError):
    """The Smart Turn model file (package data of pipecat-ai) or ONNX Runtime is not installed."""

    code = "turn_model_missing"
    status = 500


def smart_turn_path() -> Path | None:
    """Where pipecat-ai's wheel put the model, found without importing pipecat (whose
    package imports pull in its whole framework); None when it is not installed."""
    try:
        spec = importlib.util.find_spec("pipecat")
    except (ImportError, ValueError):  # a broken install, or a module entry without a spec
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "audio" / "turn" / "smart_turn" / "data" / MODEL_FILE
        if path.is_file():
            return path
    return None


class SmartTurnModel:
    """Smart Turn v3.2: 16 kHz float audio of a turn so far -> probability it is complete.

    One instance may serve every call: ONNX Runtime sessions run concurrently.
    """

    sample_rate = VAD_RATE

    def __init__(self, path: Path | None = None, threads: int = 1) -> None:
        if path is not None and not path.is_file():  # a file named in the settings (VOXGATE_AGENT_TURN_MODEL_PATH)
            raise TurnModelMissing(f"no turn model file at {path}")
        path = path or smart_turn_path()
        if path is None or not path.is_file():
            raise TurnModelMissing(f"the turn model needs pipecat-ai==1.14.0 (its {MODEL_FILE}), installed --no-deps")
        try:
            import onnxruntime as ort
            from faster_whisper.feature_extractor import FeatureExtractor
        except ImportError as exc:
            raise TurnModelMissing(f"the turn model needs onnxruntime and faster-whisper ({exc})") from None
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        try:
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # a truncated or foreign file: ONNX Runtime's own error types
            raise TurnModelMissing(f"cannot load the turn model {path}: {exc}") from None
        self._features = FeatureExtractor(feature_size=80, sampling_rate=self.sample_rate, chunk_length=MODEL_SECONDS)
        self.path = path

    def features(self, audio: np.ndarray) -> np.ndarray:
        """(80, 800) log-mel frames of the last 8 s, front-padded with silence, the waveform
        first scaled to zero mean and unit variance (as the model was trained)."""
        n = MODEL_SECONDS * self.sample_rate
        x = np.asarray(audio, dtype=np.float32)[-n:]
        x = np.pad(x, (n - x.size, 0))
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
        return self._features(x, padding=0)  # 801 STFT frames, the extractor drops the last

    def probability(self, audio: np.ndarray) -> float:
        features = self.features(audio)[np.newaxis].astype(np.float32, copy=False)
        (out,) = self._session.run(None, {"input_features": features})
        return float(out[0, 0])  # the graph ends in a sigmoid despite the output's name


# ---------------------------------------------------------------------------- the decision


class TurnScorer(Protocol):
    """Anything that says how likely the turn in `audio` (16 kHz float) is complete."""

    def probability(self, audio: np.ndarray) -> float: ...


@dataclass(frozen=True, slots=True)
class TurnConfig:
    threshold: float = 0.5  # probability at which a pause ends the turn
    max_silence_ms: float = 1500.0  # a pause this long (from the last voiced window) ends it anyway

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise InvalidRequest(f"turn threshold must be in (0, 1], got {self.threshold}")
        if self.max_silence_ms < 0:
            raise InvalidRequest(f"turn max_silence_ms must be >= 0, got {self.max_silence_ms}")


Reason = Literal["complete", "timeout", "error", "ended"]


@dataclass(frozen=True, slots=True)
class TurnDecision:
    """How a turn's end was decided, for its trace.

    `reason`: the model judged the turn complete; or the pause reached `max_silence_ms`
    after the model judged it incomplete (or had not answered yet); or the model failed (the
    VAD's end stands); or the audio stream ended. `probability` and `latency_ms` are the last
    model call's; `incomplete` counts the pauses of this turn the model judged incomplete;
    `silence_ms` is how long the user had been silent when the turn ended (the hangover, the
    model's answer and any wait after an incomplete verdict: what the user waited for).
    """

    reason: Reason
    probability: float | None = None
    latency_ms: float | None = None
    incomplete: int = 0
    silence_ms: float = 0.0


@dataclass(slots=True)
class _Ask:
    """One question to the model about one pause; `result` once answered."""

    future: Future[tuple[float, float]]
    result: tuple[float, float] | None = None  # (probability, latency_ms)
    error: bool = False

    def poll(self) -> None:
        if self.result is not None or self.error or not self.future.done():
            return
        try:
            self.result = self.future.result()
        except Exception:
            log.exception("turn model failed; the VAD's end of turn stands")
            self.error = True


class TurnDetector:
    """VAD events in, VAD events out, with each pause judged by the turn model.

    `step` is called once per VAD window with that window's events and its end (a sample
    position); `audio(start, end)` returns the 16 kHz audio of those samples. Without an
    executor the model runs inline, so the same audio gives the same events (tests, benches);
    with one, the verdict is taken at the first window after it arrives.
    """

    def __init__(self, model: TurnScorer, config: TurnConfig | None = None, executor: Executor | None = None,
                 sample_rate: int = VAD_RATE) -> None:  # fmt: skip
        self.model, self.config, self.executor = model, config or TurnConfig(), executor
        self.sample_rate = sample_rate
        self._max_silence = round(self.config.max_silence_ms * sample_rate / 1000)
        self.reset()

    def reset(self) -> None:
        self._turn_start: int | None = None  # the first sample of the turn being heard
        self._held: SpeechEnded | None = None  # a pause the model is judging or judged incomplete
        self._ask: _Ask | None = None
        self._incomplete = 0

    @property
    def holding(self) -> bool:
        """A pause is being judged, or was judged incomplete and may still be continued."""
        return self._held is not None

    def step(self, events: list[VadEvent], position: int, audio: Callable[[int, int], np.ndarray]) -> list[VadEvent]:
        out: list[VadEvent] = []
        for event in events:
            if isinstance(event, SpeechStarted):
                if self._held is None:
                    self._turn_start = event.start_sample
                    out.append(event)
                else:  # the user went on after a pause judged incomplete: the same turn
                    self._held, self._ask = None, None
            else:
                self._hold(event, audio)
        return out + self._decide(position)

    def flush(self, events: list[VadEvent]) -> list[VadEvent]:
        """The stream ended: a held pause and any speech still open end now."""
        out = [self._end(self._held, "ended")] if self._held is not None else []
        for event in events:
            if isinstance(event, SpeechEnded):
                out.append(self._end(self._spanning(event), "ended"))
        self.reset()
        return out

    def _hold(self, event: SpeechEnded, audio: Callable[[int, int], np.ndarray]) -> None:
        self._held = self._spanning(event)
        start = max(self._held.start_sample, event.sample - MODEL_SECONDS * self.sample_rate)
        clip = audio(start, event.sample)  # the turn and the pause so far, as the model was trained
        self._ask = _Ask(self._submit(clip))

    def _spanning(self, event: SpeechEnded) -> SpeechEnded:
        start = event.start_sample if self._turn_start is None else min(self._turn_start, event.start_sample)
        return replace(event, start_sample=start)

    def _submit(self, clip: np.ndarray) -> Future[tuple[float, float]]:
        """The model's answer, later on the executor or now; a failure is the future's."""
        future: Future[tuple[float, float]] = Future()
        try:
            if self.executor is not None:
                return self.executor.submit(self._score, clip)  # refused once the server shuts down
            future.set_result(self._score(clip))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _score(self, clip: np.ndarray) -> tuple[float, float]:
        t0 = time.perf_counter()
        p = self.model.probability(clip)
        return p, 1000 * (time.perf_counter() - t0)

    def _decide(self, position: int) -> list[VadEvent]:
        held, ask = self._held, self._ask
        if held is None or ask is None:
            return []
        answered = ask.result is not None or ask.error
        ask.poll()
        if ask.error:
            return [self._end(replace(held, sample=position), "error")]
        if ask.result is not None and not answered:
            if ask.result[0] >= self.config.threshold:
                return [self._end(replace(held, sample=position), "complete")]
            self._incomplete += 1
        if position - held.end_sample >= self._max_silence:
            return [self._end(replace(held, sample=position), "timeout")]
        return []

    def _end(self, event: SpeechEnded, reason: Reason) -> SpeechEnded:
        ask = self._ask
        p, latency = ask.result if ask is not None and ask.result is not None else (None, None)
        silence_ms = round(1000 * (event.sample - event.end_sample) / self.sample_rate, 1)
        decision = TurnDecision(reason, p, None if latency is None else round(latency, 1), self._incomplete, silence_ms)
        self.reset()
        return replace(event, end_of_turn=decision)
