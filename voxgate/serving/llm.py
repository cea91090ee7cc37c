"""`POST /v1/chat/completions`: the embedded LLM (or `VOXGATE_LLM_URL`'s server) behind
voxgate's own gate (auth, body limit, metrics), streamed through unchanged."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from voxgate.serving.protocol import error_body
from voxgate.serving.state import ServerState

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.voxgate
    base = state.llm_url()
    if base is None:
        reason = state.llm_error or "no LLM is configured (VOXGATE_LLM_EMBEDDED=false and no VOXGATE_LLM_URL)"
        return JSONResponse(error_body("llm_unavailable", reason), status_code=503)
    client = httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=5.0))
    upstream = client.build_request(
        "POST", base.rstrip("/") + "/chat/completions", content=await request.body(),
        headers={"content-type": "application/json"},
    )  # fmt: skip
    try:
        response = await client.send(upstream, stream=True)
    except httpx.TransportError as exc:
        await client.aclose()
        return JSONResponse(error_body("llm_unavailable", f"the LLM server is not reachable: {exc}"), status_code=502)

    async def close() -> None:
        await response.aclose()
        await client.aclose()

    return StreamingResponse(
        response.aiter_raw(), status_code=response.status_code,
        media_type=response.headers.get("content-type", "application/json"), background=BackgroundTask(close),
    )  # fmt: skip
