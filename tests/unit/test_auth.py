"""Client identity, keys, single-use tokens, origins and log redaction (voxgate.serving.auth)."""

from __future__ import annotations

import logging

import pytest

from voxgate.serving.auth import MAX_TOKENS_PER_CLIENT, Authenticator, Client, OriginPolicy, redact, redact_secrets
from voxgate.types import Forbidden, RateLimited, Unauthorized


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_is_known_by_its_index_and_never_by_its_value():
    auth = Authenticator(["alpha", "bravo"], ["root"])
    assert auth.identify(b"Bearer bravo", {}, "10.0.0.1") == Client("key1")
    assert auth.identify(b"Bearer root", {}, "10.0.0.1") == Client("admin0", admin=True)
    assert auth.identify(b"", {"api_key": "alpha"}, "10.0.0.1") == Client("key0")
    with pytest.raises(Unauthorized):
        auth.identify(b"Bearer wrong", {}, "10.0.0.1")
    with pytest.raises(Unauthorized):
        auth.identify(b"", {}, "10.0.0.1")


def test_without_keys_the_client_is_its_address_and_stray_keys_are_ignored():
    auth = Authenticator([], [])
    assert auth.identify(b"Bearer sk-unused", {}, "10.0.0.7") == Client("addr:10.0.0.7")
    assert auth.identify(b"Basic abc", {"token": "nope"}, "10.0.0.7") == Client("addr:10.0.0.7")


def test_admin_keys_alone_protect_only_the_admin_paths():
    auth = Authenticator([], ["root"])
    assert not auth.required
    assert auth.identify(b"", {}, "10.0.0.1") == Client("addr:10.0.0.1")
    assert auth.identify(b"Bearer root", {}, "10.0.0.1").admin


def test_a_token_opens_one_socket_as_its_key_within_its_lifetime():
    clock = Clock()
    auth = Authenticator(["alpha"], [], token_ttl_s=60, clock=clock)
    owner = auth.identify(b"Bearer alpha", {}, "10.0.0.1")
    token = auth.issue(owner)
    assert auth.identify(b"", {"token": token}, "10.9.9.9") == owner  # the key's client, not the address
    with pytest.raises(Unauthorized):
        auth.identify(b"", {"token": token}, "10.9.9.9")  # spent
    late = auth.issue(owner)
    clock.now = 61
    with pytest.raises(Unauthorized):
        auth.identify(b"", {"token": late}, "10.9.9.9")  # expired


def test_unused_tokens_per_client_are_capped():
    auth = Authenticator(["alpha", "bravo"], [])
    for _ in range(MAX_TOKENS_PER_CLIENT):
        auth.issue(Client("key0"))
    with pytest.raises(RateLimited):
        auth.issue(Client("key0"))
    auth.issue(Client("key1"))  # another client is not affected


@pytest.mark.parametrize(
    ("origin", "host", "allowed"),
    [
        (None, b"127.0.0.1:8000", True),  # not a browser
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000", True),  # the server's own page
        (b"http://evil.example", b"127.0.0.1:8000", False),
        (b"null", b"127.0.0.1:8000", False),
        (b"https://app.example.com", b"127.0.0.1:8000", True),  # listed
        (None, b"evil.example", False),  # DNS rebinding onto a loopback server
        (None, b"localhost:8000", True),
        (None, b"[::1]:8000", True),
    ],
)
def test_origins_and_hosts(origin, host, allowed):
    policy = OriginPolicy(["https://app.example.com"], "127.0.0.1")
    if allowed:
        policy.check(origin, host, ("127.0.0.1", 8000))
    else:
        with pytest.raises(Forbidden):
            policy.check(origin, host, ("127.0.0.1", 8000))


def test_a_public_server_answers_any_host_but_still_checks_origins():
    policy = OriginPolicy([], "0.0.0.0")
    policy.check(None, b"voice.example.com", ("10.0.0.2", 8000))
    with pytest.raises(Forbidden):
        policy.check(b"http://evil.example", b"voice.example.com", ("10.0.0.2", 8000))


def test_secrets_in_query_strings_are_redacted():
    assert redact('"WebSocket /v1/tts/ws?api_key=sk-123&x=1"') == '"WebSocket /v1/tts/ws?api_key=***&x=1"'
    assert redact("GET /?key=abc HTTP/1.1") == "GET /?key=*** HTTP/1.1"
    assert redact("/v1/tts/ws?token=t0k3n") == "/v1/tts/ws?token=***"
    assert redact("monkey=3") == "monkey=3"


def test_the_log_filter_redacts_arguments_and_messages(caplog):
    redact_secrets()
    logger = logging.getLogger("uvicorn.error")
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        logger.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5000", "/v1/tts/ws?api_key=sk-secret")
    assert "sk-secret" not in caplog.text and "api_key=***" in caplog.text
