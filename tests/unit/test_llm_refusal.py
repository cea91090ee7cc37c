"""An LLM's refusal of a chat request, in whatever shape its server writes it, becomes voxgate's
`invalid_request` with the LLM's status and message (`serving/llm.py`)."""

from __future__ import annotations

import json

import pytest

from voxgate.serving.llm import refusal
from voxgate.serving.protocol import error_of


@pytest.mark.parametrize(
    ("status", "body", "message", "param"),
    [
        (400, {"error": {"code": 400, "message": "Expected 'messages' to be an array",
                         "type": "invalid_request_error"}}, "Expected 'messages' to be an array", None),  # llama.cpp
        (400, {"error": {"message": "max_tokens is negative", "type": "invalid_request_error", "param": "max_tokens",
                         "code": None}}, "max_tokens is negative", "max_tokens"),  # OpenAI
        (422, {"detail": [{"loc": ["body", "messages"], "msg": "field required"}]},
         '[{"loc": ["body", "messages"], "msg": "field required"}]', None),  # a FastAPI server
        (400, {"error": "bad request"}, "bad request", None),
        (400, "not JSON at all", "not JSON at all", None),
        (422, "", "the LLM refused the request (422)", None),
    ],
)  # fmt: skip
def test_a_refusal_keeps_the_llms_status_and_message_under_a_stable_code(status, body, message, param):
    raw = (body if isinstance(body, str) else json.dumps(body)).encode()
    error = refusal(status, raw)
    assert error.status == status
    assert error_of(error) == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                         "code": "invalid_request"}}  # fmt: skip


def test_a_long_refusal_is_cut():
    error = refusal(400, json.dumps({"error": {"message": "x" * 10_000}}).encode())
    assert 0 < len(error.message) <= 500
