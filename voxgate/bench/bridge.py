"""`voxgate bench bridge`: the LLM-to-speech bridge on a real server, written as JSON.

Three series over the same prompts (temperature 0, so the LLM writes the same replies):

- `bridge`: `POST /v1/bridge/stream`; per reply the server's timings: LLM first token, first
  segment, first audio, and the gap first audio - LLM first token, split by whether the
  starter came from the starter cache (the prompts ask the LLM to open with "Sure,").
- `sentence_then_tts` (the usual glue, as a peer in the same run): the client streams
  `/v1/chat/completions`, waits for the first complete sentence, then posts it to
  `/tts/stream`; the gap is its first audio byte - its first LLM token, both client-side.
- `cancel`: paced replies (real time, 300 ms ahead) stopped after 3..38 audio events of 40 ms,
  so the stop lands while audio flows; the server's cancel->silence (stop to the last audio
  written), the client's stop->done, and the audio events that still arrived after the stop.

Plus the segmenter over the generated zh/en corpus (protected splits, short segments).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx

from voxgate.bench.server import ServerProcess, add_set_argument, settings_env
from voxgate.bench.stats import machine, summary, write_report
from voxgate.bridge.corpus import check_corpus, load_replies

SYSTEM = "You are a helpful voice assistant. Begin every reply with 'Sure.' and keep replies short."
PROMPTS = [
    "Can you help me plan a trip?", "Give me a tip for sleeping better.", "Tell me a short story about a cat.",
    "What is the capital of France?", "How do I boil an egg?", "Why is the sky blue?", "Recommend a book.",
    "Explain gravity briefly.", "What should I cook tonight?", "How can I learn to play the guitar?",
]  # fmt: skip
_SENTENCE_END = re.compile(r"[.!?。！？](\s|$)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help="a running server (default: start `voxgate serve` here)")
    parser.add_argument("--engine", default="piper", help="engine of the started server (default piper)")
    add_set_argument(parser)
    parser.add_argument("--n", type=int, default=30, help="replies per series (default 30)")
    parser.add_argument("--cancels", type=int, default=30, help="stopped replies (default 30)")
    parser.add_argument("--max-tokens", type=int, default=60, help="LLM reply length (default 60)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed replies first (default 2)")
    parser.add_argument("--output-json", default=None, help="where to write results (default bench/results/...)")


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def bridge_reply(client: httpx.Client, url: str, i: int, max_tokens: int, stop_after: int | None = None) -> dict:
    """One bridge reply; with `stop_after`, stopped once that many audio events arrived."""
    body = {"messages": _messages(i), "max_tokens": max_tokens, "temperature": 0, "pacing": stop_after is not None}
    audio, after_stop, stop_t, done = 0, 0, None, {}
    with client.stream("POST", f"{url}/v1/bridge/stream", json=body) as response:
        response.raise_for_status()
        for event in _events(response):
            if event["type"] == "audio":
                audio += 1
                after_stop += stop_t is not None
                if stop_after is not None and audio == stop_after and stop_t is None:
                    stop_t = time.perf_counter()
                    client.post(f"{url}/v1/bridge/{response.headers['x-bridge-id']}/stop").raise_for_status()
            elif event["type"] == "done":
                done = event
    t_done = time.perf_counter()
    t = done.get("timings_ms", {})
    row = {"status": done.get("status"), "cached": bool(done.get("starter_cached")), "timings_ms": t,
           "segments": done.get("segments", 0), "triggers": done.get("triggers", {}),
           "queue_peak": done.get("queue_peak", 0)}  # fmt: skip
    if "first_audio" in t and "llm_first_token" in t:
        row["gap_ms"] = round(t["first_audio"] - t["llm_first_token"], 2)
    if stop_t is not None:
        row["stop_to_done_ms"] = round(1000 * (t_done - stop_t), 2)
        row["audio_after_stop"] = after_stop
    return row


def sentence_then_tts(client: httpx.Client, url: str, i: int, max_tokens: int) -> dict:
    """The usual glue: first whole sentence from the LLM, then one TTS request for it."""
    body = {"messages": _messages(i), "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text, first_token = "", None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = (json.loads(line[6:])["choices"][0].get("delta") or {}).get("content") or ""
            if delta and first_token is None:
                first_token = time.perf_counter()
            text += delta
            if (match := _SENTENCE_END.search(text)) and match.end() < len(text):
                break
    sentence = text[: match.end()].strip() if match else text.strip()
    with client.stream("POST", f"{url}/tts/stream", json={"text": sentence}) as response:
        response.raise_for_status()
        first_audio = next((time.perf_counter() for part in response.iter_raw() if part), None)
    if first_token is None or first_audio is None:
        return {"sentence": sentence}
    return {"sentence": sentence, "gap_ms": round(1000 * (first_audio - first_token), 2)}


def _progress(name: str, k: int, n: int) -> None:
    if k == n or k % 10 == 0:
        print(f"  {name}: {k}/{n}", flush=True)


def run_series(url: str, n: int, cancels: int, max_tokens: int, warmup: int) -> dict[str, Any]:
    with httpx.Client(timeout=120) as client:
        for i in range(warmup):
            bridge_reply(client, url, i, max_tokens)
        bridge, peer, stopped = [], [], []
        for i in range(n):  # interleaved, so both see the same machine load
            bridge.append(bridge_reply(client, url, i, max_tokens))
            peer.append(sentence_then_tts(client, url, i, max_tokens))
            _progress("bridge + sentence_then_tts", i + 1, n)
        for i in range(cancels):
            stopped.append(bridge_reply(client, url, i, max_tokens, stop_after=3 + 7 * (i % 6)))
            _progress("cancel", i + 1, cancels)
    return {"bridge": bridge, "sentence_then_tts": peer, "cancel": stopped}


def _stage(rows: list[dict], key: str) -> dict[str, Any]:
    return summary([r["timings_ms"][key] for r in rows if key in r["timings_ms"]], digits=1)


def _gaps(rows: list[dict]) -> dict[str, Any]:
    return summary([r["gap_ms"] for r in rows if "gap_ms" in r], digits=1)


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    bridge, peer, stopped = raw["bridge"], raw["sentence_then_tts"], raw["cancel"]
    hits = [r for r in bridge if r["cached"]]
    misses = [r for r in bridge if not r["cached"]]
    triggers: dict[str, int] = {}
    for r in bridge:
        for k, v in r["triggers"].items():
            triggers[k] = triggers.get(k, 0) + v
    gap_all, gap_peer = _gaps(bridge), _gaps(peer)
    out = {
        "replies": len(bridge),
        "status": {s: sum(r["status"] == s for r in bridge + stopped) for s in ("completed", "cancelled", "failed")},
        "llm_first_token_ms": _stage(bridge, "llm_first_token"),
        "first_segment_ms": _stage(bridge, "first_segment"),
        "first_audio_ms": _stage(bridge, "first_audio"),
        "gap_ms": {"all": gap_all, "starter_cache_hit": _gaps(hits), "starter_cache_miss": _gaps(misses)},
        "sentence_then_tts_gap_ms": gap_peer,
        "gap_ratio_p50": round(gap_peer["p50"] / gap_all["p50"], 2) if gap_peer["p50"] and gap_all["p50"] else None,
        "cancel_to_silence_ms": _stage(stopped, "cancel_to_silence"),
        "stop_to_done_ms": summary([r["stop_to_done_ms"] for r in stopped if "stop_to_done_ms" in r], 1),
        "audio_events_after_stop": summary([r["audio_after_stop"] for r in stopped if "audio_after_stop" in r], 0),
        "segments_per_reply": summary([r["segments"] for r in bridge], 1),
        "queue_peak": max((r["queue_peak"] for r in bridge), default=0),
        "triggers": triggers,
    }
    return out


def _table(s: dict[str, Any], corpus: dict[str, Any]) -> str:
    g = s["gap_ms"]
    rows = [
        ("LLM first token (server) ms", s["llm_first_token_ms"]),
        ("first audio - LLM first token, all ms", g["all"]),
        ("  ... starter-cache hit ms", g["starter_cache_hit"]),
        ("  ... starter-cache miss ms", g["starter_cache_miss"]),
        ("sentence-then-TTS peer, same gap ms", s["sentence_then_tts_gap_ms"]),
        ("cancel->silence (server) ms", s["cancel_to_silence_ms"]),
        ("stop->done (client) ms", s["stop_to_done_ms"]),
    ]
    lines = ["| measure | n | p50 | p95 | max |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {v['n']} | {v['p50']} | {v['p95']} | {v['max']} |" for name, v in rows]
    lines.append(f"\npeer/bridge gap ratio (p50): {s['gap_ratio_p50']}; statuses {s['status']}; triggers "
                 f"{s['triggers']}; corpus: {corpus['replies']} replies, {corpus['protected_splits']} protected "
                 f"splits, {corpus['short_segments']} short segments")  # fmt: skip
    return "\n".join(lines)


def run_bridge_bench(args: argparse.Namespace) -> int:
    before = machine()
    t0 = time.perf_counter()
    print("segmenter corpus (the written replies) ...", flush=True)
    corpus = check_corpus(load_replies())
    if args.url:
        raw = run_series(args.url.rstrip("/"), args.n, args.cancels, args.max_tokens, args.warmup)
    else:
        env = {"LLM_EMBEDDED": "true", **settings_env(args.set, "voxgate bench bridge")}
        with ServerProcess(args.engine, env=env) as server:
            print(
                f"[{args.engine} + embedded LLM] ready in {time.perf_counter() - t0:.1f} s at {server.url}", flush=True
            )
            raw = run_series(server.url, args.n, args.cancels, args.max_tokens, args.warmup)
    stamp = datetime.now(UTC)
    result = summarise(raw)
    report = {
        "bench": "bridge",
        "date": stamp.isoformat(timespec="seconds"),
        "command": f"voxgate bench bridge --engine {args.engine} --n {args.n} --cancels {args.cancels} "
        f"--max-tokens {args.max_tokens}"
        + "".join(f" --set {kv}" for kv in args.set)
        + (f" --url {args.url}" if args.url else ""),
        "machine": before,
        "load_avg_1m_after": machine()["load_avg_1m"],
        "summary": result,
        "corpus": corpus,
        "replies": raw,
    }
    write_report(report, "bridge", stamp, args.output_json, _table(result, corpus))
    return 0
