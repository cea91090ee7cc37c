"""`AgentBot`: joins an agent call as the user, over real WebRTC (aiortc), for tests and
the regression harness; `voxgate agent-bot` runs it from a WAV file.

The bot offers an audio track (its mic: what `say` is given, in real time, then silence, as
a real mic would, so the agent's VAD sees the end of the turn) and the "events" data
channel. Everything the agent sends is recorded with its arrival time
(`time.perf_counter()`): the audio as mono float32 chunks at `record_rate`, the events as
dicts. Loop-only, like `voxgate.agent.webrtc`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from voxgate.types import VoxgateError

if TYPE_CHECKING:  # aiortc takes ~0.7 s to import: not when the CLI only builds its parser
    from aiortc import MediaStreamTrack, RTCPeerConnection

    from voxgate.agent.webrtc import InboundAudio

CONNECT_TIMEOUT_S = 10.0
RECORD_RATE = 16000


class BotError(VoxgateError):
    code = "agent_bot_error"


@dataclass(frozen=True, slots=True)
class Received:
    """A piece of the agent's audio as heard by the bot."""

    t: float  # perf_counter at arrival
    samples: np.ndarray  # float32 mono at the bot's record_rate


class AgentBot:
    """`await bot.connect(url)`, `await bot.say(pcm, rate)`, read `bot.audio` / `bot.events`,
    `await bot.close()`."""

    def __init__(self, record_rate: int = RECORD_RATE, api_key: str | None = None) -> None:
        from voxgate.agent.webrtc import EventChannel, OutboundAudio

        self.record_rate = record_rate
        self.api_key = api_key
        self.call_id: str | None = None
        self.audio: list[Received] = []  # the agent's audio, in arrival order
        self.events: list[tuple[float, dict[str, Any]]] = []  # (arrival time, event)
        self.mic = OutboundAudio(on_drained=self._on_said)
        self.channel = EventChannel()
        self._url = ""
        self._pc: RTCPeerConnection | None = None
        self._inbound: InboundAudio | None = None
        self._recorder: asyncio.Task[None] | None = None
        self._said: dict[Hashable, asyncio.Future[float]] = {}
        self._turns = 0
        self._changed = asyncio.Event()

    async def connect(self, url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
        """Offer a call to the voxgate server at `url`; returns once media flows both ways
        and the events channel is open. Returns the call id."""
        try:
            return await self._connect(url.rstrip("/"), timeout_s)
        except BaseException:
            await self.close()
            raise

    async def _connect(self, url: str, timeout_s: float) -> str:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        self._url = url
        pc = self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        connected = asyncio.Event()
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", lambda: connected.set() if pc.connectionState == "connected" else None)
        pc.addTrack(self.mic)
        channel = pc.createDataChannel("events")
        opened = asyncio.Event()
        channel.on("open", opened.set)
        self.channel.attach(channel)
        self.channel.on_message(self._on_event)
        await pc.setLocalDescription(await pc.createOffer())
        offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
        answer = await self._request("POST", "/v1/agent/offer", offer)
        call_id = self.call_id = answer["call_id"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        try:
            async with asyncio.timeout(timeout_s):
                await connected.wait()
                await opened.wait()
        except TimeoutError:
            raise BotError(f"no WebRTC connection after {timeout_s} s (state {pc.connectionState})") from None
        return call_id

    async def say(self, pcm: np.ndarray, sample_rate: int) -> float:
        """Speak `pcm` (float in [-1, 1] or int16, mono) into the mic in real time; returns
        the perf_counter time its last frame was sent. Silence follows."""
        self._turns += 1
        tag = ("say", self._turns)
        done = self._said[tag] = asyncio.get_running_loop().create_future()
        self.mic.enqueue(pcm, sample_rate, tag)
        self.mic.end(tag)
        return await done

    def send_event(self, event: dict[str, Any]) -> bool:
        return self.channel.send(event)

    def received_audio(self, since: float = 0.0) -> np.ndarray:
        """The agent's audio that arrived at or after `since` (perf_counter), concatenated."""
        pieces = [r.samples for r in self.audio if r.t >= since]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `predicate()` holds (checked whenever audio or an event arrives)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        return predicate()

    async def wait_event(self, event_type: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The first event of this type received (waiting for it up to `timeout_s`)."""

        def first() -> dict[str, Any] | None:
            return next((e for _, e in self.events if e.get("type") == event_type), None)

        await self.wait_for(lambda: first() is not None, timeout_s)
        return first()

    async def hang_up(self) -> None:
        """Ask the server to end the call (DELETE), then close."""
        if self.call_id is not None and self._pc is not None:
            with contextlib.suppress(httpx.HTTPError, BotError):
                await self._request("DELETE", f"/v1/agent/{self.call_id}")
        await self.close()

    async def close(self) -> None:
        self.mic.stop()
        self.channel.close()
        if self._inbound is not None:
            self._inbound.stop()
        if self._recorder is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._recorder
        if self._pc is not None:
            await self._pc.close()
        for future in self._said.values():
            future.cancel()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(timeout=30.0) as client:
            response = await client.request(method, self._url + path, json=body, headers=headers)
        if response.status_code != 200:
            raise BotError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()  # type: ignore[no-any-return]

    def _on_track(self, track: MediaStreamTrack) -> None:
        from voxgate.agent.webrtc import InboundAudio, low_latency_receiver

        if track.kind == "audio" and self._inbound is None and self._pc is not None:
            low_latency_receiver(self._pc, track)
            self._inbound = InboundAudio(track, self.record_rate)
            self._recorder = asyncio.get_running_loop().create_task(self._record(self._inbound))

    async def _record(self, inbound: InboundAudio) -> None:
        async for pcm, t in inbound:
            self.audio.append(Received(t, pcm.astype(np.float32) / 32767.0))
            self._changed.set()

    def _on_event(self, event: dict[str, Any]) -> None:
        self.events.append((time.perf_counter(), event))
        self._changed.set()

    def _on_said(self, tag: Hashable, t: float) -> None:
        future = self._said.pop(tag, None)
        if future is not None and not future.done():
            future.set_result(t)


# ---------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the voxgate server (default :8000)")
    parser.add_argument("--wav", required=True, help="16-bit WAV file spoken as the user's mic")
    parser.add_argument("--out", help="write what the agent said (from the call's start) as a 16 kHz WAV")
    parser.add_argument("--wait-s", type=float, default=10.0, help="listen this long after speaking (default 10)")
    parser.add_argument("--api-key", help="bearer token, when the server has API keys")


def run_agent_bot(args: argparse.Namespace) -> int:
    """Join a call, say the WAV, listen `--wait-s`, hang up; print a summary."""
    from pathlib import Path

    from voxgate.audio import decode_wav, wav_bytes

    # What fails is the CLI's one line (`voxgate: error: <code>: ...`, exit 2): a WAV that cannot
    # be read (os_error, unsupported_format), a refused call (agent_bot_error), no server.
    pcm, rate = decode_wav(Path(args.wav).read_bytes())
    try:
        summary = asyncio.run(_call(args.url, pcm, rate, args.wait_s, args.api_key))
    except (OSError, httpx.HTTPError) as exc:
        raise BotError(f"cannot talk to {args.url}: {type(exc).__name__}: {exc}") from None
    audio = summary.pop("audio")
    if args.out:
        Path(args.out).write_bytes(wav_bytes(audio, RECORD_RATE))
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


async def _call(url: str, pcm: np.ndarray, rate: int, wait_s: float, api_key: str | None) -> dict[str, Any]:
    bot = AgentBot(api_key=api_key)
    try:
        t0 = time.perf_counter()
        call_id = await bot.connect(url)
        t_connected = time.perf_counter()
        t_said = await bot.say(pcm, rate)
        await asyncio.sleep(wait_s)
    finally:
        await bot.hang_up()
    audio = bot.received_audio()
    loud = [r.t for r in bot.audio if r.t > t_said and _rms(r.samples) > 0.01]
    return {
        "call_id": call_id,
        "connect_ms": round(1000 * (t_connected - t0), 1),
        "said_s": round(len(pcm) / rate, 2),
        "received_s": round(len(audio) / RECORD_RATE, 2),
        "first_audio_after_speech_ms": round(1000 * (loud[0] - t_said), 1) if loud else None,
        "events": [e.get("type") for _, e in bot.events],
        "audio": audio,
    }


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0
