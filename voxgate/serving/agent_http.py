"""WebRTC signalling for the voice agent: `POST /v1/agent/offer`, `DELETE /v1/agent/{call_id}`.

The offer body is `{"sdp": "...", "type": "offer"}` (what `RTCPeerConnection.createOffer()`
gives, with its ICE candidates gathered: no trickle); the answer is `{"sdp", "type",
"call_id"}`. The offerer opens the "events" data channel. Each call is a `PeerSession`,
handed to `app.state.agent_factory(session, call_id, client_id)` (set by the agent's driver; without
one, `greeting_agent` plays a short tone so the route can be tried end to end). A factory
may return an awaitable: it runs as the call's task, cancelled when the peer hangs up, and
the call is hung up when it returns. Calls are kept in `app.state.agent_calls`
(`AgentCalls`). No STUN/TURN: see `voxgate.agent.webrtc`.

Limits, keyed on the client identity the request gate sets (the API key's index, else the peer
address): a call slot is taken before an offer is answered and given back once, however the call
ends (a refused or unanswerable offer, a hang-up, the peer leaving, the agent returning, or the
peer not connecting within `agent_connect_timeout_s`). At most `agent_max_calls_per_client`
slots per client (`too_many_calls`, 429) and `max_calls` in all (`busy`, 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from voxgate.agent.sdp import check_offer
from voxgate.agent.webrtc import PeerSession
from voxgate.config import Settings
from voxgate.serving.openapi import errors, json_body
from voxgate.serving.protocol import parse_body
from voxgate.speech.limits import StreamLimiter
from voxgate.types import Busy, NotFound, TooManyCalls

log = logging.getLogger(__name__)
router = APIRouter()

MAX_CALLS = 8  # concurrent calls; each holds a peer connection, a VAD and a share of the engine
AgentFactory = Callable[[PeerSession, str, str], Awaitable[None] | None]  # (session, call id, client id)


class OfferBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    sdp: str = Field(min_length=1, max_length=60000)
    type: Literal["offer"]


class Answer(BaseModel):
    sdp: str
    type: Literal["answer"]
    call_id: str


class HungUp(BaseModel):
    call_id: str
    closed: Literal[True]


@dataclass(frozen=True, slots=True)
class CallLimits:
    """What bounds one client's calls (the settings' defaults)."""

    per_client: int = 2
    connect_timeout_s: float = 15.0  # offer answered -> peer connected (ICE and DTLS), else hung up

    @classmethod
    def from_settings(cls, settings: Settings) -> CallLimits:
        return cls(settings.agent_max_calls_per_client, settings.agent_connect_timeout_s)


class CallSlots:
    """Who holds the agent's call slots (bookkeeping only: no I/O, no asyncio)."""

    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls
        self._held: Counter[str] = Counter()

    def __len__(self) -> int:
        return sum(self._held.values())

    def held_by(self, client_id: str) -> int:
        return self._held[client_id]

    def take(self, client_id: str, per_client: int) -> None:
        """Take a slot for `client_id`; a client at its own limit hears so (`TooManyCalls`)
        before it hears that everyone's is reached (`Busy`)."""
        if self._held[client_id] >= per_client:
            raise TooManyCalls(f"this client has {per_client} agent calls open, its limit; hang one up first")
        if len(self) >= self.max_calls:
            raise Busy(f"the agent is at its limit of {self.max_calls} concurrent calls; try again later")
        self._held[client_id] += 1

    def give_back(self, client_id: str) -> None:
        if self._held[client_id] < 1:
            raise ValueError(f"{client_id!r} holds no call slot")
        self._held[client_id] -= 1
        if not self._held[client_id]:
            del self._held[client_id]


class AgentCalls:
    """The live calls by id, their owners and their slots."""

    def __init__(self, max_calls: int = MAX_CALLS, voices: StreamLimiter | None = None) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be >= 1, got {max_calls}")
        self.max_calls = max_calls
        self.slots = CallSlots(max_calls)
        self.voices = voices  # the server's stream admission: a call is a session (it reserves a voice)
        self.sessions: dict[str, PeerSession] = {}
        self._owners: dict[str, str] = {}  # call id -> client id
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Slots held: the calls, and the offers being answered."""
        return len(self.slots)

    async def open(
        self,
        offer_sdp: str,
        offer_type: str,
        factory: AgentFactory,
        client_id: str = "",
        limits: CallLimits = CallLimits(),
    ) -> tuple[str, str, str]:
        """Answer an offer and start the call's agent; returns (call_id, answer sdp, answer type).
        An unusable offer is refused as such (400) before any slot is asked for (not 429)."""
        check_offer(offer_sdp)
        self.slots.take(client_id, limits.per_client)
        if self.voices is not None:
            try:
                self.voices.open_session()  # Busy past the engine's real-time voices, like a WebSocket session
            except Busy:
                self.slots.give_back(client_id)
                raise
        try:
            async with asyncio.timeout(limits.connect_timeout_s):
                session, sdp, sdp_type = await PeerSession.answer(offer_sdp, offer_type)
        except TimeoutError:
            self._give_back(client_id)
            raise Busy(f"the offer could not be answered in {limits.connect_timeout_s:g} s; try again later") from None
        except BaseException:
            self._give_back(client_id)
            raise
        call_id = uuid.uuid4().hex
        self.sessions[call_id] = session
        self._owners[call_id] = client_id
        try:
            agent = factory(session, call_id, client_id)  # the agent's LLM turns count against its client
        except BaseException:
            await self._end(call_id)
            raise
        task = asyncio.get_running_loop().create_task(self._run(call_id, session, agent, limits.connect_timeout_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return call_id, sdp, sdp_type

    async def hang_up(self, call_id: str, client_id: str | None = None) -> None:
        """Hang up a call (only its owner's, when `client_id` is given: another client's call
        is as unknown to it as one that never was)."""
        if call_id not in self.sessions or client_id not in (None, self._owners.get(call_id)):
            raise NotFound(f"no call {call_id!r} (hung up, failed or never started)")
        await self._end(call_id)

    async def close_all(self) -> None:
        """Hang up every call (server shutdown)."""
        for call_id in list(self.sessions):
            await self._end(call_id)
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _end(self, call_id: str) -> None:
        """Hang up a call and give its slot back; only the first of hang-up, peer gone, agent
        done or connect timeout does anything."""
        session = self.sessions.pop(call_id, None)
        owner = self._owners.pop(call_id, None)
        try:
            if session is not None:
                await session.close()
        finally:
            if owner is not None:
                self._give_back(owner)

    def _give_back(self, client_id: str) -> None:
        self.slots.give_back(client_id)
        if self.voices is not None:
            self.voices.close_session()

    async def _run(self, call_id: str, session: PeerSession, agent: Awaitable[None] | None, connect_s: float) -> None:
        """Keep the call until the peer leaves, its agent returns or the peer has not
        connected in `connect_s`, then clean up all of them."""
        closed = asyncio.ensure_future(session.closed.wait())
        waiting: set[asyncio.Future[Any]] = {closed}
        if inspect.isawaitable(agent):
            waiting.add(asyncio.ensure_future(agent))
        watchdog = asyncio.ensure_future(_hang_up_unless_connected(call_id, session, connect_s))
        try:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in done - {closed}:
                if not future.cancelled() and future.exception() is not None:
                    log.error("agent of call %s failed", call_id, exc_info=future.exception())
        finally:
            for future in (*waiting, watchdog):
                future.cancel()
            await asyncio.gather(*waiting, watchdog, return_exceptions=True)
            await self._end(call_id)


async def _hang_up_unless_connected(call_id: str, session: PeerSession, timeout_s: float) -> None:
    """A peer that never connects (an offer without end-of-candidates, unreachable candidates,
    a client that never applies the answer) would hold its slot for as long as aiortc keeps
    trying: forever without `a=end-of-candidates`, about a minute with it."""
    if not await session.wait_connected(timeout_s):
        log.info("call %s: no connection in %g s (%s); hanging up", call_id, timeout_s, session.pc.connectionState)
        await session.close()


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


async def greeting_agent(session: PeerSession, call_id: str, client: str = "") -> None:
    """The default agent: says hello with a tone and an event, then keeps the line open."""
    done = asyncio.Event()
    session.outbound.on_drained = lambda tag, t: done.set()
    session.send_event({"type": "call.started", "call_id": call_id})
    session.outbound.enqueue(greeting_tone(), GREETING_RATE, "greeting")
    session.outbound.end("greeting")
    await done.wait()
    session.send_event({"type": "greeting.done", "call_id": call_id})
    await session.closed.wait()


@router.post(
    "/v1/agent/offer",
    openapi_extra=json_body(OfferBody),
    responses={
        200: {"model": Answer},
        **errors({
            400: "invalid_request; invalid_sdp: an offer that is not usable SDP",
            429: "too_many_calls: this client has VOXGATE_AGENT_MAX_CALLS_PER_CLIENT calls open",
            503: "busy: the agent has VOXGATE_AGENT_MAX_CALLS calls open, or the offer could not be answered in time",
        }),
    },
)  # fmt: skip
async def agent_offer(request: Request) -> JSONResponse:
    """Answer a WebRTC offer: a new call with the agent."""
    body = parse_body(OfferBody, await request.body())
    factory: AgentFactory = getattr(request.app.state, "agent_factory", None) or greeting_agent
    limits = CallLimits.from_settings(request.app.state.voxgate.settings)
    calls = agent_calls(request.app.state)
    call_id, sdp, sdp_type = await calls.open(body.sdp, body.type, factory, _client_id(request), limits)
    return JSONResponse({"sdp": sdp, "type": sdp_type, "call_id": call_id}, headers={"cache-control": "no-store"})


@router.delete(
    "/v1/agent/{call_id}",
    responses={200: {"model": HungUp}, **errors({404: "not_found: no such call of this client's"})},
)
async def agent_hang_up(call_id: str, request: Request) -> JSONResponse:
    """Hang up a call (the caller's own only)."""
    await agent_calls(request.app.state).hang_up(call_id, _client_id(request))
    return JSONResponse({"call_id": call_id, "closed": True})


def _client_id(request: Request) -> str:
    """The client identity every limit is keyed on (set by the request gate)."""
    return str(request.scope["state"]["client_id"])
