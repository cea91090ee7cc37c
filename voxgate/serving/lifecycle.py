"""Liveness, readiness and the drain: what an orchestrator (Kubernetes, Ray Serve, a load
balancer) asks a server, and how the server leaves without cutting speech short.

`/livez` answers from the event loop alone (the process is up and serving requests): it never
touches the engine, so a slow warm-up or a full server is never mistaken for a dead one.
`/readyz` says whether a new session would be taken now: the engine warm, not draining, and a
free voice (`StreamLimiter`). `/healthz` stays as it was for the scripts that read it.

`drain` is the shutdown order: refuse new sessions and streams (`server_draining`, 503), let
what runs finish within `VOXGATE_DRAIN_S`, then end every WebSocket session with a fatal
`server_draining` error, so a client hears why and opens a new session elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from voxgate.serving.state import ServerState

router = APIRouter()
LIFECYCLE_PATHS = ("/livez", "/readyz")
_POLL_S = 0.05  # how often the drain looks at what still runs


class Alive(BaseModel):
    status: str = Field("alive")


class Readiness(BaseModel):
    ready: bool = Field(description="a new session or stream would be taken now")
    warm: bool = Field(description="the engine is loaded and warmed up")
    draining: bool = Field(description="shutting down: new sessions and streams are refused")
    free_slots: int = Field(description="voices free now (engine capacity or max_streams, less those in use)")
    active_streams: int
    stream_slots: int
    sessions: int = Field(description="WebSocket TTS sessions held (attached or waiting for a resume)")
    reason: str | None = Field(None, description="why not ready: starting, failed, draining or full")


@router.get("/livez", responses={200: {"model": Alive, "description": "the process serves requests"}})
async def livez() -> JSONResponse:
    return JSONResponse({"status": "alive"})


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness, "description": "ready for new sessions"},
        503: {"model": Readiness, "description": "starting, failed, draining or full"},
    },
)
async def readyz(request: Request) -> JSONResponse:
    body = readiness(request.app.state.voxgate, len(request.app.state.ws_gateway.sessions))
    return JSONResponse(body, status_code=200 if body["ready"] else 503)


def readiness(state: ServerState, sessions: int) -> dict[str, Any]:
    """The `/readyz` body: ready only when warm, not draining and with a free voice."""
    warm = state.ready and state.startup_error is None
    limit = state.limiter.limit
    free = max(0, limit - state.limiter.voices) if warm else 0
    reason = None
    if state.startup_error:
        reason = "failed"
    elif not warm:
        reason = "starting"
    elif state.draining:
        reason = "draining"
    elif free == 0:
        reason = "full"
    return {"ready": reason is None, "warm": warm, "draining": state.draining, "free_slots": free,
            "active_streams": state.limiter.active, "stream_slots": limit, "sessions": sessions,
            "reason": reason}  # fmt: skip


async def drain(app_state: Any, drain_s: float, cut_short: Callable[[], bool] = lambda: False) -> bool:
    """Refuse new work, wait up to `drain_s` for what runs to finish (sooner if `cut_short()`
    turns true: a second Ctrl-C), then end the WebSocket sessions with `server_draining`.
    Returns True when everything finished within the time."""
    state: ServerState = app_state.voxgate
    gateway = app_state.ws_gateway
    state.draining = True
    deadline = time.monotonic() + drain_s
    idle = False
    while not cut_short():
        idle = state.limiter.active == 0 and gateway.idle()
        if idle or time.monotonic() >= deadline:
            break
        await asyncio.sleep(_POLL_S)
    await gateway.close_all("server_draining", "the server is shutting down; open a new session")
    return idle
