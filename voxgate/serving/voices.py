"""Who owns each cloned voice, so that one client cannot see, use, replace or delete another's.

Engines know nothing of clients: a cloned voice is just an id in the engine. The serving layer
keeps the owner of every id registered through `POST /v1/voices` (the client identity of
`RequestGate`) and answers the one question every transport asks through `ServerState.plan`:
may this client use voice X? A voice with no owner (a model's built-in speaker) is the
server's: everyone may use it, nobody may replace or delete it over HTTP.

An id stays owned while a registration of it is in flight, even if the engine does not hold it
yet, so a second client cannot slip in between the owner's claim and the engine's update, and
an owner's delete racing its own re-upload cannot leave the voice ownerless (public).
Registrations finish on worker threads, so the registry takes a lock.
"""

from __future__ import annotations

import threading
from collections import Counter

from voxgate.types import TooManyVoices, VoiceExists


class VoiceOwners:
    """The owner of every cloned voice id and how many each client keeps (at most `max_per_client`)."""

    def __init__(self, max_per_client: int) -> None:
        self.max_per_client = max_per_client
        self._owner: dict[str, str] = {}
        self._count: Counter[str] = Counter()  # voices (registered or in flight) per client
        self._pending: Counter[str] = Counter()  # registrations in flight per voice id
        self._lock = threading.Lock()

    def begin(self, voice_id: str, client: str, engine_has_it: bool) -> None:
        """Claim `voice_id` for a registration by `client`, or refuse: `VoiceExists` if
        another client (or the server) has it, `TooManyVoices` if it would be one too many.
        Every `begin` that returns is paired with one `end`."""
        with self._lock:
            owner = self._owner.get(voice_id)
            if owner is None:
                if engine_has_it:
                    raise VoiceExists(f"voice {voice_id!r} is one of the server's own; choose another id")
                if self._count[client] >= self.max_per_client:
                    raise TooManyVoices(
                        f"a client may keep at most {self.max_per_client} cloned voices; delete one first"
                    )
                self._owner[voice_id] = client
                self._count[client] += 1
            elif owner != client:
                raise VoiceExists(f"voice id {voice_id!r} is taken; choose another id")
            self._pending[voice_id] += 1

    def end(self, voice_id: str, engine_has_it: bool) -> None:
        """A registration finished (well or not): the claim is dropped once no registration
        is in flight and the engine does not hold the voice (a first upload that failed)."""
        with self._lock:
            self._pending[voice_id] -= 1
            if self._pending[voice_id] <= 0:
                del self._pending[voice_id]
                if not engine_has_it:
                    self._drop(voice_id)

    def forget(self, voice_id: str) -> None:
        """The owner deleted the voice; kept owned while a re-upload of it is still in flight."""
        with self._lock:
            if not self._pending[voice_id]:
                self._drop(voice_id)

    def owns(self, voice_id: str, client: str) -> bool:
        with self._lock:
            return self._owner.get(voice_id) == client

    def owned_by(self, voice_id: str) -> str | None:
        """The client that cloned `voice_id`; None for the server's own voices."""
        with self._lock:
            return self._owner.get(voice_id)

    def may_use(self, voice_id: str, client: str | None) -> bool:
        """True for the owner, for a voice nobody owns, and for `client=None` (internal callers)."""
        if client is None:
            return True
        with self._lock:
            owner = self._owner.get(voice_id)
        return owner is None or owner == client

    def count(self, client: str) -> int:
        with self._lock:
            return self._count[client]

    def _drop(self, voice_id: str) -> None:
        owner = self._owner.pop(voice_id, None)
        if owner is not None:
            self._count[owner] -= 1
            if self._count[owner] <= 0:
                del self._count[owner]
