"""Cloned voices on disk (voxgate.serving.voice_store) and the owner digests they are kept under."""

from __future__ import annotations

import json
import logging
import stat

import numpy as np
import pytest

from voxgate.serving.auth import Authenticator
from voxgate.serving.voice_store import StorageFailed, StoredVoice, VoiceStore
from voxgate.serving.voices import OwnerDigests, VoiceOwners
from voxgate.types import TooManyVoices

KEY = "sk-live-0123456789abcdef"


def tone(seconds: float = 1.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def voice(
    voice_id: str = "alice", owner: str = "a" * 64, seconds: float = 1.0, text: str | None = "Hi."
) -> StoredVoice:
    return StoredVoice(voice_id, "qwen3", text, owner, tone(seconds), 24000)


def test_a_saved_voice_loads_back_bit_for_bit(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(voice("alice", text="Hello there."))
    store.save(voice("bob", owner="b" * 64, seconds=2.0, text=None))
    loaded = {v.id: v for v in VoiceStore(tmp_path).load()}  # a new process reads the same directory
    assert set(loaded) == {"alice", "bob"}
    alice = loaded["alice"]
    assert (alice.engine, alice.ref_text, alice.owner, alice.sample_rate) == ("qwen3", "Hello there.", "a" * 64, 24000)
    np.testing.assert_array_equal(alice.samples, tone(1.0))  # exactly what the engine was given
    assert loaded["bob"].ref_text is None and len(loaded["bob"].samples) == 48000


def test_saving_again_replaces_the_voice_and_leaves_no_stale_audio(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(voice(seconds=1.0))
    store.save(voice(seconds=2.0, text="Again."))
    [folder] = store.voices_dir.iterdir()
    assert sorted(p.suffix for p in folder.iterdir()) == [".json", ".wav"]  # no temporaries, no old audio
    [again] = store.load()
    assert again.ref_text == "Again." and len(again.samples) == 48000


def test_a_deleted_voice_is_gone_from_disk(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(voice("alice"))
    store.save(voice("bob"))
    store.delete("alice")
    store.delete("never-stored")  # nothing to do, no error
    assert [v.id for v in store.load()] == ["bob"]
    assert len(list(store.voices_dir.iterdir())) == 1


def test_ids_that_differ_only_in_case_or_are_dots_get_folders_of_their_own(tmp_path):
    store = VoiceStore(tmp_path)
    for voice_id in ("Alice", "alice", "..", "."):
        store.save(voice(voice_id))
    assert sorted(v.id for v in store.load()) == [".", "..", "Alice", "alice"]
    assert all(p.parent == store.voices_dir for p in store.voices_dir.iterdir())


def corrupt_entries(store: VoiceStore) -> dict[str, object]:
    """Every way an entry can be broken, keyed by the voice id it was saved as."""
    for voice_id in ("garbage-json", "no-manifest", "bad-owner", "moved", "audio-edited", "audio-gone", "list"):
        store.save(voice(voice_id))
    folder = {v: store.voices_dir / v.encode().hex() for v in ("garbage-json", "no-manifest", "bad-owner", "moved",
                                                               "audio-edited", "audio-gone", "list")}  # fmt: skip
    (folder["garbage-json"] / "voice.json").write_bytes(b"{not json")
    (folder["no-manifest"] / "voice.json").unlink()
    (folder["list"] / "voice.json").write_text("[1, 2]")
    for name, change in (("bad-owner", {"owner": KEY}), ("moved", {"id": "elsewhere"})):
        manifest = json.loads((folder[name] / "voice.json").read_text())
        (folder[name] / "voice.json").write_text(json.dumps({**manifest, **change}))
    [wav] = folder["audio-edited"].glob("*.wav")
    wav.write_bytes(wav.read_bytes()[:-100])
    [wav] = folder["audio-gone"].glob("*.wav")
    wav.unlink()
    (store.voices_dir / "stray-file").write_text("not a folder")
    return folder


def test_corrupt_entries_are_logged_skipped_and_left_in_place(tmp_path, caplog):
    store = VoiceStore(tmp_path)
    store.save(voice("good"))
    folders = corrupt_entries(store)
    with caplog.at_level(logging.WARNING, logger="voxgate.serving.voice_store"):
        loaded = store.load()
    assert [v.id for v in loaded] == ["good"]
    assert len(caplog.records) == len(folders) + 1  # one line each (and the stray file)
    assert all(folder.is_dir() for folder in folders.values())  # an operator may want them back


def test_a_manifest_cannot_point_the_store_outside_its_folder(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(voice("alice"))
    (tmp_path / "outside.wav").write_bytes(b"RIFF")
    manifest_path = next(store.voices_dir.iterdir()) / "voice.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "audio": "../../outside.wav"}))
    assert store.load() == []


def test_the_secret_is_private_and_the_same_on_every_start(tmp_path):
    first = VoiceStore(tmp_path / "data").secret()
    again = VoiceStore(tmp_path / "data").secret()
    assert first == again and len(first) == 32
    assert stat.S_IMODE((tmp_path / "data" / "secret").stat().st_mode) == 0o600


def test_no_file_in_the_data_dir_holds_the_api_key(tmp_path):
    store = VoiceStore(tmp_path)
    digests = OwnerDigests(store.secret(), [KEY])
    store.save(voice("alice", owner=digests("key0"), text=f"my key is not {KEY[:3]}"))
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_an_owner_digest_follows_the_key_not_its_place_in_the_list():
    """`key0` is whichever key comes first; a stored voice must stay with the key itself."""
    secret = b"s" * 32
    before, after = OwnerDigests(secret, ["key-a", "key-b"]), OwnerDigests(secret, ["key-b", "key-a"])
    assert before("key0") == after("key1") and before("key1") == after("key0")
    assert before("key0") != before("key1") and KEY not in before("key0")
    assert OwnerDigests(b"t" * 32, ["key-a"])("key0") != before("key0")  # keyed by this data dir's secret
    assert before("addr:10.0.0.1") == after("addr:10.0.0.1") != before("addr:10.0.0.2")


def test_owner_digests_name_key_clients_as_the_authenticator_does():
    auth = Authenticator(["alpha", "bravo"], ["root"])
    digests, secret = OwnerDigests(b"s" * 32, ["alpha", "bravo"], ["root"]), b"s" * 32
    for key in ("alpha", "bravo", "root"):
        client = auth.identify(f"Bearer {key}".encode(), {}, "10.0.0.1").id
        assert digests(client) == OwnerDigests(secret, [key])("key0")


def test_a_restored_voice_is_its_owners_and_counts_toward_the_cap():
    digests = OwnerDigests(b"s" * 32, ["key-a", "key-b"])
    owners = VoiceOwners(max_per_client=1, identify=digests)
    owners.restore("alice", digests("key0"))
    assert owners.owns("alice", "key0") and owners.may_use("alice", "key0")
    assert not owners.may_use("alice", "key1") and not owners.owns("alice", "key1")
    assert owners.count("key0") == 1
    with pytest.raises(TooManyVoices):
        owners.begin("another", "key0", engine_has_it=False)


def test_an_unusable_data_dir_is_a_storage_error_that_names_it(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(StorageFailed, match="a-file"):
        VoiceStore(tmp_path / "a-file" / "data").secret()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "secret").write_bytes(b"short")
    with pytest.raises(StorageFailed, match="not a voxgate secret"):
        VoiceStore(tmp_path / "data").secret()
