"""The WebSocket TTS gateway (`/v1/tts/ws`, and `/v1/audio/speech/stream` for vLLM-Omni's
message names): the I/O around the pure `Session` (docs/protocol.md has the protocol).

Per socket, a reader parses messages and applies them to its session; per attached socket a
writer sends the session's log from its cursor (replies such as `pong` and errors first),
pacing audio when asked. Per session, a synthesiser takes segments in order through the
engine and logs their audio; when the unsent output is over its bound it waits, warns the
client (`backpressure`) and finally drops the socket. A dropped session waits
`ws_resume_window_s` for a resume; `Gateway.janitor` ends it after that.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from voxgate.audio import FORMATS
from voxgate.audio_encode import make_encoder
from voxgate.serving.auth import Client
from voxgate.serving.limits import MessageRate, Turn
from voxgate.serving.omni import OmniConfig, OmniFraming, parse_omni
from voxgate.serving.session import Entry, Segment, Session
from voxgate.serving.state import ServerState, StreamPlan
from voxgate.serving.ws_live import CONTROL_BYTES, Live, abort, close_quietly, send_now, send_then_close
from voxgate.serving.wsproto import (
    Bare,
    Ping,
    ProtocolError,
    SessionStart,
    TextDelta,
    check_session_id,
    error,
    parse_client,
)
from voxgate.speech.clock import PlaybackClock, StartWatch
from voxgate.speech.pieces import cut_audio
from voxgate.speech.stream import EngineStream
from voxgate.types import Busy, Preempted, VoxgateError

log = logging.getLogger(__name__)
# The socket's formats (`session.start` `format`): PCM and mu-law, and the compressed ones whose
# streams may be joined end to end (FLAC may not: each stream starts with its own header).
WS_FORMATS = (*(f for f in FORMATS if f != "wav"), "mp3", "opus", "aac")
DETACHED_PRIORITY = -100  # the lowest a request may ask for (HTTP allows -100..100)
# The most audio one `audio` message carries: an engine's longer chunk (piper's: a sentence) is
# cut, so pacing holds audio back within a segment and a cancel stops it within a piece. Above
# qwen3's 80 ms frames, which go out as they come.
WS_PIECE_MS = 200
SESSION_HEADER = "x-voxgate-session"  # the connect's session key (browsers cannot set headers: ?session=)
DRAIN_CLOSE = 1012  # "service restart": the server is going; open the session again elsewhere
# A listener with less audio in hand than twice a segment's recent worst start (within these
# bounds; `speech/clock.py`'s StartWatch) and nothing more coming is starving: the next segment is
# cut at once, sized like a starter (`Session.starved`).
STARVING_S = (0.15, 0.6)
router = APIRouter()


@router.websocket("/v1/tts/ws")
async def tts_socket(websocket: WebSocket) -> None:
    await _gateway(websocket).serve(websocket, compat=False)


@router.websocket("/v1/audio/speech/stream")
async def compat_socket(websocket: WebSocket) -> None:
    await _gateway(websocket).serve(websocket, compat=True)


def until_starving(clock: PlaybackClock, attached: bool, now: float, starving_s: float) -> float | None:
    """Seconds until the listener has less than `starving_s` of audio in hand (<= 0: it has
    now); None when no listener is attached or it has had no audio yet."""
    if not attached or clock.end is None:
        return None
    return clock.buffered(now) - starving_s


def next_check(clock: PlaybackClock, attached: bool, idle: float, now: float, starving_s: float) -> float:
    """How long a session's synthesiser may sleep with no segment: until the idle flush could be
    due (at most 0.2 s), or sooner, the moment its listener starts starving (under `starving_s`
    in hand), so the cut that starving allows is made then, not a poll or a delta later (a
    listener of text at 5 words a second would run dry in that wait)."""
    wait = min(idle, 0.2)
    ahead = until_starving(clock, attached, now, starving_s)
    if ahead is not None and ahead > 0:
        wait = min(wait, ahead + 0.001)
    return wait


def session_key(websocket: WebSocket) -> str | None:
    """The connect's session key (`?session=`, else the `X-Voxgate-Session` header), checked;
    the key a proxy routes by (Ray Serve: voxgate.cluster), so one socket cannot name two."""
    query = websocket.query_params.get("session")
    header = websocket.headers.get(SESSION_HEADER)
    if query is not None and header is not None and query != header:
        raise ProtocolError("invalid_session_id", "?session= and X-Voxgate-Session name different sessions",
                            fatal=True)  # fmt: skip
    key = query if query is not None else header
    return None if key is None else check_session_id(key, fatal=True)


def _gateway(websocket: WebSocket) -> Gateway:
    gateway: Gateway = websocket.app.state.ws_gateway  # made with the app (create_app)
    return gateway


class Gateway:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.settings = state.settings
        self.sessions: dict[str, Live] = {}
        self.sockets: set[WebSocket] = set()  # open sockets, with a session or not (a drain closes each)
        self._janitor: asyncio.Task[None] | None = None
        self.starts = StartWatch(*STARVING_S)  # how long segments take to start: when a listener starves
        state.metrics.ws_sessions.set_function(lambda: len(self.sessions))
        state.metrics.ws_detached.set_function(
            lambda: sum(live.socket is None for live in list(self.sessions.values()))
        )
        state.metrics.ws_tasks.set_function(self.task_count)
        state.metrics.ws_starving.set_function(self.starts.threshold)

    # ------------------------------------------------------------------ one socket

    async def serve(self, websocket: WebSocket, compat: bool) -> None:
        await websocket.accept()
        client: Client = websocket.scope["state"]["client"]  # authenticated by RequestGate
        rate = MessageRate(self.settings.ws_messages_per_s, self.settings.ws_message_burst)
        turn = Turn()
        try:
            key = session_key(websocket)
        except ProtocolError as exc:
            self.state.metrics.errors.labels(exc.code).inc()
            await send_then_close(websocket, exc.to_message())
            return
        self._start_janitor()
        live: Live | None = None
        self.sockets.add(websocket)
        try:
            while True:
                frame = await websocket.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                if live is not None and live.socket is not websocket:
                    break  # resumed elsewhere (or dropped) while this frame waited: it is not ours to apply
                raw = frame.get("text") if frame.get("text") is not None else frame.get("bytes", b"")
                try:
                    if not rate.take(time.monotonic(), len(raw)):
                        raise ProtocolError("rate_limited", "too many messages; the socket is closed", fatal=True)
                    limit = self.settings.ws_max_message_bytes
                    message = parse_omni(raw, limit) if compat else parse_client(raw, limit)
                    live = await self._apply(message, live, websocket, client, key)
                except (ProtocolError, VoxgateError) as exc:
                    reply = exc.to_message() if isinstance(exc, ProtocolError) else error(exc.code, exc.message)
                    self.state.metrics.errors.labels(reply["code"]).inc()
                    if reply["fatal"] and live is not None and live.socket is websocket:
                        await self._close_via_writer(live, websocket, reply)
                        break
                    if reply["fatal"]:
                        await send_then_close(websocket, reply)
                        break
                    if live is not None and live.socket is websocket:
                        self._reply(live, reply)
                    else:
                        await send_now(websocket, reply)
                if live is not None and live.socket is not websocket:
                    break  # replaced by a resume on another socket, or dropped for backpressure
                await turn.end()  # frames already queued return without yielding: let others run
        except WebSocketDisconnect:
            pass
        except Exception:  # a bug must cost this socket only
            log.exception("websocket session failed")
        finally:
            self.sockets.discard(websocket)
            if live is not None:
                self._detach(live, websocket)

    async def _close_via_writer(self, live: Live, websocket: WebSocket, reply: dict[str, Any]) -> None:
        """A fatal error on a socket with a session: the writer sends it after the frame it is
        sending (an audio header is never parted from its bytes), then closes (1008). A client
        that does not read gets a second, then the socket goes like any other (finally: detach)."""
        live.close_code = 1008
        live.reply(reply)
        writer = live.writer
        if writer is not None:
            await asyncio.wait({writer}, timeout=1.0)

    def _reply(self, live: Live, message: dict[str, Any]) -> None:
        """Queue a reply within the session's bound; a client that leaves more than
        `CONTROL_BYTES` of replies unread on top of a full audio queue is not reading: dropped."""
        live.reply(message)
        if live.unread_bytes() > self.settings.ws_send_queue_bytes + CONTROL_BYTES and live.socket is not None:
            self._drop(live, live.socket, "the client does not read its replies")

    async def _apply(
        self, message: Any, live: Live | None, websocket: WebSocket, client: Client, key: str | None
    ) -> Live | None:
        if isinstance(message, Ping):
            reply = {"type": "pong", "id": message.id}
            if live is not None and live.socket is websocket:
                self._reply(live, reply)
            else:
                await send_now(websocket, reply)
            return live
        if isinstance(message, OmniConfig):
            if live is None:
                return self._open(message.session_start(), websocket, client, key, omni=message)
            self._reconfigure(live, message, client)
            return live
        if isinstance(message, SessionStart):
            if live is not None:
                raise ProtocolError("session_exists", "this socket already has a session")
            if message.resume:
                return self._resume(message, websocket, client, key)
            return self._open(message, websocket, client, key)
        if live is None:
            raise ProtocolError("no_session", "send session.start first (session.config on vLLM-Omni's path)")
        session = live.session
        now = time.perf_counter()
        if isinstance(message, TextDelta):
            if self._starving(live, now):
                session.starved(now)
                if session.speakable:  # cut now: the synthesiser hears of it even if the delta is refused
                    live.work.set()
            session.delta(message, now)
            if not session.speakable:
                return live  # text gathered: nothing new for the synthesiser or the writer
        elif isinstance(message, Bare) and message.type == "text.flush":
            session.flush(now)
        elif isinstance(message, Bare) and message.type == "text.end":
            session.end(now)
        elif isinstance(message, Bare) and message.type == "session.end":
            session.finish()
        elif isinstance(message, Bare) and message.type == "cancel":
            session.cancel()
            live.clock.reset()  # barge-in: the listener drops what it had, the next utterance is due now
            if live.stream is not None:
                live.stream.cancel("cancelled")
            live.room.set()
            if live.unread_bytes() > self.settings.ws_send_queue_bytes + CONTROL_BYTES:
                self._drop(live, websocket, "the client does not read")
        live.work.set()
        live.wake.set()
        return live

    # ------------------------------------------------------------------ sessions

    def _open(
        self, start: SessionStart, websocket: WebSocket, client: Client, key: str | None, omni: OmniConfig | None = None
    ) -> Live:
        if self.state.draining:
            raise ProtocolError(
                "server_draining", "the server is shutting down; open the session elsewhere", fatal=True
            )
        if len(self.sessions) >= self.settings.ws_max_sessions:
            raise ProtocolError("too_many_sessions", f"the server holds {len(self.sessions)} sessions", fatal=True)
        plan = self._plan(start, client)
        session_id = self._new_id(start.session_id, key)
        self.state.sessions.open(client.id)  # TooManySessions: the socket stays open
        try:
            self.state.limiter.open_session()  # Busy past the engine's real-time voices (the socket stays open)
        except Busy:
            self.state.sessions.close(client.id)
            raise
        s = self.settings
        session = Session(session_id, start, plan.sample_rate, s.ws_replay_bytes, s.max_text_chars,
                          s.ws_text_queue_chars)  # fmt: skip
        framing = OmniFraming(omni, plan.sample_rate) if omni is not None else None
        live = Live(session, plan, owner=client.id, resume_token=secrets.token_urlsafe(24), omni=framing, reserved=True)
        self.sessions[session_id] = live
        live.synth = asyncio.get_running_loop().create_task(self._synthesise(live))
        self._attach(live, websocket, resumed=False)
        return live

    def _new_id(self, chosen: str | None, key: str | None) -> str:
        """The new session's id: the client's choice (session.start's, else the connect's key),
        if valid and not held by any session; else 128 random bits. A taken id is refused,
        never joined: only a resume with the session's token reaches an existing session."""
        if chosen is not None:
            check_session_id(chosen)
            if key is not None and key != chosen:
                raise ProtocolError("invalid_session_id", "session.start's session_id differs from the connect's "
                                    "session key (?session= or X-Voxgate-Session)")  # fmt: skip
        wanted = chosen or key
        if wanted is None:
            return secrets.token_hex(16)  # never listed to other clients
        if wanted in self.sessions:
            raise ProtocolError("session_id_taken", "a session with this id is open; choose another id, or resume "
                                "it with its resume_token")  # fmt: skip
        return wanted

    def _plan(self, start: SessionStart, client: Client) -> StreamPlan:
        fmt = "pcm" if start.format == "pcm16" else start.format
        return self.state.voice_plan(start.voice, fmt, start.sample_rate, start.language, client=client.id,
                                     speed=start.speed, instructions=start.instructions,
                                     formats=WS_FORMATS)  # fmt: skip

    def _reconfigure(self, live: Live, config: OmniConfig, client: Client) -> None:
        """vLLM-Omni's session.config again, between utterances: the next ones speak with it (at
        the session's sample rate: raw PCM cannot change rate mid-socket)."""
        if live.omni is None:
            raise ProtocolError("session_exists", "this socket already has a session")
        if live.session.open:
            raise ProtocolError("utterance_open", "session.config cannot be applied while an utterance is in "
                                "progress; send input.done first")  # fmt: skip
        start = config.session_start()
        if start.sample_rate != live.session.sample_rate:
            raise ProtocolError("unsupported_sample_rate", f"this socket speaks at {live.session.sample_rate} Hz; "
                                "open another for another rate")  # fmt: skip
        live.plan = self._plan(start, client)
        live.session.config = start
        live.omni.close()
        live.omni = OmniFraming(config, live.session.sample_rate, live.omni.utterance)

    def _resume(self, start: SessionStart, websocket: WebSocket, client: Client, key: str | None) -> Live:
        """Only with the session's resume token, and (where keys identify clients) from its
        owner; every refusal looks the same, so ids and tokens cannot be probed."""
        assert start.resume is not None
        if key is not None and key != start.resume.session_id:
            raise ProtocolError("invalid_session_id", "the connect's session key is not the session resumed")
        live = self.sessions.get(start.resume.session_id)
        owned = live is not None and hmac.compare_digest(live.resume_token.encode(), start.resume.resume_token.encode())
        if live is not None and self.state.auth.required and live.owner != client.id:
            owned = False
        if live is None or not owned:
            raise ProtocolError("resume_not_available", "no such session of yours (expired, finished or never started)")
        live.session.resume(start.resume.last_unit_index_received)
        old = live.socket
        if old is not None and old is not websocket:
            live.socket = None
            self._stop_writer(live)
            asyncio.get_running_loop().create_task(close_quietly(old, 4409, "resumed elsewhere"))
        self._attach(live, websocket, resumed=True)
        if live.dropped is not None:
            live.reply(error(live.dropped, "the previous socket was dropped: it stopped reading", fatal=False))
            live.dropped = None
        return live

    def _attach(self, live: Live, websocket: WebSocket, resumed: bool) -> None:
        s = live.session
        live.socket, live.detached_at, live.parked = websocket, None, False
        if not live.reserved:  # a resumed listener gets its voice back, even past the capacity
            self.state.limiter.open_session(force=True)
            live.reserved = True
        live.replies.clear()
        live.reply_bytes, live.close_code = 0, None
        if live.omni is None:  # vLLM-Omni's server answers its session.config with nothing
            live.reply({"type": "session.started", "session_id": s.session_id, "resume_token": live.resume_token,
                        "sample_rate": s.sample_rate, "format": s.config.format, "resumed": resumed,
                        "next_unit_index": s.next_unit,
                        "resume_window_s": self.settings.ws_resume_window_s})  # fmt: skip
        live.clock.reset()  # what the last socket had is gone with it; a replay counts anew
        live.writer = asyncio.get_running_loop().create_task(self._write(live, websocket))
        live.work.set()  # a synthesiser that held back while nobody listened goes on

    def _detach(self, live: Live, websocket: WebSocket) -> None:
        if live.socket is not websocket:
            return
        live.socket = None
        live.clock.absent = True  # its stream goes last, and gives its row to a listener who is there
        self._stop_writer(live)
        if live.session.done and live.session.drained:
            self._end(live)
        else:
            live.detached_at = time.monotonic()
            self._unreserve(live)  # nobody listens: newcomers may have its voice (a resume takes it back)

    def _unreserve(self, live: Live) -> None:
        if live.reserved:
            live.reserved = False
            self.state.limiter.close_session()

    def _stop_writer(self, live: Live) -> None:
        if live.writer is not None and live.writer is not asyncio.current_task():
            live.writer.cancel()
        live.writer = None

    def _drop(self, live: Live, websocket: WebSocket, why: str) -> None:
        """Detach and abort a socket whose client does not read; the session waits for a resume."""
        log.warning("session %s: %s; dropping the socket", live.session.session_id, why)
        self.state.metrics.errors.labels("backpressure").inc()
        self._detach(live, websocket)
        live.dropped = "backpressure"
        abort(websocket)

    def _end(self, live: Live) -> None:
        if self.sessions.pop(live.session.session_id, None) is not None:
            self.state.sessions.close(live.owner)
        self._unreserve(live)
        if live.stream is not None:
            live.stream.cancel("session_end")
        if live.synth is not None and live.synth is not asyncio.current_task():
            live.synth.cancel()
        if live.omni is not None:
            live.omni.close()

    def idle(self) -> bool:
        """Nothing left to finish: no utterance open, every session's output sent (a drain
        waits for this)."""
        return all(
            not live.session.open and not live.session.speakable and live.session.drained
            for live in list(self.sessions.values())
        )

    async def close_all(self, code: str, message: str) -> None:
        """End every session (the drain's last step): an attached client gets a fatal `code`
        error after the frame in flight, then a 1012 close; one that does not read within a
        second is cut. A resume afterwards finds nothing (`resume_not_available`)."""
        lives = list(self.sessions.values())
        attached = {live.socket for live in lives}
        reply = error(code, message, fatal=True)
        writers = {asyncio.ensure_future(send_then_close(ws, reply, DRAIN_CLOSE)) for ws in self.sockets - attached}
        for live in lives:
            if live.socket is not None and live.writer is not None:
                live.close_code = DRAIN_CLOSE
                live.reply(reply)
                writers.add(live.writer)
        if writers:
            await asyncio.wait(writers, timeout=1.0)
        for live in lives:
            if live.socket is not None and (live.writer is None or not live.writer.done()):
                abort(live.socket)  # not reading: its close frame would wait behind its audio
            self._end(live)

    def _start_janitor(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._expire())

    async def _expire(self) -> None:
        """End sessions whose resume window has passed."""
        while self.sessions:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for live in list(self.sessions.values()):
                if live.detached_at is not None and now - live.detached_at > self.settings.ws_resume_window_s:
                    self._end(live)

    def task_count(self) -> int:
        """Gateway tasks alive (for /metrics: leaks show as growth)."""
        tasks = [t for live in self.sessions.values() for t in (live.writer, live.synth) if t is not None]
        return sum(not t.done() for t in tasks) + int(self._janitor is not None and not self._janitor.done())

    # ------------------------------------------------------------------ writer

    async def _write(self, live: Live, websocket: WebSocket) -> None:
        """Replies first, then the session's log from its cursor; ends the socket after session.done.
        A broken socket is left to the reader (it sees the disconnect); any other failure ends
        the socket with an `internal_error`, never silently."""
        s = live.session
        try:
            while True:
                if live.replies:
                    text = live.replies.popleft()
                    live.reply_bytes -= len(text)
                    await websocket.send_text(text)
                    continue
                if live.close_code is not None:  # a fatal error was the last reply
                    await close_quietly(websocket, live.close_code, "fatal error")
                    return
                entry = s.unsent()
                if entry is None:
                    if s.done:
                        await websocket.close(code=1000)
                        self._detach(live, websocket)
                        return
                    live.wake.clear()
                    await live.wake.wait()
                    continue
                if entry.payload is not None and s.config.pacing:
                    await self._pace(live)
                    if s.unsent() is not entry:  # a cancel removed it while we waited
                        continue
                s.sending(entry)
                for frame in self._frames(live, entry):
                    if isinstance(frame, bytes):
                        await websocket.send_bytes(frame)
                    else:
                        await websocket.send_text(frame)
                s.mark_sent(entry)
                if entry.payload is not None:  # the listener has it now: its playback clock moves
                    live.clock.add(entry.message["samples"] / s.sample_rate, time.perf_counter())
                live.room.set()
                if entry.ready_at is not None:  # a segment's first audio is out: server-side latency
                    self.state.record_first_audio(
                        "/v1/tts/ws", f"{s.session_id}:{entry.message['unit_start']}",
                        (entry.ready_at, *entry.stamps, time.perf_counter()), entry.opens_utterance, entry.marks,
                    )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except (OSError, RuntimeError, WebSocketDisconnect):  # the socket broke (starlette raises RuntimeError)
            log.debug("websocket writer stopped", exc_info=True)
        except Exception:
            log.exception("websocket writer failed (session %s)", s.session_id)
            self.state.metrics.errors.labels("internal_error").inc()
            self._detach(live, websocket)
            reply = error("internal_error", "the server failed to send; resume the session", fatal=True)
            asyncio.get_running_loop().create_task(send_then_close(websocket, reply, code=1011))

    @staticmethod
    def _frames(live: Live, entry: Entry) -> list[str | bytes]:
        """A logged message as frames: JSON, then the audio bytes (binary, or base64 inside)."""
        if live.omni is not None:
            return live.omni.frames(entry.message, entry.payload, entry.text)
        if entry.payload is None:
            return [json.dumps(entry.message)]
        if not live.session.config.binary:
            return [json.dumps({**entry.message, "data": base64.b64encode(entry.payload).decode()})]
        return [json.dumps(entry.message), entry.payload]

    async def _pace(self, live: Live) -> None:
        """Hold audio until the listener has at most `pacing_lead_ms` in hand (its playback
        clock, `speech/clock.py`, which the writer moves as it sends)."""
        wait = live.clock.wait_s(time.perf_counter(), live.session.config.pacing_lead_ms / 1000)
        if wait > 0:
            await asyncio.sleep(wait)

    # ------------------------------------------------------------------ synthesis

    async def _synthesise(self, live: Live) -> None:
        """Segments in order through the engine, into the session's log."""
        s, idle = live.session, self.settings.ws_idle_flush_ms / 1000
        try:
            while not s.done:
                if live.socket is None and (live.parked or s.unsent_bytes >= self.settings.ws_replay_bytes):
                    # Nobody listens: voice no further ahead than a resume could take at once (the
                    # engine is for the sessions that do listen; a resume wakes this up).
                    live.work.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(live.work.wait(), timeout=0.2)
                    continue
                segment = s.take_segment()
                if segment is None:
                    live.work.clear()
                    attached = live.socket is not None
                    wait = next_check(live.clock, attached, idle, time.perf_counter(), self.starts.threshold())
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(live.work.wait(), timeout=wait)
                    now = time.perf_counter()
                    if s.idle_flush_due(now, idle):
                        s.flush(now)
                    elif self._starving(live, now):
                        s.starved(now)
                    continue
                await self._speak(live, segment)
                live.wake.set()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("websocket synthesis failed")

    def _starving(self, live: Live, now: float) -> bool:
        """The attached listener has heard (nearly) all the audio it was sent: less left than a
        segment may take to start (`StartWatch`; `Session.starved` says what that changes)."""
        ahead = until_starving(live.clock, live.socket is not None, now, self.starts.threshold())
        return ahead is not None and ahead < 0

    async def _speak(self, live: Live, segment: Segment) -> None:
        s, engine = live.session, self.state.require_engine()
        request = replace(live.plan.request, text=segment.text, request_id=f"{s.session_id}:{segment.unit_start}")
        if live.socket is None:  # a session nobody listens to goes after every other stream
            request = replace(request, priority=DETACHED_PRIORITY)
        taken = time.perf_counter()
        await self.state.limiter.wait(live.owner)  # the client's slots, in turn: never refused mid-utterance
        slot = time.perf_counter()

        def engine_stream(text: str) -> EngineStream:
            return EngineStream(engine, replace(request, text=text), self.state.engine_pool, clock=live.clock)

        stream = self.state.opener(request, engine_stream) if segment.starter else None  # "Sure." plays at once
        live.stream = stream = stream or engine_stream(request.text)
        # One encoder per segment: a compressed segment is a whole stream (mp3 and ADTS frames,
        # or a chained Ogg stream), so a cancel or a resume, which work by whole segments, leave
        # every stream a decoder gets intact.
        encoder = make_encoder(live.plan.fmt, engine.sample_rate, live.plan.sample_rate)
        failure: tuple[str, str] | None = None
        stopped: str | None = None  # nobody listens: "preempted" by the engine, or "parked" (output full)
        try:
            stamps: tuple[float, ...] | None = None  # the clocks on the way to the segment's first audio
            logged = 0  # samples of audio logged: a compressed piece may hold samples given before it
            piece = encoder.bytes_per_sample * (live.plan.sample_rate * WS_PIECE_MS // 1000)
            while s.current(segment) and (chunk := await stream.next()) is not None:
                data = encoder.encode(chunk.samples, chunk.pcm16)
                if not data:
                    continue
                if stamps is None:
                    stamps = (taken, slot, chunk.t_ready, time.perf_counter())
                    self.starts.note(stamps[-1] - slot)  # the server's part: not a client's wait for its own slots
                for part, samples in cut_audio(data, encoder.samples_out - logged, piece):
                    s.audio(segment, part, samples, stamps, chunk.marks)  # (kept on the segment's first only)
                logged = encoder.samples_out
                live.wake.set()
                if not await self._room(live, segment):
                    stopped, live.parked = "parked", True
                    break
            else:
                tail = encoder.flush()
                for part, samples in cut_audio(tail, encoder.samples_out - logged, piece) if tail else ():
                    s.audio(segment, part, samples)
        except Preempted:  # nobody listened and a listener elsewhere needed the row: voiced again later
            stopped = "preempted"
        except VoxgateError as exc:
            failure = (exc.code, exc.message)
        finally:
            encoder.close()
            stream.cancel("done")
            live.stream = None
            self.state.limiter.release(live.owner, in_session=True)
        if stopped is not None and s.current(segment):  # (a cancel meanwhile: its output is discarded)
            self.state.metrics.ws_revoiced.labels(stopped).inc()
            socket = live.socket
            if s.requeue(segment) and socket is not None:
                # A client resumed between the engine stopping the segment and now, and heard part
                # of it: dropped, it discards that part (docs/protocol.md) and resumes once more.
                log.info("session %s: a segment voiced again; dropping the socket that heard its start",
                         s.session_id)  # fmt: skip
                self._detach(live, socket)
                abort(socket)
            live.work.set()
        else:
            s.segment_done(segment, failure)

    async def _room(self, live: Live, segment: Segment) -> bool:
        """Wait while the session's unsent output is over its bound: warn, then drop the socket.
        False when nobody listens and the output is full (for a session nobody listens to, full
        is the replay budget: no further ahead than a resume takes at once): the segment gives
        its engine row up (it is voiced again, whole, after a resume) rather than holding it for
        the whole window."""
        s, limit = live.session, self.settings.ws_send_queue_bytes
        if live.socket is None and s.unsent_bytes > min(limit, self.settings.ws_replay_bytes):
            return False
        start, warned = time.monotonic(), False
        while s.unsent_bytes > limit and s.current(segment):
            live.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.room.wait(), timeout=0.1)
            waited = time.monotonic() - start
            socket = live.socket
            if socket is None:
                return False
            if not warned and waited >= self.settings.ws_backpressure_warn_s:
                warned = True
                self.state.metrics.errors.labels("backpressure").inc()
                live.reply(error("backpressure", "the client is not reading; audio is waiting", fatal=False))
            if waited >= self.settings.ws_backpressure_warn_s + self.settings.ws_backpressure_grace_s:
                self._drop(live, socket, f"client not reading for {waited:.1f} s")
                start, warned = time.monotonic(), False
        return True
