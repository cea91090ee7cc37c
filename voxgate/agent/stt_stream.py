"""Streaming speech to text: transcribe while the user speaks, so that at the end of the turn
only the tail is left to decode.

While the VAD is in speech the driver offers the audio heard so far (`StreamingStt.offer`).
Every `partial_s` of new audio, and at once when the voice pauses, one *partial* decode of
the audio not yet committed runs on the executor, never two at once: an offer while one runs
is skipped, so streaming costs at most one decode's worth of CPU at a time per call.

Partial hypotheses go through `LocalAgreement` (the LocalAgreement-2 policy of Macháček et
al., "Turning Whisper into Real-Time Transcription System", 2023): words that two consecutive
hypotheses agree on are committed, and the audio before the last committed word is never
decoded again. At the end of the turn (`finish`) the partial in flight is awaited (the model
runs one decode at a time anyway); if it already heard the whole utterance, its hypothesis is
the transcript and nothing is left to decode, else only the tail after the committed words is.

Why whole words and not a time grid: whisper's encoder always reads a 30 s window (~340 ms
for tiny.en on 2 cores, whatever the audio's length), so what a shorter decode saves is the
decoder's tokens and the wait for the partial in flight; the bigger saving is the partial that
starts when the voice pauses, which has usually heard the whole turn when the hangover ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from voxgate.agent.stt import STT_RATE, Word, WordTranscriber
from voxgate.types import VoxgateError

log = logging.getLogger(__name__)
_NOT_WORD = re.compile(r"[^\w']+")
MAX_OVERLAP = 3  # words a hypothesis may repeat from the end of the committed text
_W = TypeVar("_W", str, Word)


def normalise(word: str) -> str:
    """A word as hypotheses are compared: lower case, no punctuation ("World?" == "world")."""
    return _NOT_WORD.sub("", word.lower())


@dataclass(slots=True)
class LocalAgreement:
    """Hypotheses in, committed words out (pure: no model, no clock). Word times are seconds
    from the start of the utterance."""

    committed: list[Word] = field(default_factory=list)
    pending: list[Word] = field(default_factory=list)  # the latest hypothesis past the committed words

    @property
    def cut_s(self) -> float:
        """Where the audio still to decode starts: the start of the last committed word, so that
        word is heard whole again (and dropped as overlap) instead of cut at a guessed end."""
        return self.committed[-1].start_s if self.committed else 0.0

    def insert(self, hypothesis: Sequence[Word]) -> int:
        """A hypothesis of the audio from `cut_s` on; commits the words it shares with the
        previous one, from the first; returns how many it committed."""
        fresh = after_overlap([w.text for w in self.committed], [w for w in hypothesis if normalise(w.text)])
        agreed = 0
        for old, new in zip(self.pending, fresh, strict=False):
            if normalise(old.text) != normalise(new.text):
                break
            agreed += 1
        self.committed += fresh[:agreed]
        self.pending = fresh[agreed:]
        return agreed

    def text(self, tail: str | None = None) -> str:
        """The committed words, then `tail` (a decode of the audio from `cut_s` on), or else the
        latest hypothesis's uncommitted words."""
        rest = self.pending if tail is None else after_overlap([w.text for w in self.committed], tail.split())
        words = [w.text.strip() for w in self.committed] + [w if isinstance(w, str) else w.text.strip() for w in rest]
        return " ".join(w for w in words if w)


def after_overlap(committed: Sequence[str], words: list[_W]) -> list[_W]:
    """`words` without the leading ones that repeat the end of `committed` (up to `MAX_OVERLAP`)."""
    for k in range(min(MAX_OVERLAP, len(committed), len(words)), 0, -1):
        head = [normalise(w if isinstance(w, str) else w.text) for w in words[:k]]
        if head == [normalise(w) for w in committed[-k:]]:
            return words[k:]
    return words


@dataclass(frozen=True, slots=True)
class FinalTranscript:
    """One utterance's transcript and what producing it cost after the end of the turn."""

    text: str
    audio_s: float  # the utterance
    tail_audio_s: float  # the tail: the audio after the committed words, decoded as a whole
    early: bool  # the tail was decoded in the pause before the end of turn, not after it
    tail_s: float  # from `finish` to the transcript: the partial in flight, then the tail decode if not early
    partials: int  # partial decodes run during the utterance
    committed_words: int


class StreamingStt:
    """One utterance's streaming transcription, for the asyncio driver of a call.

    `audio(lo, hi)` returns the call's 16 kHz mic samples `[lo, hi)` (absolute sample indices,
    the VAD's timeline); `start` is the utterance's first sample.
    """

    def __init__(
        self, transcriber: WordTranscriber, executor: Executor | None, audio: Callable[[int, int], np.ndarray],
        start: int, partial_s: float = 0.7, language: str | None = None,
    ) -> None:  # fmt: skip
        self.transcriber, self.executor, self.audio = transcriber, executor, audio
        self.start, self.language = start, language
        self.agreement = LocalAgreement()
        self.partials = 0
        self.max_in_flight = 0  # the most partial decodes of this utterance ever running at once
        self._partial = max(1, round(partial_s * STT_RATE))
        self._min_new = STT_RATE // 4  # a pause decodes at once, if it brings this much new audio
        # A dip between two words is not a pause: a decode it started would still hold the model
        # when the turn ends (seen at load 5 on 2 cores). 96 ms still leaves ~130 ms of the hangover.
        self._min_pause = round(0.096 * STT_RATE)
        self._paused_at: int | None = None
        self._pause_heard = False  # a partial started during this pause: more would hear only silence
        self._task: asyncio.Task[None] | None = None
        self._offered_to = start  # the end of the audio the latest partial was given
        self._early: tuple[int, int, str] | None = None  # a pause's decode of [cut, hi): its text
        self._running = 0
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def cut(self) -> int:
        """The first sample not committed (as an absolute index)."""
        return self.start + round(self.agreement.cut_s * STT_RATE)

    def offer(self, now: int, pause: bool = False) -> bool:
        """Audio up to sample `now` is in; starts a partial decode if one is due and none is
        running. `pause`: the voice has paused (the VAD's hangover runs, or a turn model holds
        the pause open): one partial as soon as the model is free, then none until the voice
        is back."""
        if pause and self._paused_at is None:
            self._paused_at, self._pause_heard = now, False
        elif not pause:
            self._paused_at = None
        new = now - self._offered_to
        if self._paused_at is None:
            due = new >= self._partial
        else:
            due = not self._pause_heard and new >= self._min_new and now - self._paused_at >= self._min_pause
        if self.busy or not due:
            return False
        self._pause_heard = pause
        self._offered_to = now
        decode = self._decode_pause if pause else self._decode_partial
        self._task = asyncio.get_running_loop().create_task(decode(self.cut, now))
        return True

    async def settle(self) -> None:
        """Until the partial decode in flight, if any, is done."""
        if self._task is not None:
            await self._task

    async def finish(self, end: int) -> FinalTranscript:
        """The utterance is `[start, end)`: its transcript, decoding only what no partial heard."""
        t0 = time.perf_counter()
        await self.settle()  # the model decodes one thing at a time: its result is worth having
        lo, early = self.cut, self._early
        if early is not None and early[0] == lo and early[1] >= end:  # the pause's decode heard the rest
            text, hi = self.agreement.text(early[2]), early[1]
        else:
            pcm, hi = self.audio(lo, end), end
            loop = asyncio.get_running_loop()
            heard = await loop.run_in_executor(self.executor, self._text, pcm, False)
            text, early = self.agreement.text(heard), None
        return FinalTranscript(text, (end - self.start) / STT_RATE, (hi - lo) / STT_RATE, early is not None,
                               time.perf_counter() - t0, self.partials, len(self.agreement.committed))  # fmt: skip

    def close(self) -> None:
        """The call ended: drop the partial in flight (its executor thread finishes on its own)."""
        if self._task is not None:
            self._task.cancel()

    async def _decode_partial(self, lo: int, hi: int) -> None:
        pcm = self.audio(lo, hi)
        try:
            words = await asyncio.get_running_loop().run_in_executor(self.executor, self._words, pcm)
        except VoxgateError as exc:  # a partial is an optimisation: the end of turn decodes anyway
            log.warning("partial transcription failed: %s", exc.message)
            return
        offset = (lo - self.start) / STT_RATE
        self.agreement.insert([Word(w.text, w.start_s + offset, w.end_s + offset) for w in words])

    async def _decode_pause(self, lo: int, hi: int) -> None:
        """The tail decode, started in a pause in case it is the end of the turn: without word
        times (they cost ~40% more), so it commits nothing if the voice comes back."""
        pcm = self.audio(lo, hi)
        try:
            heard = await asyncio.get_running_loop().run_in_executor(self.executor, self._text, pcm)
        except VoxgateError as exc:
            log.warning("early tail transcription failed: %s", exc.message)
            return
        self._early = (lo, hi, heard)

    def _words(self, pcm: np.ndarray) -> list[Word]:
        with self._counted():
            return self.transcriber.transcribe_words(pcm, STT_RATE, self.language, self._prompt())

    def _text(self, pcm: np.ndarray, partial: bool = True) -> str:
        """The tail's text, heard after the committed words (as the whole turn's decode hears it)."""
        with self._counted() if partial else contextlib.nullcontext():
            return self.transcriber.transcribe_after(pcm, STT_RATE, self._prompt(), self.language)

    def _prompt(self) -> str:
        return " ".join(w.text.strip() for w in self.agreement.committed[:-1])  # the last one is heard again

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """Around a partial decode, on its executor thread: counts the decodes running at once."""
        with self._lock:
            self._running += 1
            self.partials += 1
            self.max_in_flight = max(self.max_in_flight, self._running)
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
