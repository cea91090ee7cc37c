"""The WebSocket message parsers, fuzzed without a server: any text frame is a typed message
or a `ProtocolError` with a code, never another exception (which would end the socket with
1006 and a traceback). The same properties run against a real server in
tests/integration/test_fuzz_sockets.py."""

from __future__ import annotations

import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.socket_fuzz import BRIDGE_MESSAGES, JSON_VALUES, OMNI_MESSAGES, mutated
from voxgate.serving import bridge_ws
from voxgate.serving.wsproto import ProtocolError, parse_client

LIMIT = 65536


def _parses_or_refuses(raw: str) -> None:
    for parse in (lambda r: parse_client(r, LIMIT), lambda r: parse_client(r, LIMIT, compat=True),
                  lambda r: bridge_ws.parse(r, LIMIT)):  # fmt: skip
        try:
            parse(raw)
        except ProtocolError as exc:
            assert exc.code and isinstance(exc.message, str)
            json.dumps(exc.to_message()).encode()  # it can go on the wire


@settings(max_examples=1500, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    message=st.one_of(
        JSON_VALUES,
        mutated(OMNI_MESSAGES),
        mutated(BRIDGE_MESSAGES),
        st.fixed_dictionaries({"type": JSON_VALUES}),  # a list or an object as the type: unhashable
    )
)
def test_any_json_is_a_message_or_a_protocol_error(message: object) -> None:
    _parses_or_refuses(json.dumps(message))


def test_json_nested_to_any_depth_is_a_message_or_a_protocol_error() -> None:
    """Every depth up to past the recursion limit, with a UTF-16 escape that makes the parser
    look for lone surrogates: where `json.loads` just succeeded, re-encoding the value to look
    raised RecursionError."""
    for depth in range(1, sys.getrecursionlimit() + 200):
        _parses_or_refuses('{"type": "ping", "x": "\\ud83d\\ude00", "id": ' + "[" * depth + "]" * depth + "}")
