"""What `/openapi.json` says, and how it is kept true to what the server does.

voxgate's routes parse their own bodies (so that any content-type is taken and every error is
typed) and build their own responses (streamed audio, server-sent events, JSON), so FastAPI
cannot infer their description: each route declares it with `json_body`, `errors` and
`streamed`. `document_api` adds what every route shares, because the request gate and the
error handlers (`voxgate.serving.app`) do it before or after any route: 401 where keys are
required, 403 for a foreign origin, 408 for a body that does not arrive, 413 for one too
large, 400 (not FastAPI's 422) for a query parameter out of range, and the text limit of
this server. `tests/integration/test_openapi_fuzz.py` holds the description to the server.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from voxgate.config import Settings
from voxgate.serving.protocol import ErrorBody

BINARY = {"type": "string", "format": "binary"}
TEXT = {"type": "string"}
AUDIO_HEADERS = ("x-sample-rate", "x-chunk-ms", "x-request-id", "x-cache-starter", "x-audio-format")
SPEECH_EVENT = {  # /v1/audio/speech with stream_format sse: one event's data
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {"enum": ["speech.audio.delta", "speech.audio.done", "error"]},
        "audio": {"type": "string", "format": "byte", "description": "speech.audio.delta: base64 audio"},
        "usage": {"type": "object", "description": "speech.audio.done: text units in, 80 ms audio frames out"},
        "error": {"type": "object", "description": "error: {message, type, param, code}, a failure after the start"},
    },
}
_VALIDATION_REF = "#/components/schemas/HTTPValidationError"
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
ADMIN_ERRORS = {
    403: "forbidden: not an admin key (VOXGATE_ADMIN_KEYS); or a browser Origin not allowed",
    404: "not_found: the admin endpoints are off (no VOXGATE_ADMIN_KEYS)",
}


def json_body(model: type[BaseModel], required: bool = True, **examples: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` for a JSON body the route parses itself, with named example bodies.
    Nested models are inlined: the model's own `#/$defs/...` refs would resolve against the
    whole document, which has none."""
    schema = model.model_json_schema()
    media: dict[str, Any] = {"schema": _inline(schema, schema.get("$defs", {}))}
    if examples:
        media["examples"] = {name: {"value": value} for name, value in examples.items()}
    return {"requestBody": {"required": required, "content": {"application/json": media}}}


def sse(data: dict[str, Any] | None = None) -> dict[str, Any]:
    """One server-sent event (an OpenAPI 3.1 `text/event-stream` schema describes each event);
    with `data`, the event's data is JSON of that schema."""
    payload: dict[str, Any] = {"type": "string"}
    if data is not None:
        payload.update(contentMediaType="application/json", contentSchema=data)
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": payload, "event": {"type": "string"}, "id": {"type": "string"}},
    }


def errors(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for error statuses: the error body, and which codes come with each."""
    return {status: {"model": ErrorBody, "description": codes} for status, codes in described.items()}


def streamed(description: str, media: dict[str, dict[str, Any]], headers: tuple[str, ...] = ()) -> dict[str, Any]:
    """A 200 whose body is streamed in one of `media` (media type -> schema), with `headers`."""
    return {
        "description": description,
        "content": {name: {"schema": schema} for name, schema in media.items()},
        "headers": {name: {"required": True, "schema": {"type": "string"}} for name in headers},
    }


def document_api(app: FastAPI, settings: Settings, open_paths: tuple[str, ...], admin_prefix: str) -> None:
    """Make `app.openapi()` describe the gate's and the error handlers' answers on every route."""
    generate = app.openapi

    @cache
    def openapi() -> dict[str, Any]:
        schema = copy.deepcopy(generate())  # FastAPI's holds the routes' own openapi_extra dicts
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                _describe_gate(operation, settings, path in open_paths, path.startswith(admin_prefix))
        _ensure_error_schema(schema)
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "an API key (VOXGATE_API_KEYS) or, for /debug/*, an admin key (VOXGATE_ADMIN_KEYS)",
        }
        _limit_spoken_text(schema, settings.max_text_chars)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _describe_gate(operation: dict[str, Any], settings: Settings, open_path: bool, admin: bool) -> None:
    responses = operation.setdefault("responses", {})
    fastapi_422 = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if fastapi_422.get("$ref") == _VALIDATION_REF:  # FastAPI's guess; what the route can answer is below
        del responses["422"]
    if any(p.get("in") == "query" for p in operation.get("parameters", [])):  # the error handler: 400, not 422
        responses.setdefault("400", _error("invalid_request: a query parameter is not valid"))
    keyed = bool(settings.api_keys) and not open_path
    if keyed:
        responses.setdefault("401", _error("unauthorized: no API key, or not a valid one"))
        responses["401"]["headers"] = {"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}}
    responses.setdefault("403", _error("forbidden: a browser Origin not allowed, or a foreign Host on loopback"))
    responses.setdefault("408", _error("request_timeout: the body did not arrive within VOXGATE_HEADER_TIMEOUT_S"))
    responses.setdefault("413", _error("request_too_large: the body is over VOXGATE_MAX_REQUEST_BYTES"))
    if keyed or admin:
        operation["security"] = [{"bearer": []}]


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": dict(_ERROR_REF)}}}


def _ensure_error_schema(schema: dict[str, Any]) -> None:
    """`ErrorBody` in the components, which the gate's responses refer to (a route that
    declares no error of its own does not bring it), and not FastAPI's 422 models, which
    no operation refers to any more."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    if "ErrorBody" not in components:
        body = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components["ErrorBody"] = body


def _limit_spoken_text(node: Any, max_chars: int) -> None:
    """`maxLength` of this server's text limit on the fields `check_text` bounds (marked
    `x-spoken-text` in `voxgate.serving.protocol`)."""
    if isinstance(node, dict):
        if node.pop("x-spoken-text", False):
            node["maxLength"] = min(node.get("maxLength", max_chars), max_chars)
        for value in node.values():
            _limit_spoken_text(value, max_chars)
    elif isinstance(node, list):
        for value in node:
            _limit_spoken_text(value, max_chars)


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `#/$defs/X` replaced by X (voxgate's bodies have no recursive models)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return {**_inline(defs[ref.removeprefix("#/$defs/")], defs), **_inline(rest, defs)}
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node
