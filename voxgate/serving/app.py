"""The FastAPI application: state, the request gate, error mapping and start-up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from voxgate import __version__
from voxgate.config import Settings
from voxgate.engines.base import Engine
from voxgate.runtime import settle_heap
from voxgate.serving.auth import Authenticator, Client, OriginPolicy
from voxgate.serving.bridge import router as bridge_router
from voxgate.serving.bridge_ws import router as bridge_ws_router
from voxgate.serving.http import router
from voxgate.serving.lifecycle import LIFECYCLE_PATHS
from voxgate.serving.lifecycle import router as lifecycle_router
from voxgate.serving.llm import router as llm_router
from voxgate.serving.metrics import Metrics
from voxgate.serving.openapi import document_api
from voxgate.serving.page import PAGE_PATHS
from voxgate.serving.page import router as page_router
from voxgate.serving.protocol import describe_validation, error_body, error_of
from voxgate.serving.state import ServerState
from voxgate.serving.tokens import router as token_router
from voxgate.serving.ws import Gateway
from voxgate.serving.ws import router as ws_router
from voxgate.types import Forbidden, NotFound, RequestTimeout, RequestTooLarge, Unauthorized, VoxgateError

log = logging.getLogger(__name__)
_OPEN_PATHS = ("/healthz", *LIFECYCLE_PATHS, *PAGE_PATHS)  # the page is static; its API calls carry the key
_ADMIN_PREFIX = "/debug/"
_SAFE_ID = re.compile(rb"[A-Za-z0-9._:-]+")
_KNOWN_PATHS = ("/tts/stream", "/v1/audio/speech", "/v1/voices", "/healthz", "/livez", "/readyz", "/metrics",
                "/debug/timings",
                "/v1/chat/completions", "/v1/bridge/stream", "/v1/agent/offer", "/v1/auth/token")  # fmt: skip


def create_app(
    settings: Settings,
    engine: Engine | None = None,
    on_fatal: Callable[[str], None] | None = None,
    settle_heap_when_ready: bool = False,
) -> FastAPI:
    """Build the app. The engine (created from settings unless given) loads and warms up
    in the background; /healthz turns ready when that is done. If start-up fails,
    /healthz says why and `on_fatal(reason)` is called (the CLI then exits). A process
    that is all server (`voxgate serve`) settles its heap once ready (`runtime.settle_heap`)."""
    state = ServerState(settings, engine=engine)

    async def load() -> None:
        await asyncio.get_running_loop().run_in_executor(None, state.start)
        if state.startup_error and on_fatal is not None:
            on_fatal(state.startup_error)
        elif settle_heap_when_ready:
            settle_heap()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.get_running_loop().create_task(load())
        try:
            yield
        finally:
            if settings.agent_max_calls:
                from voxgate.serving.agent_http import agent_calls

                await agent_calls(app.state).close_all()
            await loader
            state.close()

    app = FastAPI(title="voxgate", version=__version__, lifespan=lifespan)
    app.state.voxgate = state
    app.state.ws_gateway = Gateway(state)
    app.include_router(router)
    app.include_router(lifecycle_router)
    app.include_router(ws_router)
    app.include_router(llm_router)
    app.include_router(bridge_router)
    app.include_router(bridge_ws_router)
    app.include_router(token_router)
    if settings.agent_max_calls:  # the voice agent over WebRTC (aiortc and av load only then)
        from voxgate.agent.service import AgentService
        from voxgate.serving.agent_http import AgentCalls
        from voxgate.serving.agent_http import router as agent_router

        app.state.agent_calls = AgentCalls(max_calls=settings.agent_max_calls, voices=state.limiter)
        app.state.agent_factory = AgentService(state)
        app.include_router(agent_router)
        app.include_router(page_router)
    _install_error_handlers(app, state.metrics)
    document_api(app, settings, _OPEN_PATHS, _ADMIN_PREFIX)
    app.add_middleware(RequestGate, settings=settings, metrics=state.metrics, auth=state.auth)
    app.add_middleware(HeadAsGet)
    return app


def error_response(exc: VoxgateError, metrics: Metrics) -> JSONResponse:
    metrics.errors.labels(exc.code).inc()
    headers = {"www-authenticate": "Bearer"} if isinstance(exc, Unauthorized) else {}
    if exc.retry_after_s is not None:
        headers["retry-after"] = str(exc.retry_after_s)
    return JSONResponse(error_of(exc), status_code=exc.status, headers=headers or None)


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def plain(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
        metrics.errors.labels(code).inc()
        return JSONResponse(error_body(code, message, status), status_code=status, headers=headers)

    @app.exception_handler(VoxgateError)
    async def on_voxgate_error(_: Request, exc: VoxgateError) -> JSONResponse:
        return error_response(exc, metrics)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return plain(400, "invalid_request", describe_validation(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # the router names one route's methods; a path may have several routes
            headers["Allow"] = ", ".join(_allowed_methods(app.routes, request.url.path))
        return plain(exc.status_code, code, str(exc.detail), headers)

    @app.exception_handler(Exception)
    async def on_bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return plain(500, "internal_error", "internal error; the server log has the details")


def _allowed_methods(routes: list[Any], path: str) -> list[str]:
    """Every method some route takes at `path`, for a 405's `Allow` (RFC 9110 15.5.6 requires
    it). FastAPI keeps an included router's routes inside it (`original_router`); voxgate
    includes its routers without a prefix, so their own path patterns apply as they are."""
    methods: set[str] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            methods.update(_allowed_methods(inner.routes, path))
        elif getattr(route, "methods", None) and route.path_regex.match(path):
            methods.update(route.methods)
    if "GET" in methods:
        methods.add("HEAD")  # `HeadAsGet`
    return sorted(methods)


class HeadAsGet:
    """HEAD is GET without the body (RFC 9110 9.3.2) on every GET route: health checks and
    monitors probe with HEAD, and FastAPI's routes take only the methods they name. Outside
    the gate, so a HEAD is admitted, counted and answered as its GET is."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def head_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, head_only)


class RequestGate:
    """Pure ASGI middleware in front of every route, HTTP and WebSocket: stamps `t_req_in`,
    identifies the client once (`voxgate.serving.auth`: key, token or address; the one
    identity every limit is keyed on), refuses foreign origins and admin paths to others,
    reads an HTTP body up to the size limit (413 beyond) within `header_timeout_s`, and
    counts responses. A refused WebSocket is accepted and closed at once with 4401 / 4403,
    so the client sees why."""

    def __init__(self, app: ASGIApp, settings: Settings, metrics: Metrics, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth
        self.origins = OriginPolicy(settings.allowed_origins, settings.host)
        self.admin_on = bool(settings.admin_keys)
        self.max_bytes = settings.max_request_bytes
        self.max_upload_bytes = settings.max_voice_upload_bytes
        self.body_timeout_s = settings.header_timeout_s
        self.ws_send_buffer = settings.ws_socket_send_buffer_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            client = self._admit(scope)
        except VoxgateError as exc:
            self.metrics.errors.labels(exc.code).inc()
            await _refuse_websocket(receive, send, 4401 if isinstance(exc, Unauthorized) else 4403, exc.message)
            return
        # The WebSocket gateway may have to drop a client that stopped reading; a close frame
        # would queue behind its unread audio, so it needs the transport (uvicorn's send is a
        # method of its protocol object; later wrappers hide it).
        state = scope.setdefault("state", {})
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if transport is not None:
            state["abort_transport"] = transport.abort
            _cap_send_buffer(transport, self.ws_send_buffer)
        state.update(client=client, client_id=client.id, t_req_in=time.perf_counter())
        await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t_req_in = time.perf_counter()
        path = scope["path"]
        endpoint = path if path in _KNOWN_PATHS else "other"
        headers = dict(scope["headers"])
        request_id = _request_id(headers.get(b"x-request-id", b""))

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
                raw = list(message.get("headers", []))
                if not any(name == b"x-request-id" for name, _ in raw):
                    message = {**message, "headers": [*raw, (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            client = self._admit(scope)
            limit = self.max_upload_bytes if path == "/v1/voices" else self.max_bytes
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read_body(receive, headers.get(b"content-length"), limit)
        except TimeoutError:
            exc = RequestTimeout(f"the request body did not arrive within {self.body_timeout_s:g} s")
            await error_response(exc, self.metrics)(scope, receive, counted_send)
            return
        except VoxgateError as exc:
            await error_response(exc, self.metrics)(scope, receive, counted_send)
            return
        scope.setdefault("state", {}).update(t_req_in=t_req_in, client=client, client_id=client.id,
                                             request_id=request_id)  # fmt: skip
        await self.app(scope, _replay(body, receive), counted_send)

    def _admit(self, scope: Scope) -> Client:
        """Origin, then identity, then the admin paths; raises the typed refusal."""
        headers = dict(scope["headers"])
        self.origins.check(headers.get(b"origin"), headers.get(b"host"), scope.get("server"))
        path = scope["path"]
        if path in _OPEN_PATHS:
            return Client(f"addr:{_peer(scope)}")
        query = _query(scope.get("query_string", b""))
        client = self.auth.identify(headers.get(b"authorization", b""), query, _peer(scope))
        if path.startswith(_ADMIN_PREFIX):
            if not self.admin_on:
                raise NotFound("not found")  # admin endpoints are off without VOXGATE_ADMIN_KEYS
            if not client.admin:
                raise Forbidden("this endpoint needs an admin key (VOXGATE_ADMIN_KEYS)")
        return client

    async def _read_body(self, receive: Receive, content_length: bytes | None, limit: int) -> bytes:
        if content_length is not None and content_length.isdigit() and int(content_length) > limit:
            raise RequestTooLarge(f"the body is {int(content_length)} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # client gone before sending the body; the route will see the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"the body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _peer(scope: Scope) -> str:
    return str((scope.get("client") or ("unknown",))[0])


def _query(raw: bytes) -> dict[str, str]:
    """The query parameters the gate reads (`api_key`, `token`); bounded, never raises."""
    if not raw or (b"api_key=" not in raw and b"token=" not in raw):
        return {}
    return {k: v for k, v in parse_qsl(raw[:4096].decode("latin-1")) if k in ("api_key", "token")}


async def _refuse_websocket(receive: Receive, send: Send, code: int, reason: str) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code, "reason": reason[:120]})


def _cap_send_buffer(transport: Any, size: int) -> None:
    """A fixed kernel send buffer for a WebSocket: left to autotuning it grows to megabytes on
    loopback, which hides a client that stopped reading from the gateway's own bounded queue
    (backpressure) and outruns the replay buffer a resume needs."""
    sock = transport.get_extra_info("socket")
    if sock is not None and size > 0:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def _request_id(given: bytes) -> str:
    """The client's x-request-id when it is sane (<= 128 safe characters), else a new one."""
    if 0 < len(given) <= 128 and _SAFE_ID.fullmatch(given):
        return given.decode()
    return uuid.uuid4().hex


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the buffered body once, then forwards (for disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
