"""`POST /v1/auth/token`: a short-lived, single-use token for one WebSocket upgrade.

Browsers cannot set `Authorization` on a WebSocket, and a long-lived key in a URL ends up in
proxies' logs and the browser's history; this trades the key (sent as a header, over
`fetch`) for a token that opens one socket (`?token=...`) within `VOXGATE_AUTH_TOKEN_TTL_S`
and then is spent. The socket belongs to the key the token was issued to.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from voxgate.serving.auth import MAX_TOKENS_PER_CLIENT, Client
from voxgate.serving.openapi import errors
from voxgate.serving.state import ServerState

router = APIRouter()


class Token(BaseModel):
    token: str = Field(description="for one WebSocket upgrade: `?token=...`")
    token_type: Literal["websocket"]
    expires_in: float = Field(description="seconds (VOXGATE_AUTH_TOKEN_TTL_S)")


@router.post(
    "/v1/auth/token",
    responses={
        200: {"model": Token},
        **errors({429: f"rate_limited: this client holds {MAX_TOKENS_PER_CLIENT} unused tokens"}),
    },
)
async def issue_token(request: Request) -> JSONResponse:
    """A single-use WebSocket token for the calling client (its key, else its address)."""
    state: ServerState = request.app.state.voxgate
    client: Client = request.scope["state"]["client"]
    token = state.auth.issue(client)
    body = {"token": token, "token_type": "websocket", "expires_in": state.settings.auth_token_ttl_s}
    return JSONResponse(body, headers={"cache-control": "no-store"})
