"""What each socket's parser calls a frame without a usable `type` (docs/protocol.md: a missing
or wrong field is `invalid_message`; `unknown_type` is a type the server does not know)."""

from __future__ import annotations

import pytest

from voxgate.serving import bridge_ws
from voxgate.serving.omni import parse_omni
from voxgate.serving.wsproto import ProtocolError, parse_client

LIMIT = 4096
PARSERS = {
    "tts": lambda raw: parse_client(raw, LIMIT),
    "tts_compat": lambda raw: parse_client(raw, LIMIT, compat=True),
    "omni": lambda raw: parse_omni(raw, LIMIT),
    "bridge": lambda raw: bridge_ws.parse(raw, LIMIT),
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"text": "hello "}', "invalid_message"),  # no type
        ('{"type": null}', "invalid_message"),
        ('{"type": 5}', "invalid_message"),
        ('{"type": ["ping"]}', "invalid_message"),
        ("[1, 2]", "invalid_message"),
        ('"ping"', "invalid_message"),
        ('{"type": "shout"}', "unknown_type"),
    ],
)
def test_a_frame_without_a_type_string_is_invalid_and_an_unknown_type_is_unknown(parser, raw, code):
    with pytest.raises(ProtocolError) as refused:
        PARSERS[parser](raw)
    assert refused.value.code == code and not refused.value.fatal
    if code == "invalid_message":
        assert "type" in refused.value.message


@pytest.mark.parametrize("content", ["hi\\u0000", "bell\\u0007", "lone \\ud800"])
def test_the_bridge_socket_refuses_control_characters_in_a_user_turn_as_http_does(content):
    with pytest.raises(ProtocolError) as refused:
        bridge_ws.parse('{"type": "user", "content": "' + content + '"}', LIMIT)
    message = refused.value.message
    assert refused.value.code == "invalid_message" and ("content" in message or "surrogate" in message)
    assert isinstance(bridge_ws.parse('{"type": "user", "content": "hi there"}', LIMIT), bridge_ws.User)
