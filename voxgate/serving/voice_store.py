"""Cloned voices on disk, so that they outlive the process (`VOXGATE_DATA_DIR`), and shared by
every replica that sees the same directory.

    <data_dir>/secret                       32 random bytes (0600): the key of the owner digests
    <data_dir>/voices.lock                  held (flock) by whichever process is writing a voice
    <data_dir>/voices/<id as hex>/voice.json  id, engine, transcript, owner digest, audio name and sha256
    <data_dir>/voices/<id as hex>/<sha>.wav   the reference audio: mono float32 WAV at the engine's rate

What is kept is what the engine was given, not the upload, so a voice re-registered at start-up
(or by another replica) is the same voice bit for bit. The owner is a digest
(voxgate/serving/voices.py `OwnerDigests`), never an API key. Every file is written to a
temporary file (0600) and renamed into place, and voice.json goes last: it is the commit, and it
names its audio by content, so a crash at any point, or a reader at any moment, sees either the
old voice or the new one. A directory is named by the id's hex, so ids that differ only in case
(or `..`) are safe on any file system.

Several processes may write at once (replicas on one data dir): a writer holds `voices.lock`
(an exclusive flock, released by the kernel if the process dies), so that checking who owns an
id and writing it are one step; readers take no lock. The secret is linked into place whole,
so two replicas starting together read the same one. `signature` is one stat of a manifest:
what a replica compares to notice a voice cloned, replaced or deleted elsewhere.

Plain files and JSON only: no HTTP, no engine. An entry that cannot be read is logged and
skipped by `load`, never deleted (an operator may want it back) and never fatal.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxgate.audio_decode import AudioBounds, decode_audio
from voxgate.types import InvalidAudio, VoiceExists, VoxgateError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SECRET_BYTES = 32
_MANIFEST = "voice.json"
_HEX = re.compile(r"(?:[0-9a-f]{2}){1,64}")
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # protocol.VoiceUpload's id
_DIGEST = re.compile(r"[0-9a-f]{64}")
_AUDIO_NAME = re.compile(r"[0-9a-f]{16}\.wav")
# What a stored reference may be: a 30 s upload resampled lands within a few samples of 30 s.
_STORED_BOUNDS = AudioBounds(min_seconds=0.0, max_seconds=31.0, max_channels=1)
_MAX_AUDIO_BYTES = 64 + 4 * int(_STORED_BOUNDS.max_seconds * _STORED_BOUNDS.max_rate)


# A manifest as one stat sees it: a rename gives a new inode, and a rewrite a new ctime.
Signature = tuple[int, int, int, int]


class StorageFailed(VoxgateError):
    """The data directory could not be written (full, read-only, gone)."""

    code = "storage_failed"
    status = 507


@dataclass(frozen=True, slots=True)
class StoredVoice:
    """One cloned voice as kept on disk: enough to register it again, and whose it is."""

    id: str
    engine: str  # the engine it was registered with; another engine skips it
    ref_text: str | None  # the transcript (in-context cloning), if one was given
    owner: str  # the owner's digest (hex HMAC-SHA256), never a key
    samples: np.ndarray  # float32 mono, exactly what the engine was given
    sample_rate: int


class VoiceStore:
    """The cloned voices under one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.voices_dir = self.data_dir / "voices"

    def secret(self) -> bytes:
        """This data dir's HMAC key, created (0600) on first use; the same on every start and
        on every replica, so an owner's digest is too. Written aside and linked into place
        (a link never replaces), so no replica reads it half written."""
        path = self.data_dir / "secret"
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not path.exists():
                _link_new(path, secrets.token_bytes(SECRET_BYTES))
            return _check_secret(path, path.read_bytes())
        except OSError as exc:
            raise StorageFailed(f"VOXGATE_DATA_DIR {self.data_dir} is not usable: {exc.strerror or exc}") from None

    def save(self, voice: StoredVoice) -> Signature:
        """Write (or replace) one voice: audio, then the manifest that commits it. `VoiceExists`
        if the id is stored under another owner (cloned through another replica meanwhile).
        Returns the signature of the manifest written."""
        folder = self._folder(voice.id)
        audio = _float_wav(voice.samples, voice.sample_rate)
        sha = hashlib.sha256(audio).hexdigest()
        manifest = {
            "version": FORMAT_VERSION,
            "id": voice.id,
            "engine": voice.engine,
            "ref_text": voice.ref_text,
            "owner": voice.owner,
            "audio": f"{sha[:16]}.wav",
            "sha256": sha,
        }
        try:
            with self._writing():
                if self._owner_on_disk(folder) not in (None, voice.owner):
                    raise VoiceExists(f"voice id {voice.id!r} is taken; choose another id")
                folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                _write_atomically(folder / manifest["audio"], audio)
                _write_atomically(folder / _MANIFEST, json.dumps(manifest, ensure_ascii=False, indent=1).encode())
                for stale in folder.glob("*.wav"):
                    if stale.name != manifest["audio"]:
                        stale.unlink(missing_ok=True)
                return _signature(os.stat(folder / _MANIFEST))
        except OSError as exc:
            raise StorageFailed(f"voice {voice.id!r} could not be stored: {exc.strerror or exc}") from None

    def delete(self, voice_id: str, owner: str | None = None) -> None:
        """Forget one voice: the manifest first (uncommits it), then the rest. Given `owner`,
        a voice stored under another owner (deleted and cloned again elsewhere) is left."""
        folder = self._folder(voice_id)
        try:
            with self._writing():
                if owner is not None and self._owner_on_disk(folder) not in (None, owner):
                    return
                (folder / _MANIFEST).unlink(missing_ok=True)
                if folder.is_dir():
                    for leftover in folder.iterdir():
                        leftover.unlink(missing_ok=True)
                    folder.rmdir()
        except OSError as exc:
            raise StorageFailed(f"voice {voice_id!r} could not be removed: {exc.strerror or exc}") from None

    def signature(self, voice_id: str) -> Signature | None:
        """One stat of the voice's manifest; None if there is none (or the id is not one).
        Any other failure (EIO, a stale NFS handle) raises OSError: a voice is never taken
        for deleted because the file system hiccuped."""
        if not _ID.fullmatch(voice_id):
            return None
        return _stat(self._folder(voice_id) / _MANIFEST)

    def listing(self) -> dict[str, Signature]:
        """Every stored voice id with a manifest, and its signature: a listing and a stat a
        voice, no file read (what a replica polls). OSError as `signature`."""
        try:
            names = os.listdir(self.voices_dir)
        except FileNotFoundError:
            return {}  # nothing stored yet
        found = {}
        for name in names:
            voice_id = _id_of(name)
            signature = _stat(self.voices_dir / name / _MANIFEST) if voice_id is not None else None
            if signature is not None:  # else: deleted, or not yet committed
                found[voice_id] = signature
        return found

    def read(self, voice_id: str) -> StoredVoice:
        """One voice, checked as `load` checks it; FileNotFoundError if it is gone (or was
        replaced while being read: the caller looks again)."""
        return self._read(self._folder(voice_id))

    def load(self) -> list[StoredVoice]:
        """Every readable voice; each unreadable entry is one warning and is left in place."""
        if not self.voices_dir.is_dir():
            return []
        voices = []
        for folder in sorted(self.voices_dir.iterdir()):
            try:
                voices.append(self._read(folder))
            except (OSError, ValueError, KeyError, TypeError, InvalidAudio) as exc:
                log.warning("stored voice %s skipped: %s", folder.name, exc)
        return voices

    def _folder(self, voice_id: str) -> Path:
        if not _ID.fullmatch(voice_id):
            raise ValueError(f"not a voice id: {voice_id!r}")
        return self.voices_dir / voice_id.encode().hex()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """The data dir's write lock, held across processes (and hosts, on a file system whose
        locks are shared: local, NFSv4, CephFS)."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.data_dir / "voices.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @staticmethod
    def _owner_on_disk(folder: Path) -> str | None:
        """Who the stored voice in `folder` belongs to; None if there is none (or it cannot
        be read: a torn entry does not keep its id from being cloned again)."""
        try:
            manifest = json.loads((folder / _MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        owner = manifest.get("owner") if isinstance(manifest, dict) else None
        return owner if isinstance(owner, str) else None

    def _read(self, folder: Path) -> StoredVoice:
        manifest = json.loads((folder / _MANIFEST).read_bytes())
        problem = _manifest_problem(manifest, folder.name)
        if problem is not None:
            raise ValueError(f"the manifest has {problem}")
        voice_id, owner, name = manifest["id"], manifest["owner"], manifest["audio"]
        path = folder / name
        if path.stat().st_size > _MAX_AUDIO_BYTES:
            raise ValueError(f"{name} is larger than any stored reference")
        audio = path.read_bytes()
        if hashlib.sha256(audio).hexdigest() != manifest["sha256"]:
            raise ValueError(f"{name} does not match its sha256")
        decoded = decode_audio(audio, _STORED_BOUNDS)
        return StoredVoice(
            voice_id, manifest["engine"], manifest["ref_text"], owner, decoded.samples, decoded.sample_rate
        )


def _id_of(folder_name: str) -> str | None:
    """The voice id a folder is named after, if it is one."""
    if not _HEX.fullmatch(folder_name):
        return None
    try:
        voice_id = bytes.fromhex(folder_name).decode()
    except UnicodeDecodeError:
        return None
    return voice_id if _ID.fullmatch(voice_id) else None


def _signature(st: os.stat_result) -> Signature:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat(manifest: Path) -> Signature | None:
    """A manifest's signature; None if it is not there."""
    try:
        return _signature(os.stat(manifest))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _link_new(path: Path, data: bytes) -> None:
    """Create `path` holding `data`, whole or not at all: written aside, then hard-linked
    (which fails rather than replace). Losing the race to another process is fine: its
    file is the one every process then reads."""
    tmp = _synced_copy(path, data)
    try:
        with suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_secret(path: Path, secret: bytes) -> bytes:
    if len(secret) != SECRET_BYTES:
        raise StorageFailed(f"{path} is not a voxgate secret ({len(secret)} bytes, not {SECRET_BYTES})")
    return secret


def _manifest_problem(manifest: object, folder_name: str) -> str | None:
    """What is wrong with a voice.json (a hand edit, a newer format, a torn disk), if anything."""
    if not isinstance(manifest, dict):
        return "no fields"
    if manifest.get("version") != FORMAT_VERSION:
        return f"format version {manifest.get('version')!r}, not {FORMAT_VERSION}"
    voice_id, text = manifest.get("id"), manifest.get("ref_text")
    checks = (
        (isinstance(voice_id, str) and _ID.fullmatch(voice_id) is not None, "a bad id"),
        (isinstance(voice_id, str) and folder_name == voice_id.encode().hex(), "the id of another folder"),
        (isinstance(manifest.get("owner"), str) and _DIGEST.fullmatch(manifest["owner"]), "a bad owner digest"),
        (isinstance(manifest.get("audio"), str) and _AUDIO_NAME.fullmatch(manifest["audio"]), "a bad audio name"),
        (isinstance(manifest.get("sha256"), str), "no sha256"),
        (isinstance(manifest.get("engine"), str), "a bad engine name"),
        (text is None or isinstance(text, str), "a bad transcript"),
    )
    return next((what for ok, what in checks if not ok), None)


def _float_wav(samples: np.ndarray, rate: int) -> bytes:
    """Mono float32 WAV: lossless for what the engine was given, and read back by our own
    bounded decoder."""
    data = np.ascontiguousarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)  # WAVE_FORMAT_IEEE_FLOAT, mono
    return b"".join(
        (b"RIFF", struct.pack("<I", 36 + len(data)), b"WAVE", b"fmt ", struct.pack("<I", 16), fmt,
         b"data", struct.pack("<I", len(data)), data)
    )  # fmt: skip


def _write_atomically(path: Path, data: bytes) -> None:
    """A temporary file in the same folder (0600), synced, then renamed over `path`."""
    tmp = _synced_copy(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _synced_copy(path: Path, data: bytes) -> Path:
    """`data` in a new temporary file beside `path` (0600), on disk before it is returned."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)
