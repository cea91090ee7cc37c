"""`POST /v1/chat/completions`: the embedded LLM (or `VOXGATE_LLM_URL`'s server) behind
voxgate's own gate (auth, body limit, metrics, the fair LLM limiter), streamed through.

Every LLM call the server makes (this route, the bridge's replies, the voice agent's) takes a
slot from `state.llm_limiter` first (see `serving/fair.py`): a client gets at most
`llm_max_per_client` requests running, clients take turns for the `llm_max_concurrent` slots,
and a request that cannot wait (`llm_max_waiting`, `llm_queue_timeout_s`) is refused with
503 `busy`. `ServerState.llm_config` is how those calls reach the LLM (the embedded one demands its
per-process key). Errors say what failed (`llm_unavailable`, `llm_timeout`,
`llm_bad_response`), never where: the LLM's address goes to the server log only. The LLM's
refusal of a request (400/422) keeps its status and message, in voxgate's error shape with the
code `invalid_request` (`refusal`), as every endpoint's errors are.
`GET /debug/llm` (admin) shows the limiter: requests running and waiting, and its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from voxgate.bridge.llm import REFUSALS, LLMConfig, LLMTimeout, LLMUnavailable, refusal, tls_context
from voxgate.serving.fair import Lease
from voxgate.serving.openapi import ADMIN_ERRORS, errors, sse
from voxgate.serving.state import ServerState

log = logging.getLogger(__name__)
router = APIRouter()


async def llm_slot(state: ServerState, request: Request) -> Lease | None:
    """An LLM slot for the request's client (raises `Busy`), or None if the client left while
    waiting: its place in the queue is given up then, not when its turn comes."""
    slot = asyncio.ensure_future(state.llm_limiter.acquire(request.scope["state"]["client_id"]))
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((slot, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        waiting = not slot.done()
        if waiting:
            slot.cancel()  # the waiter leaves the queue (or passes on a slot granted meanwhile)
    if waiting:
        return None
    lease = slot.result()  # raises Busy
    if gone.done() and not gone.cancelled():
        lease.release()
        return None
    return lease


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the body was read already: nothing else arrives)."""
    with contextlib.suppress(Exception):  # a broken connection is gone too
        while (await receive())["type"] != "http.disconnect":
            pass


# voxgate does not read the body: the LLM judges it, and its 400/422 refusals reach the client.
_CHAT_BODY = {
    "type": "object",
    "description": "an OpenAI chat completions request, passed to the LLM unchanged",
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "items": {"type": "object"}},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer"},
        "temperature": {"type": "number"},
    },
    "required": ["messages"],
}
LLM_ERRORS = {
    502: "llm_unavailable: the LLM cannot be reached or failed; llm_timeout; llm_bad_response",
    503: "llm_unavailable: no LLM is configured, or the embedded one failed to start; "
    "busy: the LLM queue is full (VOXGATE_LLM_MAX_WAITING) or the request waited VOXGATE_LLM_QUEUE_TIMEOUT_S",
}


@router.post(
    "/v1/chat/completions",
    response_class=Response,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _CHAT_BODY}}}},
    responses={
        200: {"description": "the LLM's answer, streamed through (`stream: true`: server-sent events)",
              "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": sse()}}},
        **errors({400: "invalid_request: the LLM refused the request (its message)",
                  422: "invalid_request: the LLM refused the request (its message)", **LLM_ERRORS}),
    },
)  # fmt: skip
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.voxgate
    config = state.llm_config()
    body = await request.body()
    lease = await llm_slot(state, request)
    if lease is None:
        return Response(status_code=499)  # nobody is listening
    try:
        return await _relay(config, body, lease)
    except BaseException:
        lease.release()
        raise


class LLMStatus(BaseModel):
    active: int
    waiting: int
    max_active: int
    max_per_client: int
    max_waiting: int
    queue_timeout_s: float


@router.get("/debug/llm", responses={200: {"model": LLMStatus}, **errors(ADMIN_ERRORS)})
async def llm_status(request: Request) -> JSONResponse:
    """The LLM limiter now (admin only, like every `/debug/` path)."""
    limiter = request.app.state.voxgate.llm_limiter
    return JSONResponse({"active": limiter.active, "waiting": limiter.waiting, "max_active": limiter.max_active,
                         "max_per_client": limiter.max_per_client, "max_waiting": limiter.max_waiting,
                         "queue_timeout_s": limiter.timeout_s})  # fmt: skip


async def _relay(config: LLMConfig, body: bytes, lease: Lease) -> Response:
    http = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0), verify=tls_context())
    url = config.base_url.rstrip("/") + "/chat/completions"
    headers = {"content-type": "application/json"}
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    try:
        upstream = await http.send(http.build_request("POST", url, content=body, headers=headers), stream=True)
    except httpx.TransportError as exc:
        await http.aclose()
        log.warning("LLM request to %s failed: %s: %s", url, type(exc).__name__, exc)
        if isinstance(exc, httpx.TimeoutException):
            raise LLMTimeout("the LLM server did not answer in time") from None
        raise LLMUnavailable(f"cannot reach the LLM server ({type(exc).__name__})") from None
    if upstream.status_code != 200:
        answer = await _read_and_close(upstream, http)
        if upstream.status_code in REFUSALS:
            raise refusal(upstream.status_code, answer)
        text = answer.decode(errors="replace")[:300]
        log.warning("LLM request to %s failed: it answered %d: %s", url, upstream.status_code, text)
        raise LLMUnavailable(f"the LLM server answered {upstream.status_code}")
    return _Relayed(lease, upstream, http)


async def _read_and_close(upstream: httpx.Response, http: httpx.AsyncClient) -> bytes:
    """A whole (error) answer, or what arrived of it before the connection failed."""
    try:
        return await upstream.aread()
    except httpx.HTTPError:
        return b""
    finally:
        await upstream.aclose()
        await http.aclose()


class _Relayed(StreamingResponse):
    """The LLM's answer streamed through as it comes; the slot and the upstream connection
    are freed when it ends, fails, or the client leaves (closing the upstream connection
    stops the LLM's generation too)."""

    def __init__(self, lease: Lease, upstream: httpx.Response, http: httpx.AsyncClient) -> None:
        self.lease, self.upstream, self.http = lease, upstream, http
        media_type = upstream.headers.get("content-type", "application/json")
        super().__init__(self._body(), status_code=upstream.status_code, media_type=media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.lease.release()
            with contextlib.suppress(Exception):
                await self.upstream.aclose()
                await self.http.aclose()

    async def _body(self) -> Any:
        try:
            async for chunk in self.upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the answer ends short; a stream's client sees no [DONE]
            log.warning("LLM answer cut: %s: %s", type(exc).__name__, exc)
