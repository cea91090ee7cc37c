"""The cloned-voice owner registry: one client's voice is never another's to take, use or drop."""

from __future__ import annotations

import pytest

from voxgate.serving.voices import VoiceOwners
from voxgate.types import TooManyVoices, VoiceExists


def test_a_voice_id_belongs_to_the_client_that_claimed_it():
    owners = VoiceOwners(max_per_client=4)
    owners.begin("alice", "key0", engine_has_it=False)
    owners.end("alice", engine_has_it=True)
    with pytest.raises(VoiceExists):
        owners.begin("alice", "key1", engine_has_it=True)
    assert owners.owns("alice", "key0") and not owners.owns("alice", "key1")
    assert owners.may_use("alice", "key0") and not owners.may_use("alice", "key1")
    assert owners.may_use("alice", None)  # the server's own work checks nothing
    owners.begin("alice", "key0", engine_has_it=True)  # the owner re-registers: a replacement
    owners.end("alice", engine_has_it=True)
    assert owners.count("key0") == 1


def test_the_per_client_cap_counts_registered_and_in_flight_voices():
    owners = VoiceOwners(max_per_client=2)
    owners.begin("a", "key0", engine_has_it=False)
    owners.end("a", engine_has_it=True)
    owners.begin("b", "key0", engine_has_it=False)  # still in flight
    with pytest.raises(TooManyVoices):
        owners.begin("c", "key0", engine_has_it=False)
    owners.begin("c", "key1", engine_has_it=False)  # another client has its own cap
    owners.end("b", engine_has_it=True)
    owners.forget("a")
    owners.begin("c2", "key0", engine_has_it=False)
    assert owners.count("key0") == 2 and owners.count("key1") == 1


def test_a_failed_first_upload_frees_the_id_but_a_failed_replacement_keeps_it():
    owners = VoiceOwners(max_per_client=4)
    owners.begin("x", "key0", engine_has_it=False)
    owners.end("x", engine_has_it=False)  # bad audio: nothing registered
    assert owners.count("key0") == 0
    owners.begin("x", "key1", engine_has_it=False)
    owners.end("x", engine_has_it=True)
    owners.begin("x", "key1", engine_has_it=True)
    owners.end("x", engine_has_it=True)  # bad audio again: the old voice is still there, and still key1's
    assert owners.owns("x", "key1")


def test_a_delete_racing_the_owners_reupload_never_leaves_the_voice_ownerless():
    owners = VoiceOwners(max_per_client=4)
    owners.begin("x", "key0", engine_has_it=False)
    owners.end("x", engine_has_it=True)
    owners.begin("x", "key0", engine_has_it=True)  # re-upload in flight...
    owners.forget("x")  # ...while the owner deletes it
    with pytest.raises(VoiceExists):
        owners.begin("x", "key1", engine_has_it=False)
    owners.end("x", engine_has_it=True)  # the re-upload registered it again
    assert owners.owns("x", "key0")


def test_the_servers_own_voices_are_everyones_to_use_and_nobodys_to_replace():
    owners = VoiceOwners(max_per_client=4)
    assert owners.may_use("vivian", "key0") and not owners.owns("vivian", "key0")
    with pytest.raises(VoiceExists, match="server's own"):
        owners.begin("vivian", "key0", engine_has_it=True)
    assert owners.count("key0") == 0


def test_a_cap_of_zero_turns_cloning_off():
    with pytest.raises(TooManyVoices):
        VoiceOwners(max_per_client=0).begin("x", "key0", engine_has_it=False)
