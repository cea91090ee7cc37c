"""The listener's playback clock: when the audio handed out so far will have been played.

A listener plays audio as it arrives, at real time, and waits through gaps (an underrun, the
pause between two utterances) rather than skipping. So each piece of audio ends playing at
`max(end, now) + seconds`, where `end` is when the audio before it ends. From that one number:
- `due(now)`: when the listener needs the next audio (`now` before any audio, and in the past
  while it is starved). Engine calls and batched streams are served earliest-due first
  (`EngineStream`, the qwen3 runner's `play_at`), so a session's later segment, whose
  listener still has seconds buffered, goes after a new utterance's first audio;
- `buffered(now)`: seconds of audio waiting at the listener, which pacing (sending no more
  than a lead ahead of playback) reads.

`StartWatch` keeps how long segments take to start lately, at their worst: how much audio a
listener must still have in hand when the next cut is made.

Time is `time.perf_counter()`. A transport keeps one clock per listener (a WebSocket session,
a bridge reply, an agent's reply) and advances it as it sends audio; `EngineStream` keeps its
own for a stream without one.
"""

from __future__ import annotations


class PlaybackClock:
    __slots__ = ("absent", "end", "sent_s")

    def __init__(self) -> None:
        self.end: float | None = None  # when the audio sent so far ends playing; None before any
        self.sent_s = 0.0  # seconds of audio sent
        self.absent = False  # nobody listens now (a dropped socket; `types.ListenerClock`)

    def reset(self) -> None:
        """A new listener (a resumed session's new socket): there, with nothing in hand yet."""
        self.end, self.sent_s, self.absent = None, 0.0, False

    def add(self, seconds: float, now: float) -> None:
        """`seconds` of audio handed to the listener at `now`."""
        self.end = max(self.end if self.end is not None else now, now) + seconds
        self.sent_s += seconds

    def due(self, now: float) -> float:
        """When the listener needs the next audio."""
        return now if self.end is None else self.end

    def buffered(self, now: float) -> float:
        """Seconds of audio the listener has and has not played yet."""
        return 0.0 if self.end is None else max(0.0, self.end - now)

    def wait_s(self, now: float, lead_s: float) -> float:
        """Pacing: how long to hold the next audio so the listener has at most `lead_s` in hand."""
        return max(0.0, self.buffered(now) - lead_s)


class StartWatch:
    """How long a segment takes to start (from its engine call, once the client has a slot, to
    its first audio) lately, at its worst: a listener with less than `margin` times that in
    hand is starving (the WebSocket gateway then cuts the next segment at once, `Session.starved`).

    `high` is the largest start seen, forgotten by `decay` at each new one, so a burst of slow
    starts (a crowd's second segments all at once on a busy GPU) raises the threshold for the
    segments right after it and a quiet spell lowers it again. `threshold()` stays within
    `floor` (a start on an idle machine) and `ceiling` (beyond it a listener is fed starter-sized
    segments all the time). Why not a fixed threshold: a start takes ~10 ms on the CPU with
    `tone` and 50-150 ms on a GPU with 128 sessions, and the cut must come that long before
    the listener runs dry."""

    __slots__ = ("ceiling", "decay", "floor", "high", "margin")

    def __init__(self, floor: float, ceiling: float, margin: float = 2.0, decay: float = 0.95) -> None:
        if not 0 < floor <= ceiling or margin < 1 or not 0 <= decay < 1:
            raise ValueError("need 0 < floor <= ceiling, margin >= 1, 0 <= decay < 1")
        self.floor, self.ceiling, self.margin, self.decay = floor, ceiling, margin, decay
        self.high = 0.0

    def note(self, seconds: float) -> None:
        """A segment's start took `seconds`."""
        self.high = max(seconds, self.high * self.decay)

    def threshold(self) -> float:
        """Seconds of audio in hand under which a listener is starving."""
        return min(self.ceiling, max(self.floor, self.margin * self.high))
