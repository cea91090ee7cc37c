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

Owners are kept as digests (`OwnerDigests`), in memory and on disk alike: a client identity
from `RequestGate` names an API key by its place in the list (`key0`), which is not the same
client after the keys are reordered, so a voice that outlives the process belongs to an HMAC
of the key itself; the key is never written down. `ClonedVoices` keeps the engine and the
data directory (voxgate/serving/voice_store.py) in step, and re-registers the stored voices
at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from voxgate.engines.base import Engine, VoiceCloner
from voxgate.serving.voice_store import StorageFailed, StoredVoice, VoiceStore
from voxgate.types import TooManyVoices, VoiceExists, VoiceInfo

log = logging.getLogger(__name__)


class OwnerDigests:
    """A client identity -> the digest its voices are owned under: HMAC-SHA256 of the API
    key for a key client (ownership follows the key, wherever it sits in the list), else of
    the identity itself (`addr:<ip>`)."""

    def __init__(self, secret: bytes, api_keys: Sequence[str] = (), admin_keys: Sequence[str] = ()) -> None:
        self._secret = secret
        # the names voxgate.serving.auth.Authenticator gives key clients: index in each list
        named = [(f"key{i}", k) for i, k in enumerate(api_keys)] + [(f"admin{i}", k) for i, k in enumerate(admin_keys)]
        self._keys: dict[str, str] = {}
        for name, key in named:
            self._keys.setdefault(name, self._mac(b"key\0" + key.encode()))

    def __call__(self, client: str) -> str:
        digest = self._keys.get(client)
        return digest if digest is not None else self._mac(b"client\0" + client.encode())

    def _mac(self, material: bytes) -> str:
        return hmac.new(self._secret, material, hashlib.sha256).hexdigest()


class VoiceOwners:
    """The owner of every cloned voice id and how many each client keeps (at most `max_per_client`)."""

    def __init__(self, max_per_client: int, identify: Callable[[str], str] = str) -> None:
        self.max_per_client = max_per_client
        self._identify = identify  # client identity -> what an owner is kept as (`OwnerDigests`)
        self._owner: dict[str, str] = {}
        self._count: Counter[str] = Counter()  # voices (registered or in flight) per client
        self._pending: Counter[str] = Counter()  # registrations in flight per voice id
        self._lock = threading.Lock()

    def begin(self, voice_id: str, client: str, engine_has_it: bool) -> None:
        """Claim `voice_id` for a registration by `client`, or refuse: `VoiceExists` if
        another client (or the server) has it, `TooManyVoices` if it would be one too many.
        Every `begin` that returns is paired with one `end`."""
        client = self._identify(client)
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

    def restore(self, voice_id: str, owner: str) -> None:
        """A stored voice re-registered at start-up: `owner` is already a digest, and it
        counts toward that client's cap as it did before the restart."""
        with self._lock:
            if self._owner.get(voice_id) is None:
                self._owner[voice_id] = owner
                self._count[owner] += 1

    def owns(self, voice_id: str, client: str) -> bool:
        client = self._identify(client)
        with self._lock:
            return self._owner.get(voice_id) == client

    def owned_by(self, voice_id: str) -> str | None:
        """The owner (its digest) of `voice_id`; None for the server's own voices."""
        with self._lock:
            return self._owner.get(voice_id)

    def may_use(self, voice_id: str, client: str | None) -> bool:
        """True for the owner, for a voice nobody owns, and for `client=None` (internal callers)."""
        if client is None:
            return True
        client = self._identify(client)
        with self._lock:
            owner = self._owner.get(voice_id)
        return owner is None or owner == client

    def count(self, client: str) -> int:
        client = self._identify(client)
        with self._lock:
            return self._count[client]

    def _drop(self, voice_id: str) -> None:
        owner = self._owner.pop(voice_id, None)
        if owner is not None:
            self._count[owner] -= 1
            if self._count[owner] <= 0:
                del self._count[owner]


class ClonedVoices:
    """Registers and removes cloned voices in the engine and, given a store, on disk, one
    change at a time, so that an upload and a delete of the same id racing each other leave
    the engine and the disk agreeing. Runs on worker threads (engine calls block)."""

    def __init__(self, owners: VoiceOwners, store: VoiceStore | None) -> None:
        self.owners = owners
        self.store = store
        self._lock = threading.Lock()

    def register(
        self, engine: VoiceCloner, voice_id: str, samples: np.ndarray, rate: int, text: str | None
    ) -> VoiceInfo:
        """Clone `voice_id` (its id already claimed in `owners`) and store it; a voice that
        cannot be stored is not kept at all (`StorageFailed`)."""
        with self._lock:
            info = engine.add_voice(voice_id, samples, rate, text)
            owner = self.owners.owned_by(voice_id)
            if self.store is None or owner is None:
                return info
            try:
                self.store.save(StoredVoice(voice_id, info.engine, text, owner, samples, rate))
            except StorageFailed:
                engine.remove_voice(voice_id)
                self._drop_stored(voice_id)
                raise
            return info

    def remove(self, engine: VoiceCloner, voice_id: str) -> None:
        with self._lock:
            engine.remove_voice(voice_id)
            if self.store is not None:
                self.store.delete(voice_id)

    def restore(self, engine: Engine) -> int:
        """Re-register every stored voice this engine can take, with its owner; the others
        stay on disk, one log line each. Returns how many were restored."""
        if self.store is None:
            return 0
        restored = 0
        for voice in self.store.load():
            if voice.engine != engine.name or not isinstance(engine, VoiceCloner):
                log.warning("stored voice %r (engine %s) skipped: the %s engine cannot take it", voice.id, voice.engine,
                            engine.name)  # fmt: skip
                continue
            try:
                engine.add_voice(voice.id, voice.samples, voice.sample_rate, voice.ref_text)
            except Exception as exc:  # one bad voice must not keep the server from starting
                log.warning("stored voice %r skipped: the engine refused it: %s", voice.id, exc)
                continue
            self.owners.restore(voice.id, voice.owner)
            restored += 1
        if restored:
            log.info("%d stored voice(s) restored from %s", restored, self.store.voices_dir)
        return restored

    def _drop_stored(self, voice_id: str) -> None:
        try:
            self.store.delete(voice_id)  # type: ignore[union-attr]
        except StorageFailed as exc:
            log.warning("%s", exc.message)
