"""`voxgate bench http`: TTFA and RTF of real servers over loopback, written as JSON.

For each engine it starts `voxgate serve` on a free port (or, with `--url`, uses a server
already running there, e.g. several replicas behind Ray Serve's proxy), warms it, then times
sequential requests (client side, and server side from /debug/timings by request id): a plain
sentence, the same sentence behind a starter-cache opener, and a burst of concurrent streams
(also as throughput: the audio of the whole burst over its wall time, and each stream's whole
time, where a straggler shows); with `--formats`, the
plain sentence in each output format (what encoding as it streams adds to the first byte).
Numbers are medians/percentiles; the first requests are untimed warm-up.

A burst's client is several processes of threads (`--client-procs`, one per 64 streams by
default): one Python process reading 128 streams at twice real time spends its time waiting for
the interpreter lock, and a slow client makes the server's listeners look starved (the deadline
rule then paces every stream at real time), so the burst would measure the client.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from voxgate.bench.server import ServerProcess, add_set_argument, settings_env
from voxgate.bench.stats import machine, summary, write_report

SENTENCE = "The quick brown fox jumps over the lazy dog near the river."  # 12 words
STREAMS_PER_CLIENT_PROC = 64
TEN_WORDS = "Please read the new report before our meeting tomorrow morning."  # 10 words
STARTER = "Sure. "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", default="tone,piper", help="comma-separated engines (default tone,piper)")
    parser.add_argument("--n", type=int, default=30, help="timed requests per series (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests first (default 3)")
    parser.add_argument("--concurrency", type=int, default=20, help="concurrent streams in the burst series")
    parser.add_argument(
        "--formats", default="", help="also time the plain sentence in these formats, e.g. pcm,mp3,opus,aac,flac"
    )
    parser.add_argument(
        "--url", default=None, help="time the server already running at this base URL (one engine, its label)"
    )
    parser.add_argument("--admin-key", default=None, help="with --url: admin key for its /debug/timings")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help=f"client processes for the burst (default: one per {STREAMS_PER_CLIENT_PROC} streams)",
    )
    add_set_argument(parser)
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


def time_request(client: httpx.Client, url: str, text: str, request_id: str, fmt: str = "pcm") -> dict[str, float]:
    """One streamed /tts/stream request timed on the client (audio seconds: pcm only)."""
    t0 = time.perf_counter()
    first = None
    size = 0
    body = {"text": text, "format": fmt}
    with client.stream("POST", f"{url}/tts/stream", json=body, headers={"x-request-id": request_id}) as r:
        r.raise_for_status()
        rate = int(r.headers["x-sample-rate"])
        for part in r.iter_raw():
            if first is None and part:
                first = time.perf_counter()
            size += len(part)
    done = time.perf_counter()
    audio_s = size / 2 / rate
    return {"ttfa_ms": 1000 * ((first or done) - t0), "total_ms": 1000 * (done - t0), "audio_s": audio_s,
            "start": t0, "done": done}  # fmt: skip


class BurstStreamFailed(RuntimeError):
    """A burst's stream failed (refused, cut off): which one, and httpx's error as text."""


def _burst_request(client: httpx.Client, url: str, text: str, request_id: str, fmt: str) -> dict[str, float]:
    try:
        return time_request(client, url, text, request_id, fmt)
    except httpx.HTTPError as exc:  # as text: an HTTPStatusError does not unpickle, and the parent of a
        # client process would hear only "a process terminated abruptly", not the status
        raise BurstStreamFailed(f"stream {request_id}: {type(exc).__name__}: {exc}") from None


def _burst_part(url: str, text: str, ids: list[str], fmt: str, threads: int, start_at: float) -> list[dict[str, float]]:
    """One client process's share of a burst: `threads` streams at a time, from `start_at` (wall
    clock, so every process starts together). Times are wall clock, comparable across processes."""
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=threads + 2)) as client:
        time.sleep(max(0.0, start_at - time.time()))
        offset = time.time() - time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            rows = list(pool.map(lambda rid: _burst_request(client, url, text, rid, fmt), ids))
    return [{**r, "start": r["start"] + offset, "done": r["done"] + offset} for r in rows]


def client_procs(requested: int, concurrency: int) -> int:
    """The client processes a burst of `concurrency` streams runs in (`requested` 0: one per
    STREAMS_PER_CLIENT_PROC), at most one per stream."""
    return max(1, min(requested or -(-concurrency // STREAMS_PER_CLIENT_PROC), concurrency))


def burst(
    url: str, text: str, ids: list[str], fmt: str, concurrency: int, procs: int
) -> tuple[list[dict[str, float]], float]:
    """The ids' streams, `concurrency` at a time, from `procs` client processes: (client rows,
    wall seconds from the first stream's start to the last one's end)."""
    procs = client_procs(procs, concurrency)
    shares = [ids[i::procs] for i in range(procs)]
    threads = [len(range(i, concurrency, procs)) for i in range(procs)]  # the concurrency, split
    if procs == 1:
        rows = _burst_part(url, text, ids, fmt, concurrency, time.time())
    else:
        start_at = time.time() + 0.5 + 0.2 * procs  # time for the processes to start and connect
        with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = [
                pool.submit(_burst_part, url, text, share, fmt, t, start_at)
                for share, t in zip(shares, threads, strict=True)
            ]
            rows = [row for part in parts for row in part.result()]
    return rows, max(r["done"] for r in rows) - min(r["start"] for r in rows)


def _server_timings(client: httpx.Client, url: str, ids: list[str], admin: dict[str, str]) -> list[dict[str, Any]]:
    """The server's rows for `ids`; a stream is recorded just after its response ends, so poll briefly."""
    deadline = time.monotonic() + 5
    while True:
        rows = client.get(f"{url}/debug/timings", params={"last": 100_000}, headers=admin).json()["timings"]
        by_id = {r["request_id"]: r for r in rows}
        if all(rid in by_id for rid in ids) or time.monotonic() > deadline:
            return [by_id[rid] for rid in ids if rid in by_id]
        time.sleep(0.02)


def _series(
    url: str,
    text: str,
    n: int,
    warmup: int,
    concurrency: int,
    admin: dict[str, str],
    fmt: str = "pcm",
    procs: int = 0,
) -> dict[str, Any]:
    ids = [f"bench-{uuid.uuid4().hex[:12]}" for _ in range(n)]
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=concurrency + 2)) as client:
        for _ in range(warmup):
            time_request(client, url, text, f"warm-{uuid.uuid4().hex[:8]}", fmt)
        if concurrency == 1:
            started = time.perf_counter()
            client_rows = [time_request(client, url, text, rid, fmt) for rid in ids]
            wall_s = time.perf_counter() - started
        else:
            procs = client_procs(procs, concurrency)  # what the report says is what ran
            client_rows, wall_s = burst(url, text, ids, fmt, concurrency, procs)
        server_rows = _server_timings(client, url, ids, admin) if admin else []
    audio = sum(r["audio_s"] for r in client_rows) if fmt == "pcm" else None
    return {
        "text": text,
        "format": fmt,
        "concurrency": concurrency,
        "client_ttfa_ms": summary([r["ttfa_ms"] for r in client_rows]),
        "client_total_ms": summary([r["total_ms"] for r in client_rows]),
        "server_ttfa_ms": summary([r["ttfa_ms"] for r in server_rows if r["ttfa_ms"] is not None]),
        "server_rtf": summary([r["rtf"] for r in server_rows if r["rtf"] is not None], digits=4),
        "audio_s": summary([r["audio_s"] for r in (client_rows if fmt == "pcm" else server_rows)]),
        "starter_hits": sum(1 for r in server_rows if r["starter"]),
        "wall_s": round(wall_s, 4),
        **({"client_procs": procs} if concurrency > 1 else {}),
        "audio_s_per_s": round(audio / wall_s, 2) if audio is not None else None,  # the series' throughput
    }


def bench_engine(
    engine: str,
    n: int,
    warmup: int,
    concurrency: int,
    settings: dict[str, str] | None = None,
    formats: tuple[str, ...] = (),
    url: str | None = None,
    admin_key: str | None = None,
    procs: int = 0,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    if url is not None:
        print(f"[{engine}] timing the server at {url}", flush=True)
        admin = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        return _all_series(engine, url, n, warmup, concurrency, admin, formats, procs)
    # A stream's slot is freed just after its response ends: twice the burst, so a request sent on the
    # heels of the last one is not refused while that slot is still being let go.
    limits = {"MAX_STREAMS": str(max(64, 2 * concurrency)), "MAX_STREAMS_PER_CLIENT": str(max(8, 2 * concurrency))}
    with ServerProcess(engine=engine, env={**limits, **(settings or {})}) as server:
        startup_s = time.perf_counter() - t0
        print(f"[{engine}] server ready in {startup_s:.1f} s at {server.url}", flush=True)
        result = _all_series(engine, server.url, n, warmup, concurrency, server.admin_headers(), formats, procs)
        return {"startup_s": round(startup_s, 2), **result}


def _all_series(
    engine: str,
    url: str,
    n: int,
    warmup: int,
    concurrency: int,
    admin: dict[str, str],
    formats: tuple[str, ...],
    procs: int = 0,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, text, conc in (
        ("ten_words", TEN_WORDS, 1),
        ("starter_hit", STARTER + SENTENCE, 1),
        (f"concurrent_{concurrency}", SENTENCE, concurrency),
    ):
        print(f"[{engine}] {name}: {n} requests, concurrency {conc} ...", flush=True)
        count = n if conc == 1 else max(n, conc)
        result[name] = _series(url, text, count, warmup, conc, admin, procs=procs)
    for fmt in formats:
        print(f"[{engine}] format {fmt}: {n} requests ...", flush=True)
        result[f"format_{fmt}"] = _series(url, TEN_WORDS, n, warmup, 1, admin, fmt)
    return result


def _table(results: dict[str, Any]) -> str:
    lines = [
        "| engine | series | conc | server TTFA p50 / p95 ms | client TTFA p50 / p95 ms | server RTF p50 | audio-s/s | "
        "starter hits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, series in results.items():
        for name, row in series.items():
            if not isinstance(row, dict):
                continue
            s, c = row["server_ttfa_ms"], row["client_ttfa_ms"]
            lines.append(
                f"| {engine} | {name} | {row['concurrency']} | {s['p50']} / {s['p95']} | {c['p50']} / {c['p95']} | "
                f"{row['server_rtf']['p50']} | {row['audio_s_per_s']} | {row['starter_hits']}/{s['n']} |"
            )
    return "\n".join(lines)


def run_http_bench(args: argparse.Namespace) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.url and len(engines) != 1:
        raise SystemExit("voxgate bench http: --url times one running server: name its engine alone in --engines")
    before = machine()
    settings = settings_env(args.set, "voxgate bench http")
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    results = {
        e: bench_engine(
            e, args.n, args.warmup, args.concurrency, settings, formats, args.url, args.admin_key, args.client_procs
        )
        for e in engines
    }
    stamp = datetime.now(UTC)
    report = {
        "bench": "http",
        "date": stamp.isoformat(timespec="seconds"),
        "command": f"voxgate bench http --engines {args.engines} --n {args.n} --concurrency {args.concurrency}"
        + (f" --formats {args.formats}" if formats else "")
        + "".join(f" --set {pair}" for pair in args.set)
        + (f" --client-procs {args.client_procs}" if args.client_procs else "")
        + (f" --url {args.url}" if args.url else ""),
        "machine": before,
        "load_avg_1m_after": machine()["load_avg_1m"],
        "results": results,
    }
    write_report(report, "http", stamp, args.output_json, _table(results))
    return 0
