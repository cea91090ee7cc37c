"""The gateway's wire (docs/protocol.md) for framework integrations, without I/O: which text
goes out as which message, and which audio belongs to which of the framework's turns.

Pure (no sockets, no framework): the pipecat service drives it, and its rules are tested on
their own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from voxgate.integrations.wire import pieces, whole_end
from voxgate.text import speakable


@dataclass(slots=True)
class _Utterance:
    context_id: str
    text: str = ""  # not sent yet: waiting for its turn, or a word still being written
    number: int | None = None  # the server's utterance number, once it is on the server
    sent: bool = False  # a delta went out (the server has it open)
    ending: bool = False  # no more text comes (text.end once on the server)
    final: bool = False  # pipecat ended its context: the context closes with this utterance


class Utterances:
    """Pipecat's audio contexts as voxgate utterances, as a pure state machine.

    A session speaks one utterance at a time and refuses text for the next one until the last
    one's `utterance.done`, so contexts that speak meanwhile wait here, whole. A context that
    speaks while another's utterance is open ends that utterance (pipecat's contexts play in
    order, so nothing waits on a context that cannot finish). Audio is routed by the utterance
    number the server stamps on it: a dropped utterance has no route, so none of its audio is
    played, however late it comes. Each method returns the messages to send, in order.
    """

    def __init__(self, waiting: deque[_Utterance] | None = None) -> None:
        self.current: _Utterance | None = None
        self.waiting: deque[_Utterance] = waiting or deque()
        self.next_number = 0
        self.unanswered_cancels = 0  # each is answered by an utterance.done "cancelled"
        self._routes: dict[int, str] = {}
        self._closed: list[str] = []

    @property
    def server_free(self) -> bool:
        return self.current is None and self.unanswered_cancels == 0

    def contexts(self) -> set[str]:
        return {u.context_id for u in (self.current, *self.waiting) if u is not None}

    def say(self, context_id: str, text: str) -> list[dict[str, Any]]:
        text = speakable(text)
        newest = self.waiting[-1] if self.waiting else self.current
        if newest is not None and newest.context_id == context_id and not newest.ending:
            newest.text += text
            return self._deltas(newest, whole=False) if newest is self.current else []
        out = self._close(newest, final=False) if newest is not None and not newest.ending else []
        self.waiting.append(_Utterance(context_id, text))
        return out

    def end(self, context_id: str) -> list[dict[str, Any]]:
        """Pipecat ended the context: it closes once its last utterance is done (now, if none is left)."""
        mine = [u for u in (self.current, *self.waiting) if u is not None and u.context_id == context_id]
        if not mine:
            self._closed.append(context_id)
            return []
        if mine[-1].ending:
            mine[-1].final = True
            return []
        return self._close(mine[-1], final=True)

    def drop(self, context_id: str) -> list[dict[str, Any]]:
        """The context was interrupted: forget it, and cancel its utterance on the server."""
        self.waiting = deque(u for u in self.waiting if u.context_id != context_id)
        self._routes = {n: c for n, c in self._routes.items() if c != context_id}
        current = self.current
        if current is None or current.context_id != context_id:
            return []
        self.current = None
        if not current.sent:  # the server has nothing open: its number is still the next one
            return []
        self.unanswered_cancels += 1
        return [{"type": "cancel"}]

    def start_next(self) -> list[dict[str, Any]]:
        if not self.server_free or not self.waiting:
            return []
        u = self.current = self.waiting.popleft()
        u.number = self.next_number
        self._routes[u.number] = u.context_id
        return self._deltas(u, whole=u.ending) + ([{"type": "text.end"}] if u.ending else [])

    def context_of(self, utterance: int) -> str | None:
        return self._routes.get(utterance)

    def done(self, utterance: int, status: str) -> None:
        """`utterance.done`: the server is free for the next utterance."""
        context_id = self._routes.pop(utterance, None)
        if self.unanswered_cancels:
            # A cancel's answer is the next "cancelled" done: the utterance it cut, or an empty one
            # it closed because the utterance had completed meanwhile (whose done comes first).
            if status == "cancelled":
                self.unanswered_cancels -= 1
                self.next_number = utterance + 1
            return
        current = self.current
        if current is None or current.number != utterance:
            return  # a repeat, or the end of an utterance already dropped
        self.current = None
        self.next_number = utterance + 1
        if current.final and context_id is not None:
            self._closed.append(context_id)

    def take_closed(self) -> list[str]:
        """Contexts that have said everything since the last call: their audio contexts close."""
        closed, self._closed = self._closed, []
        return closed

    def carry_over(self) -> Utterances:
        """The waiting utterances, for a new session (the server has nothing open)."""
        return Utterances(self.waiting)

    def _close(self, u: _Utterance, final: bool) -> list[dict[str, Any]]:
        u.ending, u.final = True, final
        if u is not self.current:
            return []
        return [*self._deltas(u, whole=True), {"type": "text.end"}]

    def _deltas(self, u: _Utterance, whole: bool) -> list[dict[str, Any]]:
        ready = u.text if whole else u.text[: whole_end(u.text)]
        if not ready.strip():  # blank text goes with the next word, so every delta holds a unit
            if whole:
                u.text = ""
            return []
        u.text = u.text[len(ready) :]
        u.sent = True
        return [{"type": "text.delta", "text": piece} for piece in pieces(ready)]
