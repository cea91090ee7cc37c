"""The agent's WebRTC peer (aiortc): one call's audio both ways and its event channel.

No agent logic lives here. `OutboundAudio` is the agent's voice: PCM in at any rate, 20 ms
frames of 48 kHz out, paced in real time by the track itself (aiortc's sender pulls as
fast as `recv` returns). `InboundAudio` is the user's microphone as 16 kHz mono int16.
`PeerSession` is one RTCPeerConnection answering a browser's or a bot's offer, with the
"events" data channel the offerer opens (JSON text messages).

Threading: everything here runs on the asyncio loop that owns the peer connection; call
`enqueue`, `end`, `flush`, `send_event` and `close` from that loop only. Callbacks
(`on_published`, `on_drained`, message callbacks) are called on it too, and must not block.

ICE: no STUN or TURN (`iceServers` empty), so only host candidates are offered: calls work on
loopback and on a LAN, not across NAT.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from voxgate.agent.frames import FRAME_S, FRAME_SAMPLES, RATE, FrameQueue, Tick
from voxgate.agent.sdp import check_offer, describe_error
from voxgate.audio import Resampler, to_pcm16
from voxgate.types import InvalidRequest, InvalidSdp

log = logging.getLogger(__name__)

TIME_BASE = fractions.Fraction(1, RATE)
INBOUND_RATE = 16000  # what the VAD and STT take
MAX_LATE_S = 0.1  # a sender this far behind its clock (a stalled loop) restarts the clock instead of bursting
MAX_PENDING_EVENTS = 256  # events held until the data channel opens
MAX_INBOUND_CHUNKS = 500  # 10 s of mic audio waiting for a slow reader; older chunks are dropped
RECEIVE_PREFETCH_FRAMES = 1  # aiortc holds 4 (80 ms) before decoding; see low_latency_receiver

PublishedCallback = Callable[[Hashable, float, float], None]  # (tag, seconds of audio, perf_counter time)
DrainedCallback = Callable[[Hashable, float], None]  # (tag, perf_counter time)


# ---------------------------------------------------------------------------- outbound


class OutboundAudio(MediaStreamTrack):
    """The agent's voice as an aiortc audio track: 20 ms frames of s16 at 48 kHz (mono audio,
    sent as two equal channels).

    `recv` waits for its frame's slot on a monotonic clock (started at the first call),
    then takes the next queued frame, or silence. A `flush` during that wait is therefore
    seen by the very next frame: nothing queued before it is published after it.
    `on_published(tag, seconds, t)` is called for each published frame with a tag
    (`seconds` = its real audio, less than 20 ms for a padded last frame; `t` =
    `time.perf_counter()` as it is handed to aiortc); `on_drained(tag, t)` once every frame
    queued before `end(tag)` was published (with the last of them). Loop-only (see module).
    """

    kind = "audio"

    def __init__(self, on_published: PublishedCallback | None = None, on_drained: DrainedCallback | None = None):
        super().__init__()
        self.on_published = on_published
        self.on_drained = on_drained
        self.frames = FrameQueue()
        self.published = 0  # frames handed to aiortc, silence included
        self.late_restarts = 0  # times the clock was restarted after a stall
        self._start: float | None = None
        self.held = False  # `hold`: silence goes out, the queue waits

    @property
    def queued_s(self) -> float:
        return self.frames.queued_s

    def enqueue(self, pcm: np.ndarray, sample_rate: int, tag: Hashable) -> None:
        """Queue audio (float32 in [-1, 1] or int16, mono, any rate) to be spoken after
        what is queued; it is resampled to 48 kHz and cut into frames that carry `tag`."""
        self.frames.enqueue(pcm, sample_rate, tag)

    def end(self, tag: Hashable) -> None:
        """Mark the end of the audio queued so far (`tag` needs not be an audio tag, e.g. a
        reply's id after its segments' tags): `on_drained(tag, t)` comes when it is all out."""
        self.frames.end(tag)

    def flush(self, tag: Hashable = None) -> int:
        """Drop queued audio now (all, or only `tag`'s) with its end markers (no
        `on_drained` for them); returns the frames dropped. The next frame is silence."""
        return self.frames.flush(tag)

    def hold(self, on: bool) -> None:
        """While on, each frame's slot gets silence and the queued audio waits (the controller's
        `HoldAudio`: speech came over a reply before anyone heard it)."""
        self.held = on

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        else:
            due = self._start + (self.published * FRAME_S)
            if now < due:
                await asyncio.sleep(due - now)
                if self.readyState != "live":
                    raise MediaStreamError
            elif now - due > MAX_LATE_S:
                self._start = now - self.published * FRAME_S
                self.late_restarts += 1
        tick = self.frames.pop() if not self.held else Tick(None)
        pcm = tick.frame.pcm if tick.frame is not None else _SILENCE
        # Stereo with both channels equal: aiortc's Opus encoder takes stereo, and its mono
        # upmix would cost 3 dB (libswresample's centre mix level).
        frame = AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = RATE
        frame.time_base = TIME_BASE
        frame.pts = self.published * FRAME_SAMPLES
        self.published += 1
        t = time.perf_counter()
        self._report(tick, t)
        return frame

    def _report(self, tick: Tick, t: float) -> None:
        for tag in tick.drained_before:
            _safely(self.on_drained, tag, t)
        if tick.frame is not None and tick.frame.tag is not None:
            _safely(self.on_published, tick.frame.tag, tick.frame.samples / RATE, t)
        for tag in tick.drained_after:
            _safely(self.on_drained, tag, t)


def _safely(callback: Callable[..., None] | None, *args: Any) -> None:
    """Run a callback, logging its failure: raising from `recv` would stop aiortc's sender."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("callback %r failed", callback)


_SILENCE = np.zeros(FRAME_SAMPLES, dtype=np.int16)


# ---------------------------------------------------------------------------- inbound


class InboundAudio:
    """A remote audio track read in a task: `async for pcm, t in inbound`, one item per
    received frame: mono int16 PCM at `sample_rate` and `t` = `time.perf_counter()` at its
    arrival. The iteration ends when the track ends (or `stop()`).

    The track is drained from the start whether anyone reads or not (aiortc's own queue
    is unbounded); a reader more than `MAX_INBOUND_CHUNKS` behind loses the oldest chunks
    (counted in `dropped`).
    """

    def __init__(self, track: MediaStreamTrack, sample_rate: int = INBOUND_RATE) -> None:
        self.track = track
        self.sample_rate = sample_rate
        self.received = 0
        self.dropped = 0
        self.ended = asyncio.Event()
        self._chunks: deque[tuple[np.ndarray, float]] = deque()
        self._wakeup = asyncio.Event()
        self._resampler: Resampler | None = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    def __aiter__(self) -> InboundAudio:
        return self

    async def __anext__(self) -> tuple[np.ndarray, float]:
        while not self._chunks:
            if self.ended.is_set():
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._chunks.popleft()

    def stop(self) -> None:
        """Stop reading; the iteration ends once what was read is consumed."""
        self._task.cancel()

    async def _read(self) -> None:
        try:
            while True:
                frame = await self.track.recv()
                t = time.perf_counter()
                pcm = self._convert(frame)
                if pcm.size:
                    self.received += 1
                    if len(self._chunks) >= MAX_INBOUND_CHUNKS:
                        self._chunks.popleft()
                        self.dropped += 1
                    self._chunks.append((pcm, t))
                    self._wakeup.set()
        except (MediaStreamError, asyncio.CancelledError):
            pass
        finally:
            self.ended.set()
            self._wakeup.set()

    def _convert(self, frame: AudioFrame) -> np.ndarray:
        channels = len(frame.layout.channels)
        data = frame.to_ndarray()
        if frame.format.is_planar:
            samples = data.astype(np.float32)
        else:  # packed: one row, channels interleaved
            samples = data.reshape(-1, channels).T.astype(np.float32)
        if np.issubdtype(data.dtype, np.integer):
            samples /= float(np.iinfo(data.dtype).max)
        mono = samples.mean(axis=0)
        if self._resampler is None or self._resampler.in_rate != frame.sample_rate:
            self._resampler = Resampler(frame.sample_rate, self.sample_rate)
        return to_pcm16(self._resampler.process(mono))


def low_latency_receiver(pc: RTCPeerConnection, track: MediaStreamTrack) -> bool:
    """Make the receiver of `track` decode each audio frame as soon as the next one is in.

    aiortc's audio jitter buffer waits for 4 frames (80 ms) before it releases one, and it
    has no playout clock: packets are decoded in order whenever they arrive, so holding more
    buffers nothing useful for a reader that is not a sound card (the VAD, a recorder), and
    it adds 60 ms to every turn. aiortc offers no setting for it: the receiver's private
    buffer is replaced before the first packet; False if this aiortc has none (left as is).
    """
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if receiver.track is track and hasattr(receiver, "_RTCRtpReceiver__jitter_buffer"):
            receiver._RTCRtpReceiver__jitter_buffer = JitterBuffer(capacity=16, prefetch=RECEIVE_PREFETCH_FRAMES)
            return True
    log.warning("could not shorten the receive jitter buffer (aiortc changed?): 80 ms more inbound latency")
    return False


# ---------------------------------------------------------------------------- events


class EventChannel:
    """JSON events over an RTCDataChannel: sends are held until it opens (at most
    `MAX_PENDING_EVENTS`), dropped and counted once it is closed; incoming text that is not
    a JSON object is ignored and counted."""

    def __init__(self) -> None:
        self.channel: RTCDataChannel | None = None
        self.sent = 0
        self.dropped = 0
        self.received = 0
        self.malformed = 0
        self._pending: deque[str] = deque()
        self._callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._closed = False

    def attach(self, channel: RTCDataChannel) -> None:
        self.channel = channel
        channel.on("open", self._send_pending)
        channel.on("message", self._on_message)
        if channel.readyState == "open":
            self._send_pending()

    def send(self, event: dict[str, Any]) -> bool:
        """Send (or hold) one event; False when it was dropped. Raises TypeError when the
        event is not JSON-serialisable (a caller's bug, not a network condition)."""
        text = json.dumps(event)
        state = self.channel.readyState if self.channel is not None else "connecting"
        if self._closed or state in ("closing", "closed"):
            self.dropped += 1
            return False
        if state == "open" and self.channel is not None:
            self.channel.send(text)
            self.sent += 1
            return True
        if len(self._pending) >= MAX_PENDING_EVENTS:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(text)
        return True

    def on_message(self, callback: Callable[[dict[str, Any]], None]) -> None:
        self._callbacks.append(callback)

    def close(self) -> None:
        self._closed = True
        self.dropped += len(self._pending)
        self._pending.clear()

    def _send_pending(self) -> None:
        while self._pending and self.channel is not None and self.channel.readyState == "open":
            self.channel.send(self._pending.popleft())
            self.sent += 1

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message) if isinstance(message, str) else None
        except ValueError:
            event = None
        if not isinstance(event, dict):
            self.malformed += 1
            return
        self.received += 1
        for callback in self._callbacks:
            _safely(callback, event)


# ---------------------------------------------------------------------------- the peer


class PeerSession:
    """One call: the answering RTCPeerConnection, the agent's `outbound` track, the user's
    `inbound` audio and the "events" channel. Make one with `await PeerSession.answer(...)`.
    `connected` is set once ICE and DTLS are up; `closed` once the call is hung up."""

    def __init__(self, pc: RTCPeerConnection, inbound_rate: int = INBOUND_RATE) -> None:
        self.pc = pc
        self.outbound = OutboundAudio()
        self.inbound: InboundAudio | None = None
        self.events = EventChannel()
        self.connected = asyncio.Event()
        self.closed = asyncio.Event()
        self._inbound_rate = inbound_rate
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_datachannel)
        pc.on("connectionstatechange", self._on_state)

    @classmethod
    async def answer(
        cls, offer_sdp: str, offer_type: str = "offer", *, inbound_rate: int = INBOUND_RATE
    ) -> tuple[PeerSession, str, str]:
        """Answer an SDP offer (with all our ICE candidates in it: no trickle). Raises
        `InvalidSdp` for an offer that is not SDP, cannot be applied or answered, or sends no
        audio; whatever fails, the peer connection made for it is closed before this returns."""
        if offer_type != "offer":
            raise InvalidRequest(f"expected an SDP offer, got type {offer_type!r}")
        check_offer(offer_sdp)
        session = cls(RTCPeerConnection(RTCConfiguration(iceServers=[])), inbound_rate)
        try:
            await session._apply(offer_sdp)
        except BaseException:
            await session.close()
            raise
        local = session.pc.localDescription
        return session, local.sdp, local.type

    async def _apply(self, offer_sdp: str) -> None:
        # Any exception inside aiortc here comes from what the offer says: it is the client's
        # error (400), never the server's (500).
        before = asyncio.all_tasks()
        try:
            await self._answer(offer_sdp)
        finally:
            adopt_connect_tasks(self.pc, asyncio.all_tasks() - before)

    async def _answer(self, offer_sdp: str) -> None:
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:
            raise InvalidSdp(f"the SDP offer could not be applied: {describe_error(exc)}") from None
        if self.inbound is None:
            raise InvalidSdp("the offer sends no audio: it needs an audio section (sendrecv) for the mic")
        try:
            self.pc.addTrack(self.outbound)
            await self.pc.setLocalDescription(await self.pc.createAnswer())
        except Exception as exc:
            raise InvalidSdp(f"the SDP offer could not be answered: {describe_error(exc)}") from None

    def send_event(self, event: dict[str, Any]) -> bool:
        """Send a JSON event to the peer (held until the channel opens); False if dropped."""
        return self.events.send(event)

    def on_message(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call `callback(event)` for each JSON object the peer sends."""
        self.events.on_message(callback)

    async def wait_connected(self, timeout_s: float) -> bool:
        """Whether the peer connected (ICE and DTLS) within `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self.connected.wait()
        return self.connected.is_set()

    async def close(self) -> None:
        """Hang up (idempotent): stop the tracks, close the connection, set `closed`."""
        if self._closing:
            await self.closed.wait()
            return
        self._closing = True
        try:
            self.events.close()
            if self.inbound is not None:
                self.inbound.stop()
            self.outbound.stop()
            await close_peer(self.pc)
        finally:
            self.closed.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.inbound is None:
            low_latency_receiver(self.pc, track)
            self.inbound = InboundAudio(track, self._inbound_rate)

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label == "events" and self.events.channel is None:
            self.events.attach(channel)
        else:
            log.info("ignoring data channel %r", channel.label)

    def _on_state(self) -> None:
        if self.pc.connectionState == "connected":
            self.connected.set()
        if self.pc.connectionState in ("failed", "closed") and not self._closing:
            log.info("peer connection %s", self.pc.connectionState)
            self._close_task = asyncio.get_running_loop().create_task(self.close())


def adopt_connect_tasks(pc: RTCPeerConnection, new_tasks: set[asyncio.Task[Any]]) -> None:
    """aiortc starts ICE and DTLS in a task it does not keep (`RTCPeerConnection.__connect`),
    so when a call is hung up while that task runs, its failure (InvalidStateError: "the
    RTCIceTransport is closed") is an exception nobody retrieves, and asyncio logs it with a
    traceback at garbage collection. The tasks among `new_tasks` that connect `pc` get a
    callback that retrieves how they ended and logs it as the client-side event it is."""
    for task in new_tasks:
        coro = task.get_coro()
        if getattr(coro, "__qualname__", "") != "RTCPeerConnection.__connect":
            continue
        frame = getattr(coro, "cr_frame", None)
        if frame is None or frame.f_locals.get("self") is pc:  # None: it has already run
            task.add_done_callback(_connect_ended)


def _connect_ended(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.info("a peer connection stopped connecting: %s", describe_error(exc))


async def close_peer(pc: RTCPeerConnection) -> None:
    """Close `pc` whatever state an offer left it in. aiortc's `close` stops at the first
    transport it finds missing, which would leak the others (their UDP sockets and ICE tasks):
    then every transport still there is stopped on its own. Never raises (but cancellation)."""
    try:
        await pc.close()
        return
    except Exception as exc:
        log.info("closing a peer connection failed (%s); stopping its transports one by one", describe_error(exc))
    for transport in _transports(pc):
        try:
            await transport.stop()
        except Exception as exc:
            log.info("stopping %s failed: %s", type(transport).__name__, describe_error(exc))


def _transports(pc: RTCPeerConnection) -> list[Any]:
    """What `pc.close` stops, in its order: the transceivers, then the DTLS transports and
    their ICE transports (bundled media share them; a hostile offer can leave some None)."""
    dtls = [t.receiver.transport for t in pc.getTransceivers()]
    if pc.sctp is not None:
        dtls.append(pc.sctp.transport)
    found = [*pc.getTransceivers(), *dtls, *(d.transport for d in dtls if d is not None)]
    return list({id(x): x for x in found if x is not None}.values())
