"""Voxgate as a LiveKit Agents TTS (livekit-agents 1.8): `voxgate.integrations.livekit.TTS`.

A client of a running `voxgate serve`, over its WebSocket gateway (`/v1/tts/ws`,
docs/protocol.md). `stream()` is native streaming: the LLM's deltas go out as they come and
audio comes back as the server makes it, so the first audio follows the first few words, not
the first sentence. A LiveKit stream carries one segment, and one segment is one voxgate
utterance. `synthesize()` speaks one text over the same protocol: one code path (options,
errors, cancel) for both, and the gateway's short starter segment gives it early audio too.

    tts = TTS(base_url="http://127.0.0.1:8000", api_key="...", voice="ryan", sample_rate=24000)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    NotGivenOr,
    tts,
    utils,
)

from voxgate.integrations.wire import WordBuffer, pieces, socket_url
from voxgate.text import speakable

log = logging.getLogger(__name__)

MAX_DELTA_CHARS = 250  # synthesize(): a long text in pieces this size (the first audio waits for less)
_GOODBYE_S = 5.0  # at most this long to tell the server a stream is over before dropping the socket

# A refusal as the status LiveKit's retry rule reads (4xx: not retried, but 408 and 429).
_CLOSE_STATUS = {4401: 401, 4403: 403, 4409: 409}
_ERROR_STATUS = {"too_many_sessions": 429, "rate_limited": 429, "text_queue_full": 429, "engine_error": 502,
                 "internal_error": 500}  # fmt: skip


@dataclasses.dataclass(slots=True)
class Options:
    """What a stream asks the server for; each stream takes a copy when it starts."""

    base_url: str
    api_key: str | None = dataclasses.field(repr=False)  # never printed, never logged
    voice: str | None
    language: str | None
    sample_rate: int

    @property
    def ws_url(self) -> str:
        return socket_url(self.base_url)

    def start_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "session.start", "format": "pcm16", "sample_rate": self.sample_rate}
        if self.voice is not None:
            message["voice"] = self.voice
        if self.language is not None:
            message["language"] = self.language
        return message


class TTS(tts.TTS):
    """Voxgate's speech in a LiveKit agent: `AgentSession(tts=TTS(...))`.

    `voice` and `language` left as None take the server's defaults; `sample_rate` is what
    the frames carry (the server resamples: 8000, 16000, 22050, 24000, 44100, 48000).
    Outside a LiveKit job, pass `http_session` or open `livekit.agents.utils.http_context`.
    """

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        voice: str | None = None,
        language: str | None = None,
        sample_rate: int = 24000,
        http_session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(capabilities=tts.TTSCapabilities(streaming=True), sample_rate=sample_rate, num_channels=1)
        self._opts = Options(base_url, api_key, voice, language, sample_rate)
        _ = self._opts.ws_url  # a wrong scheme fails here, not at the first utterance
        self._session = http_session
        self._streams: weakref.WeakSet[SynthesizeStream] = weakref.WeakSet()

    @property
    def model(self) -> str:
        return "voxgate"

    @property
    def provider(self) -> str:
        return "voxgate"

    def update_options(
        self,
        *,
        voice: NotGivenOr[str | None] = NOT_GIVEN,
        language: NotGivenOr[str | None] = NOT_GIVEN,
        api_key: NotGivenOr[str | None] = NOT_GIVEN,
        base_url: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        """Applies to streams started after the call. The sample rate is fixed per instance:
        LiveKit reads `sample_rate` once, when it sets up the audio output."""
        changes = {"voice": voice, "language": language, "api_key": api_key, "base_url": base_url}
        opts = dataclasses.replace(self._opts, **{k: v for k, v in changes.items() if utils.is_given(v)})
        _ = opts.ws_url
        self._opts = opts

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def _gateway(self, timeout: float) -> Gateway:
        if self._session is None:
            self._session = utils.http_context.http_session()
        return Gateway(dataclasses.replace(self._opts), self._session, timeout)

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()


class ChunkedStream(tts.ChunkedStream):
    """One text, one utterance: the whole text goes out, then the audio is collected."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        async with self._tts._gateway(self._conn_options.timeout) as gateway:
            output_emitter.initialize(request_id=gateway.session_id, sample_rate=self._tts.sample_rate,
                                      num_channels=1, mime_type="audio/pcm")  # fmt: skip
            for piece in pieces(speakable(self._input_text), MAX_DELTA_CHARS):
                if piece.strip():
                    await gateway.say(piece)
            await gateway.finish()
            async for _, payload in gateway.messages():
                if payload:
                    output_emitter.push(payload)


class SynthesizeStream(tts.SynthesizeStream):
    """`push_text` deltas go out as whole words (`WordBuffer`); `flush()` is `text.flush` (speak
    what is pending now), `end_input()` is `text.end`. Closing the stream early cancels the
    utterance on the server, so its audio stops there too."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        async with self._tts._gateway(self._conn_options.timeout) as gateway:
            output_emitter.initialize(request_id=gateway.session_id, sample_rate=self._tts.sample_rate,
                                      num_channels=1, mime_type="audio/pcm", stream=True)  # fmt: skip
            tasks = [asyncio.create_task(self._send(gateway, output_emitter)),
                     asyncio.create_task(self._receive(gateway, output_emitter))]  # fmt: skip
            try:
                await asyncio.gather(*tasks)
            finally:
                await utils.aio.cancel_and_wait(*tasks)

    async def _send(self, gateway: Gateway, output_emitter: tts.AudioEmitter) -> None:
        words = WordBuffer()
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                await self._say(gateway, output_emitter, words.drain())
                await gateway.flush()
            else:
                await self._say(gateway, output_emitter, words.push(data))
        await self._say(gateway, output_emitter, words.drain())
        await gateway.finish()

    async def _say(self, gateway: Gateway, output_emitter: tts.AudioEmitter, text: str) -> None:
        for piece in [p for p in pieces(text, MAX_DELTA_CHARS) if p.strip()]:
            if not gateway.utterance_open:
                output_emitter.start_segment(segment_id=f"{gateway.session_id}:{gateway.utterances}")
            self._mark_started()
            await gateway.say(piece)

    async def _receive(self, gateway: Gateway, output_emitter: tts.AudioEmitter) -> None:
        async for message, payload in gateway.messages():
            if payload:
                output_emitter.push(payload)
            elif message["type"] == "utterance.done":
                output_emitter.end_segment()


# ---------------------------------------------------------------------------- text


# ---------------------------------------------------------------------------- the socket


class Gateway:
    """One voxgate session on one socket, for one LiveKit request: `session.start` on entry;
    on an early exit `cancel` and `session.end`, so the server stops the audio and drops the
    session at once instead of keeping it for a resume. Server refusals become LiveKit's
    `APIError`s (status codes as LiveKit's retry rule reads them)."""

    def __init__(self, opts: Options, session: aiohttp.ClientSession, timeout: float) -> None:
        self.opts, self.timeout = opts, timeout
        self._http = session
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.session_id = ""
        self.utterances = 0  # utterances opened so far
        self.utterance_open = False
        self.input_over = False  # finish() was called
        self.ending = False  # session.end was sent
        self.done = False  # session.done came

    async def __aenter__(self) -> Gateway:
        headers = {"Authorization": f"Bearer {self.opts.api_key}"} if self.opts.api_key else {}
        try:
            self._ws = await asyncio.wait_for(self._http.ws_connect(self.opts.ws_url, headers=headers), self.timeout)
        except aiohttp.WSServerHandshakeError as exc:
            raise APIStatusError(f"voxgate refused the upgrade ({exc.status})", status_code=exc.status) from exc
        except TimeoutError:
            raise APITimeoutError(f"no WebSocket from voxgate at {self.opts.base_url} in {self.timeout} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise APIConnectionError(f"cannot reach voxgate at {self.opts.base_url}") from exc
        try:
            with contextlib.suppress(APIConnectionError):  # a refused key closes the socket at once:
                await self._send(self.opts.start_message())  # its close code, read next, says why
            started, _ = await self._next(owed=True)
            if started.get("type") != "session.started" or started.get("sample_rate") != self.opts.sample_rate:
                got = f"{started.get('type')} at {started.get('sample_rate')} Hz"  # not the resume token
                raise APIError(f"voxgate did not start the session as asked: {got}", retryable=False)
        except BaseException:
            await self._ws.close()
            raise
        self.session_id = str(started["session_id"])
        log.debug("voxgate session %s started", self.session_id)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._ws is not None
        try:
            if not self.done and not self._ws.closed:
                await asyncio.wait_for(self._goodbye(), min(self.timeout, _GOODBYE_S))
        except (TimeoutError, APIError, aiohttp.ClientError, OSError) as exc:
            log.debug("voxgate session %s: left without its session.done (%s)", self.session_id, type(exc).__name__)
        finally:
            await self._ws.close()

    async def say(self, text: str) -> None:
        if not self.utterance_open:
            self.utterance_open = True
            self.utterances += 1
        await self._send({"type": "text.delta", "text": text})

    async def flush(self) -> None:
        if self.utterance_open:
            await self._send({"type": "text.flush"})

    async def finish(self) -> None:
        """No more text: end the utterance; the session ends once its audio is all here."""
        self.input_over = True
        if self.utterance_open:
            await self._send({"type": "text.end"})
        else:
            await self._end_session()

    async def messages(self) -> AsyncIterator[tuple[dict[str, Any], bytes | None]]:
        """The server's messages up to `session.done`; audio as (header, PCM bytes)."""
        while not self.done:
            message, payload = await self._next(owed=False)
            kind = message.get("type")
            if kind == "utterance.done":
                self.utterance_open = False
                if self.input_over:
                    await self._end_session()
            elif kind == "session.done":
                self.done = True
            yield message, payload

    async def _goodbye(self) -> None:
        if self.utterance_open:
            await self._send({"type": "cancel"})
            self.utterance_open = False
        await self._end_session()
        while not self.done:
            message, _ = await self._next(owed=True)
            self.done = message.get("type") == "session.done"

    async def _end_session(self) -> None:
        if not self.ending:
            self.ending = True
            await self._send({"type": "session.end"})

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        try:
            await self._ws.send_str(json.dumps(message))
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise APIConnectionError("the voxgate socket closed while sending") from exc

    async def _next(self, owed: bool) -> tuple[dict[str, Any], bytes | None]:
        """One server message, an audio header with its bytes; `error` messages raised."""
        while True:
            message = _decode(await self._receive(owed))
            kind = message.get("type")
            if kind == "audio":
                if "data" in message:
                    return message, base64.b64decode(message["data"])
                frame = await self._receive(owed=True)
                if frame.type != aiohttp.WSMsgType.BINARY:
                    raise APIError("voxgate sent an audio header without its bytes")
                return message, frame.data
            if kind == "utterance.done":  # `cancel`'s answer too: the one sign the server stopped
                log.debug("voxgate session %s: utterance %s %s", self.session_id, message.get("utterance"),
                          message.get("status"))  # fmt: skip
            if kind != "error":
                return message, None
            if message.get("code") == "backpressure" and not message.get("fatal"):
                log.warning("voxgate session %s: the server says this client reads too slowly", self.session_id)
                continue
            code = str(message.get("code"))
            raise APIStatusError(f"voxgate: {code}: {message.get('message')}", status_code=_ERROR_STATUS.get(code, 400),
                                 body=message)  # fmt: skip

    async def _receive(self, owed: bool) -> aiohttp.WSMessage:
        """The next frame. While the server owes nothing (the LLM is still writing), silence is
        normal and is waited out; once it owes an answer, `timeout` seconds of it is an error."""
        assert self._ws is not None
        while True:
            try:
                msg = await self._ws.receive(timeout=self.timeout)
            except TimeoutError:
                if owed or self.input_over:
                    raise APITimeoutError(f"voxgate sent nothing for {self.timeout} s") from None
                continue
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                return msg
            raise _closed(self._ws.close_code)


def _decode(msg: aiohttp.WSMessage) -> dict[str, Any]:
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise APIError("voxgate sent audio bytes without their header")
    try:
        message = json.loads(msg.data)
    except ValueError:
        raise APIError("voxgate sent a message that is not JSON") from None
    if not isinstance(message, dict):
        raise APIError("voxgate sent a message that is not a JSON object")
    return message


def _closed(code: int | None) -> APIError:
    if code in _CLOSE_STATUS:
        what = {4401: "refused the API key", 4403: "refused this origin", 4409: "resumed the session elsewhere"}
        return APIStatusError(f"voxgate {what[code]} (close {code})", status_code=_CLOSE_STATUS[code])
    return APIConnectionError(f"voxgate closed the socket (close {code})")
