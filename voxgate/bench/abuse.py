"""`voxgate bench abuse`: what one hostile client costs everyone else, written as JSON.

For each kind of flood (one message type of either socket, or one HTTP request, sent as fast
as the client can, `--messages` in all, reconnecting whenever the server closes it; `stalled`
kinds never read a byte back), while it runs:

- a **prober** (another client) asks `GET /healthz` every 20 ms: its latency;
- a **bystander** session on `/v1/tts/ws` says a short sentence every 100 ms: the time from
  its `text.flush` to the first audio of that sentence;
- the server's resident memory is sampled every 50 ms (a server started here, or `--pid`).

Each flood is compared with a quiet baseline measured first: the issue's targets are the
prober's and the bystander's p99 at most 50 ms above the baseline's, and the server's peak
memory at most 32 MiB above what it was when the flood started. The flooder runs in a process
of its own, so its work does not sit on the measuring client's event loop.

The flooder and the bystander are different clients (every limit is per client), and each
flood is a fresh client: sessions a flood leaves waiting for a resume count against its own
client's caps, which would turn the next flood into a flood of refusals. A server started here
gets an API key for the bystander and one per flood; against `--url`, pass `--bystander-key`
and `--flood-key` (comma-separated keys are used in turn, one per flood), or neither for a
server without keys (then everyone is the loopback address: one client, whose caps the
bystander shares).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import websockets

from voxgate.bench.server import ServerProcess, add_set_argument, settings_env
from voxgate.bench.stats import machine, summary, write_report

TARGET_DELAY_MS = 50.0
TARGET_RSS_MIB = 32.0
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Flood:
    """One kind of abuse: `path` ("/v1/..." socket or "POST /..." HTTP), what opens it, the
    flooding message, and whether the flooder reads what comes back."""

    path: str
    opening: tuple[str, ...]
    message: str | bytes
    reads: bool = True


def _j(**message: Any) -> str:
    return json.dumps(message)


_START = (_j(type="session.start"),)
FLOODS: dict[str, Flood] = {
    "tts.ping": Flood("/v1/tts/ws", _START, _j(type="ping", id="p" * 200)),
    "tts.ping_60k": Flood("/v1/tts/ws", _START, _j(type="ping", id="p" * 60_000)),
    "tts.delta": Flood("/v1/tts/ws", _START, _j(type="text.delta", text="word ")),
    "tts.blank": Flood("/v1/tts/ws", _START, _j(type="text.delta", text=" " * 4000)),
    "tts.flush": Flood("/v1/tts/ws", _START, _j(type="text.flush")),
    "tts.end": Flood("/v1/tts/ws", _START, _j(type="text.end")),
    "tts.cancel": Flood("/v1/tts/ws", _START, _j(type="cancel")),
    "tts.session_start": Flood("/v1/tts/ws", (), _j(type="session.start")),
    "tts.session_end": Flood("/v1/tts/ws", _START, _j(type="session.end")),
    "tts.not_json": Flood("/v1/tts/ws", _START, "{not json"),
    "tts.binary": Flood("/v1/tts/ws", _START, b"\x00" * 64),
    "tts.surrogate": Flood("/v1/tts/ws", _START, '{"type": "ping", "id": "\\ud800"}'),
    "tts.ping.stalled": Flood("/v1/tts/ws", _START, _j(type="ping", id="p" * 200), reads=False),
    "tts.cancel.stalled": Flood("/v1/tts/ws", _START, _j(type="cancel"), reads=False),
    "tts.delta.stalled": Flood("/v1/tts/ws", _START, _j(type="text.delta", text="word " * 50), reads=False),
    "omni.input_text": Flood("/v1/audio/speech/stream", (_j(type="session.config"),), _j(type="input.text", text="a ")),
    "bridge.ping": Flood("/v1/bridge/ws", (), _j(type="ping", id=1)),
    "bridge.config": Flood("/v1/bridge/ws", (), _j(type="config", temperature=0.5)),
    "bridge.history": Flood("/v1/bridge/ws", (), _j(type="history")),
    "bridge.cancel": Flood("/v1/bridge/ws", (), _j(type="cancel")),
    "bridge.user": Flood("/v1/bridge/ws", (), _j(type="user", content="hi")),
    "bridge.ping.stalled": Flood("/v1/bridge/ws", (), _j(type="ping", id=1), reads=False),
    "http.tts_stream": Flood("POST /tts/stream", (), _j(text="Hello.")),
    "http.bad_json": Flood("POST /tts/stream", (), "{not json"),
    "http.token": Flood("POST /v1/auth/token", (), ""),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (default: start `voxgate serve` here)")
    parser.add_argument("--pid", type=int, default=None, help="with --url: the server's pid, to sample its memory")
    parser.add_argument("--flood-key", default=None, help="with --url: the flooders' API keys, comma-separated")
    parser.add_argument("--bystander-key", default=None, help="with --url: the bystander's (another client's) key")
    parser.add_argument("--engine", default="tone", help="engine of the started server (default tone)")
    add_set_argument(parser)
    parser.add_argument("--messages", type=int, default=20_000, help="messages per flood (default 20000)")
    parser.add_argument("--kinds", default="", help=f"comma-separated floods (default all: {', '.join(FLOODS)})")
    parser.add_argument("--baseline-s", type=float, default=8.0, help="quiet measurement first (default 8 s)")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="longest a flood may run (default 120 s)")
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


# ---------------------------------------------------------------------- the flooder (own process)


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _flood_process(url: str, flood: Flood, count: int, timeout_s: float, key: str | None, out: Any) -> None:
    out.put(asyncio.run(_flood(url, flood, count, timeout_s, _headers(key))))


@dataclass
class _Tally:
    sent: int = 0
    connections: int = 0


async def _flood(url: str, flood: Flood, count: int, timeout_s: float, headers: dict[str, str]) -> dict[str, Any]:
    """Send `count` messages as fast as possible; reconnect when the server closes us."""
    tally, closes, errors = _Tally(), Counter[str](), Counter[str]()
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    if flood.path.startswith("POST "):
        tally.sent, errors = await _flood_http(url + flood.path[5:], flood.message, count, deadline, headers)
    else:
        ws_url = url.replace("http://", "ws://") + flood.path
        while tally.sent < count and time.perf_counter() < deadline:
            tally.connections += 1
            try:
                await _one_socket(ws_url, flood, count, deadline, tally, errors, headers)
                closes["client_done"] += 1
            except websockets.ConnectionClosed as exc:
                closes[str(exc.rcvd.code if exc.rcvd is not None else 1006)] += 1
            except (OSError, TimeoutError) as exc:
                closes[type(exc).__name__] += 1
                await asyncio.sleep(0.05)
    return {"sent": tally.sent, "connections": tally.connections, "closes": dict(closes), "errors": dict(errors),
            "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip


async def _one_socket(
    url: str, flood: Flood, count: int, deadline: float, tally: _Tally, errors: Counter[str], headers: dict[str, str]
) -> None:
    queue = None if flood.reads else 1
    async with websockets.connect(url, max_size=None, max_queue=queue, additional_headers=headers) as ws:
        reader = asyncio.create_task(_read(ws, errors)) if flood.reads else None
        try:
            for opening in flood.opening:
                await ws.send(opening)
            while tally.sent < count and time.perf_counter() < deadline:
                await asyncio.wait_for(ws.send(flood.message), max(0.1, deadline - time.perf_counter()))
                tally.sent += 1
        finally:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
            if not flood.reads:
                ws.transport.abort()


async def _read(ws: websockets.ClientConnection, errors: Counter[str]) -> None:
    async for frame in ws:
        if isinstance(frame, str) and '"error"' in frame:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                errors[json.loads(frame)["code"]] += 1


async def _flood_http(
    url: str, body: str | bytes, count: int, deadline: float, headers: dict[str, str]
) -> tuple[int, Counter[str]]:
    statuses: Counter[str] = Counter()
    left = count

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0 and time.perf_counter() < deadline:
            left -= 1
            try:
                async with client.stream("POST", url, content=body) as r:
                    async for _ in r.aiter_raw():
                        pass
                    statuses[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=8), headers=headers) as client:
        await asyncio.gather(*(worker(client) for _ in range(8)))
    return count - max(left, 0), statuses


# ---------------------------------------------------------------------- what the others see


class Observers:
    """The prober, the bystander and the memory sampler, running until `stop()`."""

    def __init__(self, url: str, rss: Callable[[], int] | None, key: str | None) -> None:
        self.url, self.rss, self.key = url, rss, key
        self.healthz_ms: list[float] = []
        self.audio_ms: list[float] = []
        self.bystander_errors: list[str] = []
        self.rss_peak = 0
        self.ready = asyncio.Event()  # the bystander's session is open (or could not be)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await asyncio.gather(self._probe(), self._bystander(), self._memory())

    async def _probe(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/healthz")).status_code == 200:
                        self.healthz_ms.append(1000 * (time.perf_counter() - t0))
                await self._pause(0.02)

    async def _bystander(self) -> None:
        ws_url = self.url.replace("http://", "ws://") + "/v1/tts/ws"
        try:
            async with websockets.connect(ws_url, max_size=None, additional_headers=_headers(self.key)) as ws:
                await ws.send(_j(type="session.start", max_pending_units=200))
                started = json.loads(await ws.recv())
                if started["type"] != "session.started":
                    self.bystander_errors.append(started.get("code", started["type"]))
                    return
                self.ready.set()
                reader = asyncio.create_task(self._hear(ws))
                unit, pending = 0, {}
                self._pending = pending
                while not self._stop.is_set():
                    pending[unit] = time.perf_counter()
                    await ws.send(_j(type="text.delta", text="Hello there friend ", first_unit_index=unit))
                    await ws.send(_j(type="text.flush"))
                    unit += 3
                    await self._pause(0.1)
                await ws.send(_j(type="session.end"))  # a well-behaved client: its session ends with it
                try:
                    await asyncio.wait_for(reader, 30)  # until session.done closes the socket
                except TimeoutError:
                    self.bystander_errors.append("session.done never came")
        except (OSError, websockets.ConnectionClosed) as exc:
            self.bystander_errors.append(repr(exc))
        finally:
            self.ready.set()

    async def _hear(self, ws: websockets.ClientConnection) -> None:
        async for frame in ws:
            if not isinstance(frame, str):
                continue
            message = json.loads(frame)
            if message["type"] == "audio" and (sent := self._pending.pop(message["unit_start"], None)) is not None:
                if not self._stop.is_set():  # what arrives while the session ends is not during the flood
                    self.audio_ms.append(1000 * (time.perf_counter() - sent))
            elif message["type"] == "error":
                self.bystander_errors.append(message["code"])

    async def _memory(self) -> None:
        while self.rss is not None and not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.rss_peak = max(self.rss_peak, self.rss())
            await self._pause(0.05)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


async def _observe(url: str, rss: Callable[[], int] | None, key: str | None, during: Callable[[], Any]) -> Observers:
    observers = Observers(url, rss, key)
    watching = asyncio.create_task(observers.run())
    with contextlib.suppress(TimeoutError):  # the bystander's session is open before the flood starts
        await asyncio.wait_for(observers.ready.wait(), 30)
    await asyncio.sleep(0.3)
    try:
        await during()
    finally:
        observers.stop()
        await watching
    return observers


async def _run_flood(
    url: str, flood: Flood, key: str | None, args: argparse.Namespace, rss: Callable[[], int] | None
) -> dict:
    result: dict[str, Any] = {}
    rss_before = rss() if rss else 0

    async def during() -> None:
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        work = (url, flood, args.messages, args.timeout_s, key, out)
        process = context.Process(target=_flood_process, args=work, daemon=True)
        process.start()
        result.update(await asyncio.get_running_loop().run_in_executor(None, out.get, True, args.timeout_s + 60))
        process.join(10)

    observers = await _observe(url, rss, args.bystander_key, during)
    return {"flood": result, **_observed(observers, rss_before if rss else None)}


def _observed(observers: Observers, rss_before: int | None) -> dict[str, Any]:
    grown = None if rss_before is None else round((observers.rss_peak - rss_before) / MiB, 2)
    return {"healthz_ms": summary(observers.healthz_ms, 2), "audio_ms": summary(observers.audio_ms, 2),
            "bystander_errors": observers.bystander_errors, "rss_peak_growth_mib": grown}  # fmt: skip


# ---------------------------------------------------------------------- the command


def run_abuse_bench(args: argparse.Namespace) -> int:
    kinds = [k for k in args.kinds.split(",") if k] or list(FLOODS)
    unknown = [k for k in kinds if k not in FLOODS]
    if unknown:
        raise SystemExit(f"voxgate bench abuse: unknown kinds {unknown}; known: {', '.join(FLOODS)}")
    stamp = datetime.now(UTC)
    if args.url:
        rss = _rss_of(args.pid) if args.pid else None
        report = asyncio.run(_bench(args.url.rstrip("/"), kinds, args, rss))
    else:
        env = settings_env(args.set, "voxgate bench abuse")
        if "API_KEYS" not in env:  # a client per flood and the bystander: every limit is per client
            keys = [secrets.token_urlsafe(16) for _ in range(len(kinds) + 1)]
            args.bystander_key, args.flood_key = keys[0], ",".join(keys[1:])
            env["API_KEYS"] = ",".join(keys)
        with ServerProcess(args.engine, env=env) as server:
            print(f"server ready at {server.url} (engine {args.engine})", flush=True)
            report = asyncio.run(_bench(server.url, kinds, args, server.rss_bytes))
        shown = {k: ("<redacted>" if "KEYS" in k else v) for k, v in env.items()}  # keys never in a report
        report["server"] = {"engine": args.engine, "settings": shown}
    report["clients"] = "flooder and bystander: two API keys" if args.bystander_key else "one client (no keys)"
    report.update(machine=machine(), date=stamp.isoformat(timespec="seconds"), messages=args.messages)
    write_report(report, "abuse", stamp, args.output_json, _table(report))
    return 0 if all(row["met"] for row in report["floods"].values()) else 1


async def _bench(url: str, kinds: list[str], args: argparse.Namespace, rss: Callable[[], int] | None) -> dict:
    baseline = _observed(await _observe(url, rss, args.bystander_key, lambda: asyncio.sleep(args.baseline_s)), None)
    print(f"baseline: healthz p99 {baseline['healthz_ms']['p99']} ms, audio p99 {baseline['audio_ms']['p99']} ms")
    floods = {}
    flood_keys = (args.flood_key or "").split(",")
    for i, kind in enumerate(kinds):
        row = await _run_flood(url, FLOODS[kind], flood_keys[i % len(flood_keys)] or None, args, rss)
        _judge(row, baseline)
        floods[kind] = row
        print(f"{kind}: sent {row['flood'].get('sent')}, healthz +{row['healthz_delay_ms']} ms, "
              f"audio +{row['audio_delay_ms']} ms, rss +{row['rss_peak_growth_mib']} MiB, met={row['met']}",
              flush=True)  # fmt: skip
    targets = {"delay_p99_ms": TARGET_DELAY_MS, "rss_growth_mib": TARGET_RSS_MIB}
    return {"baseline": baseline, "floods": floods, "targets": targets}


def _judge(row: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Delays are p99 during the flood minus the baseline's p99."""

    def delay(name: str) -> float | None:
        during, quiet = row[name]["p99"], baseline[name]["p99"]
        return None if during is None or quiet is None else round(during - quiet, 2)

    row["healthz_delay_ms"], row["audio_delay_ms"] = delay("healthz_ms"), delay("audio_ms")
    rss = row["rss_peak_growth_mib"]
    row["met"] = (
        row["healthz_delay_ms"] is not None and row["healthz_delay_ms"] <= TARGET_DELAY_MS
        and row["audio_delay_ms"] is not None and row["audio_delay_ms"] <= TARGET_DELAY_MS
        and (rss is None or rss <= TARGET_RSS_MIB) and not row["bystander_errors"]
    )  # fmt: skip


def _rss_of(pid: int) -> Callable[[], int]:
    def rss() -> int:
        with open(f"/proc/{pid}/status") as status:
            return 1024 * next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

    return rss


def _table(report: dict[str, Any]) -> str:
    base = report["baseline"]
    lines = [
        f"baseline: healthz p50/p99 {base['healthz_ms']['p50']}/{base['healthz_ms']['p99']} ms, "
        f"bystander audio p50/p99 {base['audio_ms']['p50']}/{base['audio_ms']['p99']} ms",
        "",
        "| flood | sent | closes | healthz p99 (+delay) ms | audio p99 (+delay) ms | RSS peak +MiB | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, row in report["floods"].items():
        closes = ", ".join(f"{k}x{v}" for k, v in row["flood"].get("closes", {}).items()) or "-"
        healthz = f"{row['healthz_ms']['p99']} (+{row['healthz_delay_ms']})"
        audio = f"{row['audio_ms']['p99']} (+{row['audio_delay_ms']})"
        met = "yes" if row["met"] else "NO"
        lines.append(f"| {kind} | {row['flood'].get('sent')} | {closes} | {healthz} | {audio} | "
                     f"{row['rss_peak_growth_mib']} | {met} |")  # fmt: skip
    return "\n".join(lines)
