"""Voxgate as a pipecat TTS service: text streams into `voxgate serve`'s WebSocket gateway
(`/v1/tts/ws`, docs/protocol.md) as pipecat hands it over, audio comes back as
`TTSAudioRawFrame`s as the server sends it, and an interruption is the protocol's `cancel`.

    tts = VoxgateTTSService(base_url="http://127.0.0.1:8000", api_key=...,
                            settings=VoxgateTTSService.Settings(voice="vivian", language="en"))

The wire bookkeeping is `Utterances`, a pure state machine (no sockets, no pipecat); the
service around it is a thin driver. Install with `pip install 'voxgate[pipecat]'`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

from pipecat.frames.frames import Frame, InterruptionFrame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.errors import ErrorCategory
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidHandshake
from websockets.protocol import State

from voxgate.integrations.utterances import Utterances
from voxgate.integrations.wire import socket_url

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 1.0

# ------------------------------------------------------------------ errors


class VoxgateServiceError(Exception):
    """An error the server reported (its protocol `code`), or a connection it refused."""

    def __init__(self, code: str, message: str, fatal: bool = False) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.fatal = code, message, fatal


_CATEGORIES = {
    "unauthorized": ErrorCategory.AUTHENTICATION,
    "forbidden": ErrorCategory.AUTHORIZATION,
    "unknown_voice": ErrorCategory.INVALID_REQUEST,
    "unsupported_language": ErrorCategory.INVALID_REQUEST,
    "unsupported_format": ErrorCategory.INVALID_REQUEST,
    "unsupported_sample_rate": ErrorCategory.INVALID_REQUEST,
    "rate_limited": ErrorCategory.RATE_LIMIT,
    "too_many_sessions": ErrorCategory.RATE_LIMIT,
    "engine_error": ErrorCategory.SERVER,
    "internal_error": ErrorCategory.SERVER,
    "connection_failed": ErrorCategory.CONNECTIVITY,
}  # the rest (text_too_long, invalid_request, ...) refuse one text: the application's
_CLOSE_CODES = {4401: ("unauthorized", "the server refused the API key"),
                4403: ("forbidden", "the server refused this origin")}  # fmt: skip


def _category(code: str) -> ErrorCategory:
    return _CATEGORIES.get(code, ErrorCategory.APPLICATION)


class _RedactAuthorization(logging.Filter):
    """websockets logs the upgrade request's headers at DEBUG: never the key."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 2 and str(args[0]).lower() == "authorization":
            record.args = (args[0], "[redacted]")
        return True


_WS_LOG = logging.getLogger(f"{__name__}.websocket")
_WS_LOG.addFilter(_RedactAuthorization())


# ------------------------------------------------------------------ the service


class VoxgateTTSService(WebsocketTTSService):
    """Speaks through a running `voxgate serve`, one gateway session per connection.

    Text goes out as pipecat hands it over (token by token by default: the server cuts its own
    segments, and its first one after a few words); each LLM turn (audio context) is one
    utterance, ended with `text.end`. The session asks for pipecat's output sample rate and the
    settings' `voice` and `language`; a runtime change of either opens a new session between
    utterances. An interruption cancels the utterance on the server and drops its late audio.

    Event handlers (besides the base's): `on_utterance_done(service, status)`, after each
    `utterance.done` ("completed" or "cancelled").
    """

    Settings = TTSSettings
    _settings: TTSSettings

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        sample_rate: int | None = None,
        text_aggregation_mode: TextAggregationMode = TextAggregationMode.TOKEN,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """`base_url`: the server (`http://host:8000`, `/v1` optional); `api_key`: sent as
        `Authorization: Bearer` with the upgrade request, never in the URL or a log;
        `settings`: `voice` and `language` (None: the server's defaults)."""
        store = TTSSettings(model=None, voice=None, language=None)
        if settings is not None:
            store.apply_update(settings)
        super().__init__(text_aggregation_mode=text_aggregation_mode, push_start_frame=True,
                         sample_rate=sample_rate, settings=store, **kwargs)  # fmt: skip
        self._url = socket_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._utterances = Utterances()
        self._lock = asyncio.Lock()  # one state change and its messages at a time, in order
        self._stale = False  # voice or language changed: a new session before the next utterance
        self._receive_task: asyncio.Task | None = None
        self._register_event_handler("on_utterance_done")

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        return str(language.value)  # the server reads "en", "en-US", "English" alike

    # ------------------------------------------------------------ pipecat's side

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._connect()

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if self._websocket is None:
            await self._connect()  # a failure is reported there
        if self._websocket is not None:
            await self._apply(lambda u: u.say(context_id, text))
        yield None  # the audio comes on the receive task

    async def flush_audio(self, context_id: str | None = None) -> None:
        context_id = context_id or self.get_active_audio_context_id()
        if context_id is not None:
            await self._apply(lambda u: u.end(context_id))

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self._apply(lambda u: u.drop(context_id))
        await super().on_audio_context_interrupted(context_id)

    async def _handle_interruption(self, frame: InterruptionFrame, direction: FrameDirection) -> None:
        await super()._handle_interruption(frame, direction)
        # A context pipecat let go of (quiet past its stop timeout) plays nothing more: stop it too.
        for context_id in self._utterances.contexts():
            if not self.audio_context_available(context_id):
                await self._apply(lambda u, c=context_id: u.drop(c))

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        changed = await super()._update_settings(delta)
        if changed.keys() & {"voice", "language"}:
            self._stale = True
            await self._apply(lambda u: [])  # now if the server is idle, else after its utterance
        return changed

    # ------------------------------------------------------------ the driver

    async def _apply(self, change: Callable[[Utterances], list[dict[str, Any]]]) -> None:
        """Change the state, send what the change says, start a waiting utterance if the server
        is free, then close the contexts that have said everything."""
        async with self._lock:
            await self._send(change(self._utterances))
            if self._utterances.server_free:
                if self._stale and self._websocket is not None:
                    await self._renew_session()
                await self._send(self._utterances.start_next())
            closed = self._utterances.take_closed()
        for context_id in closed:
            if self.audio_context_available(context_id):
                await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
                await self.remove_audio_context(context_id)

    async def _send(self, messages: list[dict[str, Any]]) -> None:
        ws = self._websocket
        if not messages or ws is None:
            return
        try:
            for message in messages:
                await ws.send(json.dumps(message))
        except ConnectionClosed as exc:  # the receive loop reconnects
            await self._report(VoxgateServiceError("connection_failed", f"the socket closed while sending ({exc})"))

    async def _report(self, exc: VoxgateServiceError) -> None:
        await self.push_error(error_msg=f"{self} voxgate error {exc}", exception=exc, category=_category(exc.code))

    async def _connect(self) -> None:
        await super()._connect()
        try:
            await self._connect_websocket()
        except VoxgateServiceError as exc:
            await self._report(exc)
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None and self._websocket.state is State.OPEN:
            return
        self._websocket = await self._open_session()
        self._utterances = Utterances()
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        """End the session (cancel what is open, `session.end`) so the server frees it at once
        instead of keeping it for a resume, then close."""
        ws, self._websocket = self._websocket, None
        if ws is None:
            return
        try:
            for kind in ("cancel", "session.end"):
                await ws.send(json.dumps({"type": kind}))
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                async for _ in ws:  # the server closes once session.done is out
                    pass
        except (ConnectionClosed, TimeoutError, OSError):
            pass
        finally:
            await ws.close()
            self._utterances = Utterances()
            await self._call_event_handler("on_disconnected")

    async def _open_session(self) -> Any:
        """A socket with a started session (voice, language, pipecat's sample rate)."""
        try:
            ws = await self._websocket_connect(self._url, additional_headers=self._headers, logger=_WS_LOG,
                                               open_timeout=HANDSHAKE_TIMEOUT_S, max_size=16 << 20)  # fmt: skip
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise VoxgateServiceError("connection_failed", f"cannot open {self._url}: {exc}") from None
        try:
            await ws.send(json.dumps(self._session_start()))
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                reply = json.loads(await ws.recv())
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            raise VoxgateServiceError(*_CLOSE_CODES.get(code, ("connection_failed", f"closed ({code})"))) from None
        except TimeoutError:
            await ws.close()
            raise VoxgateServiceError("connection_failed", "no session.started from the server") from None
        if reply.get("type") != "session.started" or reply.get("sample_rate") != self.sample_rate:
            await ws.close()
            code = reply.get("code", "unsupported_sample_rate")
            raise VoxgateServiceError(code, reply.get("message", f"the server speaks at {reply.get('sample_rate')} Hz"))
        self._stale = False
        return ws

    def _session_start(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "session.start", "format": "pcm16", "sample_rate": self.sample_rate}
        if self._settings.voice:
            message["voice"] = self._settings.voice
        if self._settings.language:
            message["language"] = str(self._settings.language)
        return message

    async def _renew_session(self) -> None:
        """A new session for new settings (the server is idle); the old one ends, and the
        receive loop reads it to its close before it moves to the new one."""
        try:
            ws = await self._open_session()
        except VoxgateServiceError as exc:
            self._stale = False  # speak on with the session there is; the error says why
            await self._report(exc)
            return
        old, self._websocket = self._websocket, ws
        self._utterances = self._utterances.carry_over()
        if old is not None:
            with contextlib.suppress(ConnectionClosed):
                await old.send(json.dumps({"type": "session.end"}))

    async def _receive_messages(self) -> None:
        while (ws := self._websocket) is not None:
            header: dict[str, Any] | None = None
            try:
                async for message in ws:
                    if ws is self._websocket:  # else: a renewed session's last words
                        header = await self._on_message(message, header)
            except ConnectionClosedError:
                if ws is self._websocket:
                    raise
            if ws is self._websocket:
                return  # the server closed it: the base reconnects

    async def _on_message(self, message: str | bytes, header: dict[str, Any] | None) -> dict[str, Any] | None:
        """One server message; returns an `audio` header whose bytes come next."""
        if isinstance(message, bytes):
            context_id = self._utterances.context_of(header["utterance"]) if header else None
            if context_id is not None:  # None: a cancelled utterance's late audio
                frame = TTSAudioRawFrame(message, self.sample_rate, 1, context_id=context_id)
                await self.append_to_audio_context(context_id, frame)
            return None
        msg = json.loads(message)
        kind = msg.get("type")
        if kind == "audio":
            return msg
        if kind == "utterance.done":
            self._utterances.done(msg["utterance"], msg["status"])
            await self._call_event_handler("on_utterance_done", msg["status"])
            await self._apply(lambda u: [])
        elif kind == "error":
            await self._report(VoxgateServiceError(msg.get("code", "internal_error"), msg.get("message", ""),
                                                   bool(msg.get("fatal"))))  # fmt: skip
        return None
