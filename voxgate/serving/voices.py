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
of the key itself; the key is never written down. The HMAC key is the data directory's
`secret`, so every replica on the same directory computes the same digest for the same key.

`ClonedVoices` keeps the engine and the data directory (voxgate/serving/voice_store.py) in
step. The directory is the truth, shared by every replica that sees it: a replica registers
the stored voices at start-up, and then notices what other replicas changed in two ways. A
request that names a voice compares one stat of its manifest with what this replica last
applied (`stale`), and if they differ re-reads that one voice before answering (`refresh`):
a voice cloned on replica A is usable on B at once, one deleted on B is refused by A at once.
A poller rescans the listing every `sync_interval_s` (a stat a voice; files are read only
when one changed), so that transports that plan without asking (WebSocket sessions, bridge
replies) stop serving a deleted voice within that interval plus one scan.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from voxgate.engines.base import Engine, VoiceCloner
from voxgate.serving.voice_store import Signature, StorageFailed, StoredVoice, VoiceStore
from voxgate.types import InvalidAudio, TooManyVoices, VoiceExists, VoiceInfo

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 2.0  # how stale a replica's voices may get for transports that do not ask first


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
        """A stored voice registered from the data directory (at start-up, or cloned through
        another replica): `owner` is already a digest, it replaces any owner this replica
        had for the id, and it counts toward that client's cap here too."""
        with self._lock:
            if self._owner.get(voice_id) != owner:
                self._drop(voice_id)
                self._owner[voice_id] = owner
                self._count[owner] += 1

    def pending(self, voice_id: str) -> bool:
        """Whether a registration of `voice_id` through this replica is in flight."""
        with self._lock:
            return self._pending[voice_id] > 0

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
    the engine and the disk agreeing; and brings in what other replicas changed on disk.
    Runs on worker threads (engine calls block), apart from `stale` (one stat)."""

    def __init__(self, owners: VoiceOwners, store: VoiceStore | None, sync_interval_s: float = SYNC_INTERVAL_S) -> None:
        self.owners = owners
        self.store = store
        self.sync_interval_s = sync_interval_s
        self._lock = threading.Lock()
        self._seen: dict[str, Signature] = {}  # voice id -> the manifest last applied (or skipped) here
        self._loaded: set[str] = set()  # ids this replica holds in the engine from the store
        self._scan_began = float("-inf")  # monotonic start of the last full scan
        self._stop = threading.Event()

    def register(
        self, engine: VoiceCloner, voice_id: str, samples: np.ndarray, rate: int, text: str | None
    ) -> VoiceInfo:
        """Clone `voice_id` (its id already claimed in `owners`) and store it; a voice that
        cannot be stored is not kept at all (`StorageFailed`, or `VoiceExists` when another
        client stored the id through another replica meanwhile)."""
        with self._lock:
            info = engine.add_voice(voice_id, samples, rate, text)
            owner = self.owners.owned_by(voice_id)
            if self.store is None or owner is None:
                return info
            try:
                signature = self.store.save(StoredVoice(voice_id, info.engine, text, owner, samples, rate))
            except StorageFailed:
                engine.remove_voice(voice_id)
                self._drop_stored(voice_id)
                raise
            except VoiceExists:
                engine.remove_voice(voice_id)  # the stored one comes in with the next look
                self._seen.pop(voice_id, None)
                self._loaded.discard(voice_id)
                raise
            self._note(voice_id, signature)
            return info

    def remove(self, engine: VoiceCloner, voice_id: str) -> None:
        with self._lock:
            engine.remove_voice(voice_id)
            if self.store is not None:
                self.store.delete(voice_id, owner=self.owners.owned_by(voice_id))
                self._seen.pop(voice_id, None)
                self._loaded.discard(voice_id)

    def restore(self, engine: Engine) -> int:
        """Register every stored voice this engine can take, with its owner (the others stay
        on disk, one log line each), then keep polling the store while the server runs.
        Returns how many were restored."""
        if self.store is None:
            return 0
        restored = self.sync(engine)
        if restored:
            log.info("%d stored voice(s) restored from %s", restored, self.store.voices_dir)
        if isinstance(engine, VoiceCloner) and self.sync_interval_s > 0:
            threading.Thread(target=self._poll, args=(engine,), name="voxgate-voice-sync", daemon=True).start()
        return restored

    def stale(self, voice_id: str | None) -> bool:
        """Whether the store holds another `voice_id` than this replica last applied (cloned,
        replaced or deleted elsewhere): one stat, cheap enough for every request. A store
        that cannot be read now is not news: what is held is served."""
        if self.store is None or voice_id is None:
            return False
        try:
            return self.store.signature(voice_id) != self._seen.get(voice_id)
        except OSError:
            return False

    def refresh(self, engine: Engine, voice_id: str) -> None:
        """Bring one voice in line with the store (the engine call may take a while)."""
        if self.store is None:
            return
        with self._lock:
            try:
                signature = self.store.signature(voice_id)
            except OSError as exc:
                log.warning("stored voice %r not looked at: %s", voice_id, exc)
                return
            self._bring(engine, voice_id, signature)

    def sync(self, engine: Engine, asked_at: float | None = None) -> int:
        """Bring every voice in line with the store; returns how many were registered. Given
        `asked_at` (time.monotonic()), a scan begun since then is answer enough: a burst of
        callers costs one or two scans, not one each."""
        if self.store is None:
            return 0
        with self._lock:
            if asked_at is not None and self._scan_began >= asked_at:
                return 0
            self._scan_began = time.monotonic()
            try:
                listing = self.store.listing()
            except OSError as exc:  # keep what is held until the directory reads again
                log.warning("stored voices not rescanned: %s", exc)
                return 0
            before = len(self._loaded)
            for voice_id in sorted(listing.keys() | self._seen.keys()):
                self._bring(engine, voice_id, listing.get(voice_id))
            return max(0, len(self._loaded) - before)

    def close(self) -> None:
        """Stop the poller (a server shutting down)."""
        self._stop.set()

    def _poll(self, engine: Engine) -> None:
        while not self._stop.wait(self.sync_interval_s):
            try:
                self.sync(engine)
            except Exception:  # a bad moment of the file system must not end the polling
                log.exception("stored voices: rescan failed")

    def _bring(self, engine: Engine, voice_id: str, signature: Signature | None) -> None:
        """Under the lock: apply the manifest `signature` names, or forget the voice if None.
        An id with a registration in flight here is left to it (its save checks the owner)."""
        if signature == self._seen.get(voice_id) or self.owners.pending(voice_id):
            return
        if signature is None:
            self._unload(engine, voice_id)
            self._seen.pop(voice_id, None)
            return
        try:
            voice = self.store.read(voice_id)  # type: ignore[union-attr]
        except FileNotFoundError:
            return  # replaced or deleted while read: the next look sees it whole
        except (OSError, ValueError, KeyError, TypeError, InvalidAudio) as exc:
            log.warning("stored voice %r skipped: %s", voice_id, exc)
            self._unload(engine, voice_id)
            self._note(voice_id, signature, loaded=False)
            return
        self._note(voice_id, signature, loaded=self._load(engine, voice))

    def _load(self, engine: Engine, voice: StoredVoice) -> bool:
        if voice.engine != engine.name or not isinstance(engine, VoiceCloner):
            log.warning("stored voice %r (engine %s) skipped: the %s engine cannot take it", voice.id, voice.engine,
                        engine.name)  # fmt: skip
            self._unload(engine, voice.id)
            return False
        try:
            engine.add_voice(voice.id, voice.samples, voice.sample_rate, voice.ref_text)
        except Exception as exc:  # one bad voice must not keep the server from starting
            log.warning("stored voice %r skipped: the engine refused it: %s", voice.id, exc)
            self._unload(engine, voice.id)
            return False
        self.owners.restore(voice.id, voice.owner)
        return True

    def _unload(self, engine: Engine, voice_id: str) -> None:
        """Stop serving a voice this replica took from the store."""
        if voice_id not in self._loaded:
            return
        self._loaded.discard(voice_id)
        if isinstance(engine, VoiceCloner):
            engine.remove_voice(voice_id)
        self.owners.forget(voice_id)
        log.info("stored voice %r is no longer served here (deleted, or changed, in the data dir)", voice_id)

    def _note(self, voice_id: str, signature: Signature | None, loaded: bool = True) -> None:
        if signature is not None:
            self._seen[voice_id] = signature
        if loaded:
            self._loaded.add(voice_id)

    def _drop_stored(self, voice_id: str) -> None:
        try:
            self.store.delete(voice_id)  # type: ignore[union-attr]
        except StorageFailed as exc:
            log.warning("%s", exc.message)
