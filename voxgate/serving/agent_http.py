"""WebRTC signalling for the voice agent: `POST /v1/agent/offer`, `DELETE /v1/agent/{call_id}`.

The offer body is `{"sdp": "...", "type": "offer"}` (what `RTCPeerConnection.createOffer()`
gives, with its ICE candidates gathered: no trickle); the answer is `{"sdp", "type",
"call_id"}`. The offerer opens the "events" data channel. Each call is a `PeerSession`,
handed to `app.state.agent_factory(session, call_id)` (set by the agent's driver; without
one, `greeting_agent` plays a short tone so the route can be tried end to end). A factory
may return an awaitable: it runs as the call's task, cancelled when the peer hangs up, and
the call is hung up when it returns. Calls are kept in `app.state.agent_calls`
(`AgentCalls`, at most `max_calls` at once: `busy` beyond). No STUN/TURN: see
`voxgate.agent.webrtc`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from voxgate.agent.webrtc import PeerSession
from voxgate.serving.protocol import parse_body
from voxgate.types import Busy, NotFound

log = logging.getLogger(__name__)
router = APIRouter()

MAX_CALLS = 8  # concurrent calls; each holds a peer connection, a VAD and a share of the engine
AgentFactory = Callable[[PeerSession, str], Awaitable[None] | None]


class OfferBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sdp: str = Field(min_length=1, max_length=60000)
    type: Literal["offer"]


class AgentCalls:
    """The live calls by id, with the concurrency limit."""

    def __init__(self, max_calls: int = MAX_CALLS) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self.max_calls = max_calls
        self.sessions: dict[str, PeerSession] = {}
        self._answering = 0  # offers being answered hold a slot too
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self.sessions)

    async def open(self, offer_sdp: str, offer_type: str, factory: AgentFactory) -> tuple[str, str, str]:
        """Answer an offer and start the call's agent; returns (call_id, answer sdp, answer type)."""
        if len(self.sessions) + self._answering >= self.max_calls:
            raise Busy(f"the agent is at its limit of {self.max_calls} concurrent calls; try again later")
        self._answering += 1
        try:
            session, sdp, sdp_type = await PeerSession.answer(offer_sdp, offer_type)
        finally:
            self._answering -= 1
        call_id = uuid.uuid4().hex
        self.sessions[call_id] = session
        try:
            agent = factory(session, call_id)
        except BaseException:
            self.sessions.pop(call_id, None)
            await session.close()
            raise
        task = asyncio.get_running_loop().create_task(self._run(call_id, session, agent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return call_id, sdp, sdp_type

    async def hang_up(self, call_id: str) -> None:
        session = self.sessions.get(call_id)
        if session is None:
            raise NotFound(f"no call {call_id!r} (hung up, failed or never started)")
        await session.close()
        self.sessions.pop(call_id, None)

    async def close_all(self) -> None:
        """Hang up every call (server shutdown)."""
        for session in list(self.sessions.values()):
            await session.close()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, call_id: str, session: PeerSession, agent: Awaitable[None] | None) -> None:
        """Keep the call until the peer leaves or its agent returns, then clean up both."""
        closed = asyncio.ensure_future(session.closed.wait())
        waiting: set[asyncio.Future[Any]] = {closed}
        if inspect.isawaitable(agent):
            waiting.add(asyncio.ensure_future(agent))
        try:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in done - {closed}:
                if not future.cancelled() and future.exception() is not None:
                    log.error("agent of call %s failed", call_id, exc_info=future.exception())
        finally:
            for future in waiting:
                future.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await session.close()
            self.sessions.pop(call_id, None)


def agent_calls(app_state: Any) -> AgentCalls:
    """The app's call registry (a default one is made on first use)."""
    if not hasattr(app_state, "agent_calls"):
        app_state.agent_calls = AgentCalls()
    return app_state.agent_calls  # type: ignore[no-any-return]


GREETING_RATE = 16000


def greeting_tone() -> np.ndarray:
    """Two short rising tones (440 Hz then 660 Hz, 0.25 s each) with soft edges."""
    t = np.arange(GREETING_RATE // 4) / GREETING_RATE
    ramp = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.01)
    return np.concatenate([0.3 * np.sin(2 * np.pi * f * t) * ramp for f in (440.0, 660.0)]).astype(np.float32)


async def greeting_agent(session: PeerSession, call_id: str) -> None:
    """The default agent: says hello with a tone and an event, then keeps the line open."""
    done = asyncio.Event()
    session.outbound.on_drained = lambda tag, t: done.set()
    session.send_event({"type": "call.started", "call_id": call_id})
    session.outbound.enqueue(greeting_tone(), GREETING_RATE, "greeting")
    session.outbound.end("greeting")
    await done.wait()
    session.send_event({"type": "greeting.done", "call_id": call_id})
    await session.closed.wait()


@router.post("/v1/agent/offer")
async def agent_offer(request: Request) -> JSONResponse:
    """Answer a WebRTC offer: a new call with the agent."""
    body = parse_body(OfferBody, await request.body())
    factory: AgentFactory = getattr(request.app.state, "agent_factory", None) or greeting_agent
    call_id, sdp, sdp_type = await agent_calls(request.app.state).open(body.sdp, body.type, factory)
    return JSONResponse({"sdp": sdp, "type": sdp_type, "call_id": call_id}, headers={"cache-control": "no-store"})


@router.delete("/v1/agent/{call_id}")
async def agent_hang_up(call_id: str, request: Request) -> JSONResponse:
    """Hang up a call."""
    await agent_calls(request.app.state).hang_up(call_id)
    return JSONResponse({"call_id": call_id, "closed": True})
