"""The duplex turn controller of a voice call, as a pure state machine (no I/O, no clock).

The driver feeds it events (`handle(event)`), each stamped with the driver's monotonic time,
and carries out the returned actions in order. A *turn* is one user utterance and the reply
to it; everything about it (transcript parts, reply segments, audio published, trace marks)
lives in one `Turn` object, dropped as a whole when the turn ends. Its `trace_id` goes out
with every action (`StartStt`, `StartReply`, ...) and must come back with every event about
it, so an event for a turn that is gone is recognised and ignored.

States, derived from the turns held (so they cannot disagree with them):

- LISTENING: no reply is live. The user may be speaking, or the turn may wait for its
  transcripts (one per stretch of speech: a pause longer than the VAD's hangover and more
  speech make two parts of one turn). The reply starts once the user has stopped and every
  part is transcribed; an empty transcript drops the turn (no reply).
- THINKING: the reply was started (LLM asked), none of its audio is published yet.
- SPEAKING: the reply's audio is being published.
- INTERRUPTING: the user speaks (or spoke) over a live reply. The reply goes on, not ducked,
  until the interruption is decided; then it is back to THINKING/SPEAKING, or cancelled.

Barge-in is confirmed, never guessed: speech over a reply that ends within
`min_interruption_s` is dropped untranscribed (a cough, a click); longer speech is
transcribed, and a transcript with a word outside `backchannels` confirms the interruption,
while an empty or backchannel-only one ("uh-huh", "yeah") drops it. Speech still going after
`confirm_after_s` confirms without waiting for words. A confirmed interruption ends the live
reply: `FlushAudio` (silence first), then `CancelReply` (LLM and TTS), and the new speech
becomes the turn. The reply also ends normally when its playout finishes first; speech that
began over it keeps the same rules.

A reply is never audible sooner than a gap after the user's last voiced audio, nor while the
VAD hears voice it has not yet confirmed as speech (`VoiceHeard`): its audio is held
(`HoldAudio`). A pause inside a question ("The leaves are turning yellow. [800 ms] What am I
doing wrong?") can end the turn and start a reply within that pause; the user going on then
finds the reply unheard. Speech over a reply nobody has heard yet holds its audio until the
speech is decided (the rules above); an interruption then cancels it unheard, and its words
join the new turn: one reply to the whole question.

The gap depends on how finished the turn sounds in words, chosen when its reply starts
(`gap_for`, kept in the trace as `gap_ms` and `gap_reason`): a turn whose transcript ends as a
question ("?", which whisper writes) and is not only openers and acknowledgements ("Okay?")
gets `question_gap_s` (0.6 s); any other turn `min_gap_s` (1 s). "End of turn" comes ~0.3-0.5 s
after the last voice (the hangover and the turn model), so the long gap alone keeps a reply
0.5-0.7 s past the end of turn however fast the engine is; the short one ~0.1-0.3 s. The rule
from the 44-question set (`voxgate bench agent --questions multi`, eight runs, 410 replies):
340 of the 352 transcripts that got the answering reply end in "?" (the 12 others: whisper
wrote a statement, "I often show that I replace my running shoes."), and none of the 58
transcripts of replies started at a pause inside a question do (those end at an opener or a
statement: "I have six eggs in the fridge."). The turn model's probability adds nothing: inner
pauses scored 0.77-0.99, the answering ends it judged complete 0.5-0.99 (and below 0.5 it had
judged the pause unfinished: the turn ended 1.5 s after the voice, past any gap). The cost is speech the set
lacks, a question followed by more after a pause ("What should I cook? [700 ms] I have eggs and
rice."): the first question's reply is held only for a pause shorter than the short gap less
the onset's detection (~0.55 s) or than the reply takes to be ready; past both (a GPU answers
within ~0.3 s of the end of turn) its start is heard, and the rest is a barge-in whose words
are the next turn, with what was heard in the history. On a 2-core CPU a reply is rarely ready
within 1 s of the voice (end of turn -> first TTS audio p50 ~1 s), so there the rule changes
little.

History holds only what was heard: the reply's segments whose audio was published, all of
a completed reply, and after a cut the last one only if `heard_min_s` of it was played. When
nothing of a reply was heard, its user words are carried into the next turn's request
instead (the user who speaks again while the agent thinks was not done talking).

Notifications (`Notify`, for the call's data channel), each with the turn's trace_id:
turn.start, turn.end, transcript {text}, reply.start, reply.end {status, heard}, turn.dropped
{reason}; with `detail_events` also reply.segment {index, text} when a segment's audio starts
being published, and turn.trace {status, marks} when a turn ends (marks in ms from vad_end;
none for a turn whose speech never ended).

Events that lose a race (a transcript or LLM delta for a turn already cancelled, a playout
done for a cut reply, a speech end with no start, anything after the call ended) are
ignored and counted in `ignored` by reason; impossible values (a negative duration) raise
`ControllerError` where the event is made, and a non-event raises it in `handle`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from voxgate.bridge.llm import Conversation
from voxgate.types import VoxgateError

if TYPE_CHECKING:
    from voxgate.agent.turn import TurnDecision

# The marks of a TurnTrace, in their usual order (audio_released: only after a HoldAudio).
MARKS = ("vad_start", "vad_end", "stt_done", "llm_first_token", "first_segment", "tts_first_audio",
         "audio_released", "first_frame_published", "playout_done", "cancel")  # fmt: skip
BACKCHANNELS = frozenset({"uh-huh", "mm-hmm", "uh", "huh", "um", "hm", "hmm", "mm", "mhm", "ah", "oh",
                          "yeah", "yes", "yep", "ok", "okay", "right", "sure", "嗯", "嗯嗯", "对", "好"})  # fmt: skip
# Words that open a question but are not one: a turn of these alone ("Hi there.", "Okay. So,",
# "Hmm, well,") waits `opener_hold_s` for the question (a pause after them is not its end).
OPENERS = frozenset({"hi", "hello", "hey", "there", "okay", "ok", "so", "well", "hmm", "hm", "um", "uh", "erm",
                     "oh", "ah", "yeah", "right", "alright", "now", "and", "but", "also", "then"})  # fmt: skip
# Fillers that stall for time ("Um, let me think."): an opener too, whatever their words.
FILLERS = re.compile(r"\b(?:let me (?:think|see)|let's see|you know|i mean)\b")
# Phrases that acknowledge or close without asking ("Okay, thanks.", "Alright, cool.", "Got it,
# so"): whisper and the turn model hear a finished turn, yet a question often follows them; an
# opener too. A closing "Thanks!" alone is still answered, `opener_hold_s` later.
ACKNOWLEDGEMENTS = re.compile(
    r"\b(?:thanks(?: a lot| so much)?|thank you(?: so much| very much)?|cheers|got it|gotcha|i see|understood"
    r"|makes sense|fair enough|sounds good|no worries|all right|cool|great|perfect|awesome|nice|good|fine)\b"
)
_WORD = re.compile(r"[\w'-]+")
_QUESTION_END = re.compile(r"[?？][?？!！]*[\s\"'”’»)\]」』]*$")


class ControllerError(VoxgateError):
    code = "agent_bad_event"


class State(StrEnum):
    LISTENING = "listening"
    THINKING = "thinking"
    SPEAKING = "speaking"
    INTERRUPTING = "interrupting"


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    min_interruption_s: float = 0.3  # speech over a reply shorter than this never interrupts
    confirm_after_s: float = 0.8  # speech over a reply this long interrupts without its words
    heard_min_s: float = 0.2  # a cut segment counts as heard once this much of it was played
    stall_s: float = 20.0  # a turn with no event for this long is ended (on a Tick)
    backchannels: frozenset[str] = BACKCHANNELS
    openers: frozenset[str] = OPENERS
    # A turn that is only an opener waits this long after its speech ended for more (on a Tick):
    # the VAD and the turn model hear "Hi there." as finished; its words say the question follows.
    opener_hold_s: float = 1.2
    # A reply is not audible sooner than this after the user's last voiced audio (its audio is
    # held): a pause inside a question is often 300-900 ms, and speech resuming within the gap
    # finds the reply unheard, so it is cancelled and its words join the question.
    min_gap_s: float = 1.0
    # The gap for a turn that ends as a question (see the module's docstring), never above min_gap_s:
    # a pause after a finished question is rarely the middle of one.
    question_gap_s: float = 0.6
    # Voice the VAD hears, not yet confirmed as speech (`VoiceHeard`), holds an unheard reply this
    # long after it was last heard: speech is confirmed only after ~250 ms of it.
    onset_wait_s: float = 0.1
    # Also notify `reply.segment` and `turn.trace` (what a live page shows); off, the events are
    # only the turn protocol, which bots and scripted tests follow message by message.
    detail_events: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.min_interruption_s <= self.confirm_after_s or min(self.heard_min_s, self.stall_s) < 0:
            raise ValueError("need 0 <= min_interruption_s <= confirm_after_s, heard_min_s >= 0, stall_s >= 0")
        if min(self.min_gap_s, self.question_gap_s, self.onset_wait_s, self.opener_hold_s) < 0:
            raise ValueError("need min_gap_s, question_gap_s, onset_wait_s, opener_hold_s >= 0")


def has_words(text: str, backchannels: frozenset[str] = BACKCHANNELS) -> bool:
    """True when `text` says something beyond backchannels ("uh-huh", "ok") and punctuation."""
    return any(word.strip("'-") not in backchannels for word in _WORD.findall(text.lower()))


def ends_as_question(text: str) -> bool:
    """True when `text`'s last sentence is a question: it ends in "?" (or "？", "?!"), closing
    quotes and brackets aside."""
    return _QUESTION_END.search(text) is not None


# ---------------------------------------------------------------------------- events


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ControllerError(message)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    at: float  # VAD: the user started speaking


@dataclass(frozen=True, slots=True)
class SpeechEnded:
    at: float  # VAD: the user stopped (after the hangover): end of turn
    end_of_turn: TurnDecision | None = None  # how the turn model decided it, if one did
    voice_end: float | None = None  # when the last voiced audio ended (before the hangover); None: `at`

    def __post_init__(self) -> None:
        _check(self.voice_end is None or self.voice_end <= self.at, "voice_end must not be after the speech end")


@dataclass(frozen=True, slots=True)
class VoiceHeard:
    at: float  # VAD: voice it has not (yet) confirmed as speech; maybe the user going on


@dataclass(frozen=True, slots=True)
class Transcript:
    trace_id: str
    part: int  # from StartStt
    text: str  # final; may be empty
    at: float

    def __post_init__(self) -> None:
        _check(self.part >= 0, f"transcript part must be >= 0, not {self.part}")


@dataclass(frozen=True, slots=True)
class LlmDelta:
    trace_id: str
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class LlmDone:
    trace_id: str
    at: float


@dataclass(frozen=True, slots=True)
class LlmFailed:
    trace_id: str
    error: str
    at: float


@dataclass(frozen=True, slots=True)
class SegmentStarted:
    trace_id: str
    index: int  # the segmenter's index; policy "latest" may skip some
    text: str
    at: float

    def __post_init__(self) -> None:
        _check(self.index >= 0, f"segment index must be >= 0, not {self.index}")


@dataclass(frozen=True, slots=True)
class TtsFirstAudio:
    trace_id: str
    at: float  # the engine's first audio of the reply reached the driver


@dataclass(frozen=True, slots=True)
class AudioSent:
    trace_id: str
    segment: int
    duration_s: float  # audio of `segment` published on the track
    at: float

    def __post_init__(self) -> None:
        _check(self.duration_s >= 0, f"audio duration must be >= 0, not {self.duration_s}")


@dataclass(frozen=True, slots=True)
class PlayoutDone:
    trace_id: str
    at: float  # the reply's last frame was published (the reply was not cancelled)


@dataclass(frozen=True, slots=True)
class Tick:
    at: float


@dataclass(frozen=True, slots=True)
class CallEnded:
    at: float


Event = (SpeechStarted | SpeechEnded | VoiceHeard | Transcript | LlmDelta | LlmDone | LlmFailed | SegmentStarted
         | TtsFirstAudio | AudioSent | PlayoutDone | Tick | CallEnded)  # fmt: skip


_REPLY_EVENTS = (LlmDelta, LlmDone, LlmFailed, SegmentStarted, TtsFirstAudio, AudioSent, PlayoutDone)

# ---------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class TurnTrace:
    trace_id: str
    status: str  # completed | failed | interrupted | stalled | ended | dropped: empty/short/backchannel
    user: str
    heard: str
    marks: dict[str, float]
    error: str | None = None
    end_of_turn: TurnDecision | None = None  # the turn model's verdict on the user's last pause
    gap_ms: float | None = None  # the gap its reply's audio kept after the user's voice (None: no reply)
    gap_reason: str | None = None  # why: question | statement | opener


@dataclass(frozen=True, slots=True)
class StartStt:
    trace_id: str
    part: int  # transcribe the speech that just ended; answer Transcript(trace_id, part, ...)


@dataclass(frozen=True, slots=True)
class StartReply:
    trace_id: str
    messages: tuple[dict[str, str], ...]  # chat-completions history ending with the user turn


@dataclass(frozen=True, slots=True)
class FlushAudio:
    trace_id: str  # drop the reply's audio queued for the track, now


@dataclass(frozen=True, slots=True)
class HoldAudio:
    """Publish none of the reply's audio while `hold` (it stays queued), or go on: none of it
    was heard yet, and the user may still be talking (within the turn's gap after their last voice,
    voice heard, or speech over it not yet decided)."""

    trace_id: str
    hold: bool


@dataclass(frozen=True, slots=True)
class CancelReply:
    trace_id: str  # stop the reply's LLM stream and every TTS stream
    reason: str


@dataclass(frozen=True, slots=True)
class Notify:
    message: dict[str, Any]  # for the data channel


@dataclass(frozen=True, slots=True)
class Mark:
    trace_id: str
    name: str
    at: float


@dataclass(frozen=True, slots=True)
class TraceDone:
    trace: TurnTrace


Action = StartStt | StartReply | FlushAudio | HoldAudio | CancelReply | Notify | Mark | TraceDone


# ---------------------------------------------------------------------------- the controller


@dataclass(slots=True)
class Turn:
    trace_id: str
    over_reply: bool  # began over a live reply and not yet confirmed as an interruption
    touched: float  # time of its last event (stall watchdog)
    speaking_since: float | None = None
    voice_end: float = float("-inf")  # when its last voiced audio ended
    parts: list[str | None] = field(default_factory=list)  # transcripts; None while pending
    user: str = ""  # the user text the reply answers (carried words included)
    replying: bool = False
    published: bool = False
    held: bool = False  # speech came over it before any of its audio was published: none is, until decided
    llm_done: bool = False
    error: str | None = None
    segments: dict[int, str] = field(default_factory=dict)
    played: dict[int, float] = field(default_factory=dict)  # seconds published per segment
    marks: dict[str, float] = field(default_factory=dict)
    end_of_turn: TurnDecision | None = None
    gap_s: float = 0.0  # set when its reply starts (`gap_for`)
    gap_reason: str | None = None

    def text(self) -> str:
        return " ".join(p for p in self.parts if p)

    def heard(self, cut: bool, heard_min_s: float) -> str:
        played = [i for i in sorted(self.played) if self.played[i] > 0]
        if cut and played and self.played[played[-1]] < heard_min_s:
            played.pop()
        return " ".join(self.segments[i] for i in played)


class DuplexController:
    """One call's turn-taking: `handle(event) -> actions`; `state`, `ignored` (by reason) to observe."""

    def __init__(self, config: ControllerConfig | None = None, conversation: Conversation | None = None,
                 call_id: str = "call") -> None:  # fmt: skip
        self.config = config or ControllerConfig()
        self.conversation = conversation or Conversation()
        self.call_id = call_id
        self.turn: Turn | None = None  # the turn being heard (LISTENING) or answered
        self.pending: Turn | None = None  # speech over the live reply, not yet decided
        self.ignored: Counter[str] = Counter()
        self.ended = False
        self._carry = ""  # user words of a reply nobody heard
        self._holding: str | None = None  # the reply whose audio is held (HoldAudio)
        self._voice_at = float("-inf")  # the last VoiceHeard
        self._count = 0
        self._out: list[Action] = []

    @property
    def state(self) -> State:
        if self.pending is not None:
            return State.INTERRUPTING
        if self.turn is not None and self.turn.replying:
            return State.SPEAKING if self.turn.published else State.THINKING
        return State.LISTENING

    def handle(self, event: Event) -> list[Action]:
        """Apply one event; returns the actions to carry out, in order."""
        self._out = []
        if self.ended:
            self._ignore("call_ended")
            return []
        match event:
            case SpeechStarted(at=at):
                self._speech_started(at)
            case SpeechEnded(at=at):
                self._speech_ended(at, event.end_of_turn, at if event.voice_end is None else event.voice_end)
            case VoiceHeard(at=at):
                self._voice_at = max(self._voice_at, at)
            case Tick(at=at):
                self._tick(at)
            case CallEnded(at=at):
                self._call_ended(at)
            case Transcript():
                self._transcript(event)
            case _ if isinstance(event, _REPLY_EVENTS):
                turn = self.turn
                if turn is None or not turn.replying or turn.trace_id != event.trace_id:
                    self._ignore("stale_reply_event")
                else:
                    turn.touched = max(turn.touched, event.at)
                    self._reply_event(turn, event)
            case _:
                raise ControllerError(f"not a controller event: {event!r}")
        self._hold_or_release(event.at)
        return self._out

    def _hold_or_release(self, at: float) -> None:
        """A reply nobody has heard yet is not heard while the user may still be talking: the
        user going on after a pause ("I'm learning Spanish. [pause] How do I practise?") then
        interrupts a reply that was never audible, whose words join the question (`_end_reply`)."""
        turn = self.turn
        want = turn.trace_id if turn is not None and turn.replying and self._must_wait(turn, at) else None
        if want != self._holding:
            if self._holding is not None:
                self._out.append(HoldAudio(self._holding, False))
                if turn is not None and turn.trace_id == self._holding:  # the track's delay counts from here
                    self._mark(turn, "audio_released", at, first=False)
            if want is not None:
                self._out.append(HoldAudio(want, True))
            self._holding = want
        if turn is not None and self.pending is None:
            turn.held = False

    def release_at(self) -> float | None:
        """When the audio held now goes out by the clock alone (the gap after the user's last
        voice, or the wait after voice not yet confirmed as speech), so a driver can tick then
        rather than up to a tick later; None when nothing is held, or it waits for speech over
        it to be judged (an event, not the clock, ends that)."""
        turn, cfg = self.turn, self.config
        if self._holding is None or turn is None or turn.trace_id != self._holding or turn.published:
            return None
        if turn.held and self.pending is not None:
            return None
        return max(turn.voice_end + turn.gap_s, self._voice_at + cfg.onset_wait_s)

    def _must_wait(self, turn: Turn, at: float) -> bool:
        if turn.published:
            return False
        cfg = self.config
        undecided = turn.held and self.pending is not None  # speech over it, not yet judged
        return undecided or at < turn.voice_end + turn.gap_s or at < self._voice_at + cfg.onset_wait_s

    def gap_for(self, text: str) -> tuple[float, str]:
        """The gap a reply to `text` keeps after the user's last voice, and why (the rule and its
        numbers: the module's docstring)."""
        cfg = self.config
        if not ends_as_question(text):
            return cfg.min_gap_s, "statement"
        if self._opener_only(text):  # "Okay?", "Right?": a question may still follow
            return cfg.min_gap_s, "opener"
        return min(cfg.question_gap_s, cfg.min_gap_s), "question"

    # ------------------------------------------------------------------ the user

    def _speech_started(self, at: float) -> None:
        live = self.turn is not None and self.turn.replying
        turn = self.pending if live else self.turn
        if turn is not None and turn.speaking_since is not None:
            return self._ignore("speech_already_started")
        if turn is None:
            self._count += 1
            turn = Turn(f"{self.call_id}-{self._count}", over_reply=live, touched=at)
            if live:
                self.pending = turn
                assert self.turn is not None
                self.turn.held = not self.turn.published
            else:
                self.turn = turn
            self._notify("turn.start", turn)
        turn.speaking_since, turn.touched = at, max(turn.touched, at)
        self._mark(turn, "vad_start", at)

    def _speech_ended(self, at: float, end_of_turn: TurnDecision | None, voice_end: float) -> None:
        turn = self.pending if self.pending is not None else self.turn
        if turn is None or turn.speaking_since is None:
            return self._ignore("speech_end_without_start")
        turn.end_of_turn = end_of_turn or turn.end_of_turn
        turn.voice_end = max(turn.voice_end, voice_end)
        spoke, turn.speaking_since, turn.touched = at - turn.speaking_since, None, max(turn.touched, at)
        if turn.over_reply and spoke < self.config.min_interruption_s:
            return self._advance(turn, at)  # too short to be an interruption: not even transcribed
        self._mark(turn, "vad_end", at, first=False)
        self._notify("turn.end", turn)
        turn.parts.append(None)
        self._out.append(StartStt(turn.trace_id, len(turn.parts) - 1))
        if turn.over_reply and spoke >= self.config.confirm_after_s:
            self._confirm(turn, at)

    def _transcript(self, event: Transcript) -> None:
        turn = next((t for t in (self.turn, self.pending) if t is not None and t.trace_id == event.trace_id), None)
        if turn is None or event.part >= len(turn.parts) or turn.parts[event.part] is not None:
            return self._ignore("stale_transcript")
        turn.parts[event.part], turn.touched = event.text.strip(), max(turn.touched, event.at)
        self._mark(turn, "stt_done", event.at, first=False)
        self._notify("transcript", turn, text=event.text.strip())
        self._advance(turn, event.at)

    def _advance(self, turn: Turn, at: float) -> None:
        """After `turn` changed: confirm or drop it as an interruption, or start its reply."""
        if turn.over_reply and any(p and has_words(p, self.config.backchannels) for p in turn.parts):
            return self._confirm(turn, at)  # comes back here with over_reply off
        if turn.speaking_since is not None or None in turn.parts or turn.replying:
            return
        if turn.over_reply:
            self._drop(turn, "backchannel" if _WORD.search(turn.text()) else "empty" if turn.parts else "short")
        elif not _WORD.search(turn.text()):  # nothing but silence or punctuation ("...")
            self._drop(turn, "empty")
        elif self._opener_only(turn.text()) and at - turn.marks["vad_end"] < self.config.opener_hold_s:
            return  # an opener alone: the question may follow (a Tick comes back here)
        else:  # a confirmed turn is always self.turn (confirming promotes it)
            turn.user, self._carry = " ".join(filter(None, (self._carry, turn.text()))), ""
            turn.replying = True
            turn.gap_s, turn.gap_reason = self.gap_for(turn.user)
            self._out.append(StartReply(turn.trace_id, tuple(self.conversation.messages(turn.user))))
            self._notify("reply.start", turn)

    def _opener_only(self, text: str) -> bool:
        """Only openers, fillers and acknowledgements: words that come before a question."""
        rest = ACKNOWLEDGEMENTS.sub(" ", FILLERS.sub(" ", text.lower()))
        return not has_words(rest, self.config.openers)

    def _confirm(self, turn: Turn, at: float) -> None:
        turn.over_reply = False
        if turn is self.pending and self.turn is not None:
            self._end_reply(self.turn, "interrupted", at, cut=True)  # promotes and advances `turn`
        else:
            self._advance(turn, at)

    # ------------------------------------------------------------------ the reply

    def _reply_event(self, turn: Turn, event: Event) -> None:
        match event:
            case LlmDelta() if turn.llm_done:
                self._ignore("delta_after_llm_done")
            case LlmDelta():
                self._mark(turn, "llm_first_token", event.at)
            case LlmDone():
                turn.llm_done = True
            case LlmFailed():
                turn.llm_done, turn.error = True, event.error
            case SegmentStarted() if event.index in turn.segments:
                self._ignore("duplicate_segment")
            case SegmentStarted():
                turn.segments[event.index] = event.text.strip()
                self._mark(turn, "first_segment", event.at)
            case TtsFirstAudio():
                self._mark(turn, "tts_first_audio", event.at)
            case AudioSent() if event.segment not in turn.segments:
                self._ignore("audio_for_unknown_segment")
            case AudioSent():
                if event.segment not in turn.played and self.config.detail_events:  # it starts being heard
                    self._notify("reply.segment", turn, index=event.segment, text=turn.segments[event.segment])
                turn.played[event.segment] = turn.played.get(event.segment, 0.0) + event.duration_s
                turn.published = True
                self._mark(turn, "first_frame_published", event.at)
            case PlayoutDone():
                self._mark(turn, "playout_done", event.at)
                self._end_reply(turn, "failed" if turn.error else "completed", event.at, cut=False)

    def _end_reply(self, turn: Turn, status: str, at: float, cut: bool) -> None:
        """The live reply is over; a cut one is silenced and cancelled first."""
        if cut:
            self._out += [FlushAudio(turn.trace_id), CancelReply(turn.trace_id, status)]
            self._mark(turn, "cancel", at)
        heard = turn.heard(cut, self.config.heard_min_s)
        if heard:
            self.conversation.record(turn.user, heard)
        elif status != "failed":  # nothing heard: the words join the next turn (not after a failure,
            self._carry = turn.user  # which more words would not fix and would only make longer)
        self._notify("reply.end", turn, status=status, heard=heard)
        self._finish(turn, status, heard)
        waiting, self.pending = self.pending, None
        if waiting is not None:  # speech over the reply becomes the turn, its rules unchanged
            self.turn = waiting
            self._advance(waiting, at)

    # ------------------------------------------------------------------ time and the end

    def _tick(self, at: float) -> None:
        pending, confirm_s = self.pending, self.config.confirm_after_s
        if pending is not None and pending.speaking_since is not None and at - pending.speaking_since >= confirm_s:
            self._confirm(pending, at)
        turn = self.turn
        if turn is not None and not turn.replying and not turn.over_reply and turn.parts:
            self._advance(turn, at)  # an opener's hold may be over
        for turn in (self.pending, self.turn):
            if turn is not None and turn.speaking_since is None and at - turn.touched >= self.config.stall_s:
                self._end_reply(turn, "stalled", at, cut=True) if turn.replying else self._drop(turn, "stalled")

    def _call_ended(self, at: float) -> None:
        if self.turn is not None and self.turn.replying:
            self._end_reply(self.turn, "ended", at, cut=True)  # silence first; speech over it becomes the turn
        if self.turn is not None:
            self._drop(self.turn, "ended")
        self.ended = True

    # ------------------------------------------------------------------ helpers

    def _drop(self, turn: Turn, reason: str) -> None:
        """A turn that gets no reply (empty, a false interruption, the call ended)."""
        self._notify("turn.dropped", turn, reason=reason)
        self._finish(turn, reason, "")

    def _finish(self, turn: Turn, status: str, heard: str) -> None:
        if self._holding == turn.trace_id:  # its audio was flushed or played: the track goes on
            self._out.append(HoldAudio(turn.trace_id, False))
            self._holding = None
        if turn is self.turn:
            self.turn = None
        elif turn is self.pending:
            self.pending = None
        if self.config.detail_events:  # before TraceDone: nothing about a turn comes after it
            end = turn.marks.get("vad_end")
            marks = {} if end is None else {k: round(1000 * (t - end), 1) for k, t in turn.marks.items()}
            gap = {"gap_ms": round(1000 * turn.gap_s, 1), "gap_reason": turn.gap_reason} if turn.replying else {}
            self._notify("turn.trace", turn, status=status, marks=marks, **gap)
        user = turn.user or turn.text()
        gap_ms = round(1000 * turn.gap_s, 1) if turn.replying else None
        trace = TurnTrace(turn.trace_id, status, user, heard, dict(turn.marks), turn.error, turn.end_of_turn,
                          gap_ms, turn.gap_reason if turn.replying else None)  # fmt: skip
        self._out.append(TraceDone(trace))

    def _mark(self, turn: Turn, name: str, at: float, first: bool = True) -> None:
        if first and name in turn.marks:
            return
        turn.marks[name] = at
        self._out.append(Mark(turn.trace_id, name, at))

    def _notify(self, kind: str, turn: Turn, **fields: Any) -> None:
        self._out.append(Notify({"type": kind, "trace_id": turn.trace_id, **fields}))

    def _ignore(self, reason: str) -> None:
        self.ignored[reason] += 1
