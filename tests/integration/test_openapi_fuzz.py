"""The HTTP API does what its `/openapi.json` says, under a bounded schemathesis fuzz (issue 16).

Real `voxgate serve` processes (tone engine, the embedded LLM off, so `/v1/chat/completions`
and `/v1/bridge/stream` answer their documented 503 `llm_unavailable`): one without API keys,
one with keys, fuzzed with the admin key (every route open, `/debug/*` included) and with a
wrong key (401 everywhere but `/healthz`). See `openapi_fuzz.py` for what is judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator

from tests.integration.openapi_fuzz import Report, fuzz
from voxgate.bench.server import ServerProcess

EXAMPLES = 25  # per operation and mode (valid, invalid): ~750 requests a pass
OPERATIONS = {
    "POST /tts/stream", "POST /v1/audio/speech", "GET /v1/voices", "POST /v1/voices", "DELETE /v1/voices/{voice_id}",
    "GET /healthz", "GET /livez", "GET /readyz", "GET /metrics", "GET /debug/timings", "GET /debug/llm",
    "POST /v1/chat/completions",
    "POST /v1/bridge/stream", "POST /v1/bridge/{reply_id}/stop", "POST /v1/auth/token", "POST /v1/agent/offer",
    "DELETE /v1/agent/{call_id}",
}  # fmt: skip


@pytest.fixture(scope="module")
def open_server() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"MAX_TEXT_CHARS": "300"}) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[ServerProcess]:
    with ServerProcess("tone", env={"API_KEYS": "fuzz-key-1,fuzz-key-2", "MAX_TEXT_CHARS": "300"}) as server:
        yield server


def assert_clean(report: Report) -> None:
    assert report.operations() >= OPERATIONS, f"not fuzzed: {OPERATIONS - report.operations()}"
    assert not report.findings, f"{len(report.findings)} distinct findings:\n{report.summary()}"


def test_every_operation_keeps_its_documented_contract_without_keys(open_server):
    report = fuzz(open_server.url, {}, EXAMPLES)
    assert_clean(report)
    assert report.statuses[("POST /tts/stream", 200)] > 0  # valid requests are spoken, not only refused


def test_every_operation_keeps_its_documented_contract_for_the_admin(keyed_server):
    report = fuzz(keyed_server.url, keyed_server.admin_headers(), EXAMPLES)
    assert_clean(report)
    assert report.statuses[("GET /debug/timings", 200)] > 0


def test_a_wrong_key_gets_the_documented_401_on_every_operation_but_health(keyed_server):
    wrong = {"authorization": "Bearer not-a-key"}
    report = fuzz(keyed_server.url, wrong, 5, schema_headers=keyed_server.auth_headers())
    assert_clean(report)
    health = {"GET /healthz", "GET /livez", "GET /readyz"}  # open, as a probe must be
    assert {status for (op, status) in report.statuses if op not in health} == {401}


def test_every_ref_in_the_description_resolves(open_server):
    spec = httpx.get(f"{open_server.url}/openapi.json", timeout=10).json()
    refs = list(_refs(spec))
    assert refs and all(_resolves(spec, ref) for ref in refs), [ref for ref in refs if not _resolves(spec, ref)]


def test_the_description_is_a_valid_openapi_3_1_document(open_server):
    """Checked by openapi-spec-validator (the OpenAPI Initiative's schemas), not by our reading."""
    spec = httpx.get(f"{open_server.url}/openapi.json", timeout=10).json()
    assert spec["openapi"].startswith("3.1")
    errors = [f"{list(e.path)}: {e.message[:300]}" for e in OpenAPIV31SpecValidator(spec).iter_errors()]
    assert not errors, "\n".join(errors[:20])


SPEECH = {"model": "tts-1", "input": "Hello there.", "voice": "alloy"}
REFUSED = [  # (path, body): refused by the server (400 or 413), so the documented request schema must refuse it
    ("/tts/stream", {"text": ""}),
    ("/tts/stream", {"text": " \n\t "}),
    ("/tts/stream", {"text": "a\u0000b"}),
    ("/tts/stream", {"text": "Okay, then\u0007"}),
    ("/tts/stream", {"text": "x" * 301}),
    ("/tts/stream", {"text": "hi", "format": "webm"}),
    ("/v1/audio/speech", {**SPEECH, "input": ""}),
    ("/v1/audio/speech", {**SPEECH, "input": "\u009f"}),
    ("/v1/audio/speech", {**SPEECH, "response_format": "webm"}),
    ("/v1/audio/speech", {**SPEECH, "stream_format": "ws"}),
]


@pytest.mark.parametrize(("path", "body"), REFUSED)
def test_the_request_schema_refuses_what_the_server_refuses(open_server, path, body):
    spec = httpx.get(f"{open_server.url}/openapi.json", timeout=10).json()
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert httpx.post(f"{open_server.url}{path}", json=body, timeout=30).status_code in (400, 413)
    assert not jsonschema_rs.Draft202012Validator(schema).is_valid(body)
    good = {"text": "Hello there."} if path == "/tts/stream" else SPEECH
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(good)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _resolves(spec: dict[str, Any], ref: str) -> bool:
    node: Any = spec
    if not ref.startswith("#/"):
        return False
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("PUT", "/tts/stream", "POST"), ("DELETE", "/v1/voices", "GET, HEAD, POST"), ("GET", "/v1/voices/alice", "DELETE"),
     ("HEAD", "/tts/stream", "POST")],
)  # fmt: skip
def test_a_method_the_route_lacks_is_405_with_the_allowed_methods(open_server, method, path, allow):
    r = httpx.request(method, f"{open_server.url}{path}", timeout=10)
    assert r.status_code == 405
    assert r.headers.get("allow") == allow
    assert r.json()["error"]["code"] == "method_not_allowed" if method != "HEAD" else not r.content


def test_deleting_an_unknown_voice_is_a_typed_404(open_server):
    """The tone engine cannot clone, so it has no voice to delete: `not_found`, as the README
    says, not `not_supported`. (A trailing slash keeps FastAPI's redirect to the route without
    it: clients and monitors written against that stay working.)"""
    r = httpx.delete(f"{open_server.url}/v1/voices/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz", "/v1/voices", "/metrics"])
def test_head_answers_as_get_without_the_body(open_server, path):
    got = httpx.get(f"{open_server.url}{path}", timeout=10)
    head = httpx.head(f"{open_server.url}{path}", timeout=10)
    assert head.status_code == got.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
