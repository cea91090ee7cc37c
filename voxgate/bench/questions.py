"""The multi-sentence question set of `voxgate bench agent --questions multi` (issue 20).

The texts live in `agent_questions.toml` (in the package); the audio is made at bench time,
never committed: each sentence is synthesised alone (espeak-ng voices at several rates, and
the packaged Piper voice), cut to its own speech, and the sentences are joined by the
question's pauses of silence. Joining rather than synthesising the whole text is what makes
the inner pauses exact and known (a TTS's own pause after a full stop is ~100-300 ms and
differs by voice), so a premature end of turn can be told from a late one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voxgate.audio import decode_wav, wav_bytes
from voxgate.regress.e2e.speech import join_sentences
from voxgate.types import VoxgateError

log = logging.getLogger(__name__)

QUESTIONS_FILE = Path(__file__).with_name("agent_questions.toml")
FOLLOWUP_FILE = Path(__file__).with_name("agent_questions_followup.toml")  # a question, then more after a pause
SET_FILES = {"multi": QUESTIONS_FILE, "followup": FOLLOWUP_FILE}
KINDS = ("opener", "context", "long", "single", "followup")
PAUSE_RANGE_MS = (300, 900)  # longer than the VAD's 200 ms hangover, as people pause between sentences
LEAD_S = 0.3  # silence before the first word, as a mic sends before anyone speaks
USER_PEAK = 0.3  # the words' peak (-10 dBFS), a mic's level, as in the regression harness's calls
ESPEAK_HINT = "espeak-ng not found: install it (Debian/Ubuntu: apt-get install espeak-ng); using the Piper voice only"
_WORDS = re.compile(r"[\w']+")


class QuestionSetError(VoxgateError):
    code = "bench_question_set"


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    kind: str  # one of KINDS
    sentences: tuple[str, ...]
    pauses_ms: tuple[int, ...]  # silence between sentence i and i + 1
    expected: str  # the whole question: what a reply should answer

    @property
    def multi(self) -> bool:
        return len(self.sentences) > 1


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped: how texts and transcripts are compared."""
    return _WORDS.findall(text.lower())


def load_questions(path: Path = QUESTIONS_FILE) -> list[Question]:
    """The question set; `QuestionSetError` names the first bad entry."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise QuestionSetError(f"cannot read {path}: {exc}") from None
    questions = [_question(i, entry) for i, entry in enumerate(raw.get("question", []))]
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise QuestionSetError(f"{path}: question ids repeat")
    return questions


def _question(index: int, entry: dict[str, Any]) -> Question:
    if not all(isinstance(entry.get(k), list) for k in ("sentences", "pauses_ms")):
        raise QuestionSetError(f"question {index}: sentences and pauses_ms must be lists")
    try:
        sentences, pauses = tuple(str(s) for s in entry["sentences"]), tuple(int(p) for p in entry["pauses_ms"])
        q = Question(str(entry["id"]), str(entry["kind"]), sentences, pauses, str(entry["expected"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise QuestionSetError(f"question {index}: missing or bad field: {exc}") from None
    low, high = PAUSE_RANGE_MS
    if q.kind not in KINDS:
        raise QuestionSetError(f"{q.id}: kind {q.kind!r} is not one of {KINDS}")
    if not q.sentences or len(q.pauses_ms) != len(q.sentences) - 1:
        raise QuestionSetError(f"{q.id}: needs one pause between each two sentences")
    if any(not low <= p <= high for p in q.pauses_ms):
        raise QuestionSetError(f"{q.id}: pauses must be {low}-{high} ms, not {q.pauses_ms}")
    if words(q.expected) != words(" ".join(q.sentences)):
        raise QuestionSetError(f"{q.id}: expected is not the sentences' words")
    return q


# ---------------------------------------------------------------------------- voices


@dataclass(frozen=True, slots=True)
class Voice:
    engine: str  # "espeak" (the espeak-ng program) | "piper" (the packaged voice)
    name: str = ""  # espeak-ng voice
    rate_wpm: int = 0  # espeak-ng speed

    @property
    def label(self) -> str:
        return f"espeak:{self.name}:{self.rate_wpm}" if self.engine == "espeak" else self.engine


PIPER = Voice("piper")
# Questions take these in turn; Piper twice, so it speaks ~2 in 7. Voices nobody tuned the agent
# for: American and British, a female variant, slow and fast.
VOICES = (PIPER, Voice("espeak", "en-us", 150), Voice("espeak", "en-gb", 175), Voice("espeak", "en-us+f3", 190),
          PIPER, Voice("espeak", "en-gb-x-rp", 135), Voice("espeak", "en-us+m3", 165))  # fmt: skip


def espeak_program() -> str | None:
    return shutil.which("espeak-ng")


def available_voices() -> tuple[Voice, ...]:
    """`VOICES`, or Piper alone (with a warning saying how to install espeak-ng) without it."""
    if espeak_program() is None:
        log.warning(ESPEAK_HINT)
        return (PIPER,)
    return VOICES


Speak = Callable[[str], tuple[np.ndarray, int]]


class Speakers:
    """Sentence -> (float32 samples, rate) per voice; Piper is loaded once, on first use."""

    def __init__(self) -> None:
        self._piper: Speak | None = None

    def speak(self, voice: Voice, text: str) -> tuple[np.ndarray, int]:
        if voice.engine == "piper":
            if self._piper is None:
                from voxgate.regress.e2e.speech import piper_voice

                self._piper = piper_voice()
            return self._piper(text)
        return _espeak(voice, text)


def _espeak(voice: Voice, text: str) -> tuple[np.ndarray, int]:
    program = espeak_program()
    if program is None:
        raise QuestionSetError(ESPEAK_HINT)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.wav"
        try:  # a file, not --stdout: espeak-ng streams a WAV header with no length to a pipe
            subprocess.run([program, "-v", voice.name, "-s", str(voice.rate_wpm), "-w", str(out), text],
                           check=True, capture_output=True, timeout=60)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            raise QuestionSetError(f"espeak-ng {voice.label} failed: {exc}") from None
        return decode_wav(out.read_bytes())


# ---------------------------------------------------------------------------- recordings


@dataclass(frozen=True, slots=True)
class Recording:
    """A question as the bot says it: `LEAD_S` of silence, then the sentences and pauses;
    the audio ends with the last word."""

    question: Question
    voice: str
    samples: np.ndarray  # float32 mono
    sample_rate: int
    spans_s: tuple[tuple[float, float], ...]  # each sentence's (start, end) in the audio

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


def record(question: Question, voice: Voice, speakers: Speakers) -> Recording:
    """Synthesise each sentence with `voice`, trim it, and join them with the question's pauses
    (the regression harness's `join_sentences`, so both say multi-sentence questions alike)."""
    try:
        audio, rate, spans = join_sentences(lambda text: speakers.speak(voice, text), question.sentences,
                                            question.pauses_ms, lead_s=LEAD_S)  # fmt: skip
    except ValueError as exc:
        raise QuestionSetError(f"{question.id} ({voice.label}): {exc}") from None
    if any(end <= start for start, end in spans):
        raise QuestionSetError(f"{question.id} ({voice.label}): a synthesised sentence has no speech")
    audio *= USER_PEAK / max(float(np.max(np.abs(audio))), 1e-9)
    return Recording(question, voice.label, audio, rate, tuple(spans))


def record_all(questions: list[Question], voices: tuple[Voice, ...]) -> list[Recording]:
    """Question i spoken by voices[i % len(voices)]."""
    speakers = Speakers()
    return [record(q, voices[i % len(voices)], speakers) for i, q in enumerate(questions)]


# ---------------------------------------------------------------------------- recorded sets

MANIFEST = "recordings.json"
RECORDED_FORMAT = 1
_FILE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def write_recordings(folder: Path, recordings: list[Recording]) -> Path:
    """Recordings as 16-bit WAV files in `folder` with a manifest (each question's sentences,
    pauses, voice and spans), for a machine that cannot make them (no espeak-ng or Piper there):
    `RecordedSet(folder)` reads them back. Returns the manifest's path."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for rec in recordings:
        q = rec.question
        name = _FILE_NAME.sub("_", f"{q.id}--{rec.voice}") + ".wav"
        (folder / name).write_bytes(wav_bytes(rec.samples, rec.sample_rate))
        entries.append({"file": name, "id": q.id, "kind": q.kind, "sentences": list(q.sentences),
                        "pauses_ms": list(q.pauses_ms), "expected": q.expected, "voice": rec.voice,
                        "spans_s": [list(s) for s in rec.spans_s]})  # fmt: skip
    if len({e["id"] for e in entries}) != len(entries):
        raise QuestionSetError("a recorded set holds each question once")
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"format": RECORDED_FORMAT, "recordings": entries}, indent=1) + "\n")
    return manifest


class RecordedSet:
    """The recordings `write_recordings` left in a folder, by question id. `get(question)`
    refuses a recording of other words or pauses than the question's (a set recorded before
    the question file changed): `QuestionSetError`, as for a missing or unreadable file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        try:
            raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            if raw.get("format") != RECORDED_FORMAT:
                raise QuestionSetError(f"{folder / MANIFEST}: format {raw.get('format')!r}, not {RECORDED_FORMAT}")
            self._entries = {str(e["id"]): e for e in raw["recordings"]}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise QuestionSetError(f"no readable recorded question set in {folder}: {exc}") from None

    def __contains__(self, question_id: str) -> bool:
        return question_id in self._entries

    def get(self, question: Question) -> Recording:
        entry = self._entries.get(question.id)
        if entry is None:
            raise QuestionSetError(f"{self.folder} has no recording of {question.id!r}; record the set again")
        if tuple(entry["sentences"]) != question.sentences or tuple(entry["pauses_ms"]) != question.pauses_ms:
            raise QuestionSetError(f"{self.folder}: {question.id!r} was recorded with other words or pauses; "
                                   "record the set again")  # fmt: skip
        name = str(entry["file"])
        if _FILE_NAME.search(name):  # the manifest names files in this folder only
            raise QuestionSetError(f"{self.folder}: bad file name {name!r} in the manifest")
        try:
            samples, rate = decode_wav((self.folder / name).read_bytes())
        except (OSError, VoxgateError) as exc:
            raise QuestionSetError(f"{self.folder / name}: {exc}") from None
        spans = tuple((float(a), float(b)) for a, b in entry["spans_s"])
        return Recording(question, str(entry["voice"]), samples, rate, spans)
