"""The I/O of `voxgate load`: one asyncio task per simulated WebSocket client, and a progress
line while they run. What to send is planned in `load`; what came back is judged in
`load_stats`."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from voxgate.bench.load import FaultPlan, LoadParams, TextPlan, plan_faults
from voxgate.bench.load_stats import SessionLedger

OPEN_TIMEOUT_S = 10.0
REPLY_TIMEOUT_S = 10.0  # session.started, session.done
DRAIN_TIMEOUT_S = 30.0  # text.end -> utterance.done
END_RESEND_AFTER_S = 2.0  # after a resume, wait this long for a replayed utterance.done before resending text.end
SMALL_RCVBUF = 16 * 1024  # a backpressure session's socket, so the server feels it stop reading
MAX_RECOVERIES = 5
PROGRESS_EVERY_S = 2.0

logger = logging.getLogger(__name__)


class LinkLost(Exception):
    """The socket went away under a send or a wait."""


class SessionFailed(Exception):
    """The session cannot go on; the message is the failure reason in the report."""


@dataclass(eq=False)
class Link:
    """One socket of a session, with its reader task."""

    ws: ClientConnection
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set = reading
    started: asyncio.Future[dict[str, Any]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    closed: bool = False
    reader: asyncio.Task[None] | None = None


class SessionClient:
    """Drives one session: connect, send the text at `cps`, inject its faults, finish."""

    def __init__(self, params: LoadParams, text: TextPlan, faults: FaultPlan, clock: Callable[[], float]) -> None:
        self.params, self.deltas, self.faults, self.clock = params, text.deltas, faults, clock
        self.ledger = SessionLedger()
        self.cursor = 0  # next unit index to send
        self.session_id = ""
        self.resume_token = ""
        self.link: Link | None = None
        self._changed = asyncio.Event()  # set by the reader after every message
        self._end_sent = self._end_maybe_received = False
        self._ended_at = 0  # the unit index at which the last utterance but the final one was ended
        self._recoveries = 0

    async def run(self) -> None:
        """The whole session; never raises (failures are recorded in the ledger)."""
        try:
            await self._start()
            await self._converse()
        except SessionFailed as exc:
            self.ledger.failure = str(exc)
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed) as exc:
            self.ledger.failure = _failure_code(exc)
            self.ledger.error(self.ledger.failure)
        except Exception as exc:  # a bug here must not hide the other sessions' results
            logger.exception("session client failed")
            self.ledger.failure = f"client_bug_{type(exc).__name__}"
        finally:
            if self.link is not None:
                await self._retire(self.link, abort=not self.ledger.finished)

    # ---------------------------------------------------------------- phases

    async def _start(self) -> None:
        self.link = await self._open(small_buffer=self.faults.backpressure_at is not None)
        start: dict[str, Any] = {"type": "session.start", "format": "pcm16", "binary": True, "units": self.params.units}
        if self.params.voice:
            start["voice"] = self.params.voice
        if self.params.starter_units is not None:
            start["starter_units"] = self.params.starter_units
        await self.link.ws.send(json.dumps(start))
        reply = await self._started(self.link)
        if reply.get("type") != "session.started":
            raise SessionFailed(f"start_refused_{reply.get('code', 'closed')}")
        self.session_id, self.resume_token = reply["session_id"], reply["resume_token"]

    async def _converse(self) -> None:
        """Send every delta on time, then text.end and session.end, recovering from lost sockets."""
        events = self.faults.events()
        while True:
            try:
                if self._at_boundary():
                    await self._end_utterance()  # then the next utterance, on the same socket
                    self._ended_at, self._end_sent, self._end_maybe_received = self.cursor, False, False
                    self.ledger.utterance_opened(self.cursor)
                elif self.cursor < len(self.deltas):
                    await self._next_delta(events)
                elif not self._end_sent:
                    await self._end_utterance()
                else:
                    await self._send({"type": "session.end"})  # idempotent on the server, so resent after a resume
                    if not await self._until(lambda: self.ledger.finished, REPLY_TIMEOUT_S):
                        raise SessionFailed("no_session_done")
                    return
            except LinkLost:
                self._recoveries += 1
                if self._recoveries > MAX_RECOVERIES:
                    raise SessionFailed("too_many_disconnects") from None
                self._note_unexpected_loss()
                await self._recover()
                self._end_maybe_received = self._end_sent and (self.cursor == len(self.deltas) or self._at_boundary())
                self._end_sent = False

    def _at_boundary(self) -> bool:
        """`--utterance-units`: the cursor is where an utterance ends and another begins (not yet done)."""
        every = self.params.utterance_units
        return (
            bool(every)
            and 0 < self.cursor < len(self.deltas)
            and self.cursor % every == 0
            and (self._ended_at != self.cursor)
        )

    async def _next_delta(self, events: list[tuple[float, str]]) -> None:
        """The delta at the cursor, on its time (a resend goes at once), after any fault now due."""
        if self.cursor == len(self.ledger.sent_at):
            await self._sleep_until(self.cursor / self.params.cps)
        while events and events[0][0] <= self.clock():
            await self._inject(events[0][1])  # LinkLost leaves it planned: it runs after the resume
            events.pop(0)
        if self.link is None or self.link.closed:
            raise LinkLost  # before stamping: a unit that never left has no send time
        self.ledger.sent(self.cursor, self.clock())  # stamped before the await: audio never precedes it
        await self._send({"type": "text.delta", "text": self.deltas[self.cursor], "first_unit_index": self.cursor})
        self.cursor += 1

    async def _end_utterance(self) -> None:
        """text.end, then wait for utterance.done. After a resume the server may have had text.end
        already and its utterance.done may be on the way: a second one would open an empty utterance."""
        if self._end_maybe_received:
            await self._until(self._utterance_over, END_RESEND_AFTER_S)
        if not self._utterance_over():
            await self._send({"type": "text.end"})
        self._end_sent = True
        if not await self._until(self._utterance_over, DRAIN_TIMEOUT_S):
            raise SessionFailed("no_utterance_done")

    def _utterance_over(self) -> bool:
        return self.ledger.current_utterance in self.ledger.utterance_status

    async def _inject(self, kind: str) -> None:
        assert self.link is not None
        if kind == "disconnect":
            self.ledger.injected.add(kind)
            self.link.ws.transport.abort()  # no close frame: what a lost network looks like
            await self._recover()
        elif kind == "cancel":
            if self.link.closed:
                raise LinkLost  # the cancel stays planned and is sent after the resume
            self.ledger.cancel_sent(self.cursor)
            try:
                await self._send({"type": "cancel"})
            except LinkLost:
                self.ledger.cancel_unsent()
                raise
            self.ledger.injected.add(kind)
        else:
            self.ledger.injected.add(kind)
            gate = self.link.gate
            gate.clear()
            asyncio.get_running_loop().call_later(self.params.backpressure_pause_s, gate.set)

    def _note_unexpected_loss(self) -> None:
        """A socket we did not close: the server dropping a backpressure session is expected."""
        code = "backpressure_drop" if "backpressure" in self.ledger.injected else "client_connection_lost"
        self.ledger.error(code)

    async def _recover(self) -> None:
        """Reconnect and resume after the last `units.done`; resend text from `next_unit_index`."""
        assert self.link is not None
        await self._retire(self.link, abort=True)
        last = self.ledger.disconnected()
        self.ledger.resumes_attempted += 1
        await asyncio.sleep(self.params.reconnect_delay_s)
        self.link = await self._open(small_buffer=False)
        resume = {"session_id": self.session_id, "resume_token": self.resume_token, "last_unit_index_received": last}
        await self.link.ws.send(json.dumps({"type": "session.start", "resume": resume}))
        reply = await self._started(self.link)
        if reply.get("type") != "session.started" or not reply.get("resumed"):
            raise SessionFailed(f"resume_failed_{reply.get('code', 'closed')}")
        self.ledger.resumes_succeeded += 1
        next_unit = int(reply["next_unit_index"])
        if not 0 <= next_unit <= len(self.ledger.sent_at):
            self.ledger.mismatch(f"resumed at unit {next_unit}; units sent: {len(self.ledger.sent_at)}")
            next_unit = min(max(next_unit, 0), len(self.ledger.sent_at))
        self.cursor = next_unit

    # ---------------------------------------------------------------- sockets

    async def _open(self, small_buffer: bool) -> Link:
        options: dict[str, Any] = {"open_timeout": OPEN_TIMEOUT_S, "ping_interval": None, "compression": None,
                                   "proxy": None, "max_size": 8 * 1024 * 1024}  # fmt: skip
        if self.params.api_key:
            options["additional_headers"] = {"Authorization": f"Bearer {self.params.api_key}"}
        # Every connect names its session (README "Several replicas on Ray Serve"): a router sends
        # the session's resumes to its replica; the server takes the key as the session's id.
        key = self.session_id or f"load-{id(self):x}-{time.time_ns():x}"
        url = f"{self.params.url}{'&' if '?' in self.params.url else '?'}session={key}"
        if small_buffer:
            options.update(sock=await _small_buffer_socket(url), max_queue=1)
        link = Link(await connect(url, **options))
        link.gate.set()
        link.reader = asyncio.create_task(self._read(link))
        return link

    async def _retire(self, link: Link, abort: bool) -> None:
        """Let the reader take what the socket already delivered, then drop the socket."""
        link.gate.set()
        if abort and not link.closed:
            link.ws.transport.abort()
        elif not abort:
            try:
                await asyncio.wait_for(link.ws.close(), REPLY_TIMEOUT_S)
            except TimeoutError:
                link.ws.transport.abort()
        if link.reader is not None:
            try:
                await asyncio.wait_for(link.reader, REPLY_TIMEOUT_S)
            except TimeoutError:
                link.reader.cancel()

    async def _read(self, link: Link) -> None:
        header: dict[str, Any] | None = None
        try:
            while True:
                await link.gate.wait()
                message = await link.ws.recv()
                t = self.clock()
                if isinstance(message, bytes):
                    if header is None:
                        self.ledger.mismatch("binary frame without an audio header")
                    else:
                        self.ledger.audio(header, len(message), t)
                    header = None
                else:
                    if header is not None:
                        self.ledger.mismatch(f"audio seq {header.get('seq')} without its binary frame")
                    header = self._parse(link, message, t)
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            link.closed = True
            if not link.started.done():
                link.started.set_result({"type": "closed", "code": f"close_{link.ws.close_code}"})
            self._changed.set()

    def _parse(self, link: Link, text: str, t: float) -> dict[str, Any] | None:
        try:
            return self._on_message(link, json.loads(text), t)
        except (ValueError, KeyError, TypeError, AttributeError):
            self.ledger.mismatch(f"malformed server message: {text[:120]}")
            return None

    def _on_message(self, link: Link, msg: dict[str, Any], t: float) -> dict[str, Any] | None:
        """Record one JSON message; returns it when it is an audio header awaiting its frame."""
        kind = msg.get("type")
        if kind == "audio":
            if "data" in msg:  # binary: false would put the bytes here; this client asked for frames
                self.ledger.mismatch("audio data inline although binary frames were requested")
            return msg
        if kind == "units.done":
            self.ledger.units_done(msg["utterance"], msg["unit_start"], msg["unit_end"])
        elif kind == "utterance.done":
            self.ledger.utterance_done(msg["utterance"], msg["status"], msg["unit_end"])
        elif kind == "session.started":
            self.ledger.sample_rate = int(msg["sample_rate"])
            if not link.started.done():
                link.started.set_result(msg)
        elif kind == "session.done":
            self.ledger.finished = True
        elif kind == "error":
            self.ledger.error(str(msg.get("code")))
            if not link.started.done():
                link.started.set_result(msg)
        return None

    async def _started(self, link: Link) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(link.started), REPLY_TIMEOUT_S)
        except TimeoutError:
            raise SessionFailed("no_session_started") from None

    async def _send(self, message: dict[str, Any]) -> None:
        if self.link is None or self.link.closed:
            raise LinkLost
        try:
            await self.link.ws.send(json.dumps(message))
        except ConnectionClosed:
            raise LinkLost from None

    async def _until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait up to `timeout` for `predicate` (re-checked after every message); LinkLost if the
        socket goes first."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.link is None or self.link.closed:
                raise LinkLost
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                return predicate()
        return True

    async def _sleep_until(self, at: float) -> None:
        delay = at - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)


def _failure_code(exc: Exception) -> str:
    """A stable name for a failure to connect or a socket closed under us (401 -> client_http_401)."""
    if isinstance(exc, InvalidStatus):
        return f"client_http_{exc.response.status_code}"
    if isinstance(exc, ConnectionClosed):
        return f"client_close_{exc.rcvd.code if exc.rcvd else 'abnormal'}"
    return f"client_{type(exc).__name__}"


async def _small_buffer_socket(url: str) -> socket.socket:
    """A connected TCP socket with a small receive buffer (set before connecting, so the
    window the server sees is small from the start)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM))[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


# ---------------------------------------------------------------------------- the run


async def _progress(clients: list[SessionClient], tasks: list[asyncio.Task[None]], t0: float) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        ledgers = [c.ledger for c in clients]
        errors = sum(sum(x.errors_injected.values()) + sum(x.errors_other.values()) for x in ledgers)
        print(
            f"[load] {time.perf_counter() - t0:6.1f} s  live {sum(not t.done() for t in tasks)}/{len(tasks)}  "
            f"units sent {sum(len(x.sent_at) for x in ledgers)} received {sum(len(x.done_hits) for x in ledgers)}  "
            f"errors {errors}",
            file=sys.stderr,
            flush=True,
        )


async def run_sessions(params: LoadParams, text: TextPlan) -> list[SessionLedger]:
    """Start `concurrency` sessions together and wait for all of them; their ledgers."""
    sending_s = len(text.deltas) / params.cps
    t0 = time.perf_counter()
    clients = [SessionClient(params, text, plan, lambda: time.perf_counter() - t0)
               for plan in plan_faults(params, sending_s)]  # fmt: skip
    tasks = [asyncio.create_task(c.run()) for c in clients]
    progress = asyncio.create_task(_progress(clients, tasks, t0))
    limit = sending_s + params.backpressure_pause_s + DRAIN_TIMEOUT_S + 2 * REPLY_TIMEOUT_S + 30
    _, late = await asyncio.wait(tasks, timeout=limit)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    progress.cancel()
    for client, task in zip(clients, tasks, strict=True):
        if task in late:
            client.ledger.failure = "client_run_timeout"
    return [c.ledger for c in clients]
