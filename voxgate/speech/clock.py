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
