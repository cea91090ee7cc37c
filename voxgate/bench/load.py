"""`voxgate load`: many WebSocket TTS sessions against a running gateway, with fault injection.

Each simulated client opens `/v1/tts/ws`, sends text at `--cps` units per second as an LLM
would, and reads the audio back; some sessions are disconnected, cancelled or stop reading
for a while (the fault plan, drawn from `--seed`). Every unit is accounted for exactly
(received / missing / duplicate / cancelled / mismatched) and timed (TTFA, UnitLatency).

This module holds the command: its parameters, the text cut into deltas, the fault plan (all
plain functions), and the run that ties them together. `load_client` does the socket I/O;
`load_stats` keeps the per-session ledger and builds the results.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voxgate.bench.load_stats import markdown_table, summarize
from voxgate.bench.stats import machine, write_report
from voxgate.runtime import loop_name, run, settle_heap
from voxgate.stats import percentile
from voxgate.text import split_units
from voxgate.types import InvalidRequest

SCENARIOS = ("baseline", "mixed", "overload")
MIXED_DEFAULT_PERCENT = 0.1
FAULT_WINDOW = (0.25, 0.6)  # faults start between these fractions of the sending time

DEFAULT_TEXT = (
    "The night train left the coast a little after nine, and most of the passengers were asleep "
    "before it reached the hills. In the last carriage, a retired engineer kept a notebook open "
    "on his knees and wrote down every station, the minute it arrived, and the minute it left. "
    "He had done this for forty years. Nobody had ever asked him why, and he had never offered "
    "to explain. The conductor knew him by name and brought him tea without being asked. "
    "Around midnight the rain started, soft at first, then hard enough to drown the sound of "
    "the wheels. The lights flickered twice. A child woke up in the middle carriage and asked "
    "whether the train would stop, and her mother said that trains like this one never stop "
    "for rain. The engineer smiled when he heard it, because it was almost true. He remembered "
    "a winter when the river rose over the tracks near the old mill, and the train waited for "
    "three hours while men with lanterns walked along the rails and measured the water with "
    "long poles. Nobody complained that night. People shared bread and blankets, and somebody "
    "played a harmonica until the sky turned grey. When the water finally went down, the "
    "driver sounded the whistle so long that the cows in the next field ran to the far fence. "
    "The engineer wrote that down as well, with the exact time, and drew a small cow next to "
    "it. Tonight there was no flood and no harmonica, only the rain and the steady rhythm of "
    "the carriages. He filled two more pages with stations and minutes. Somewhere past the "
    "border, the clouds opened and a thin moon came out over the fields. The train slowed for "
    "a long curve, and he could see the front of it bending away ahead of him, every window a "
    "small square of yellow light. He closed the notebook and put it back in his coat. In the "
    "morning there would be coffee, a new city, and a platform full of strangers in a hurry. "
    "He would write down the minute they arrived, as always, and then he would walk into town "
    "to find a bakery that opened early. Some habits keep a person company for a whole life, "
    "and this was one of his. The rain stopped just before dawn, and the first birds were "
    "already singing when the train crossed the last bridge and rolled slowly into the station."
)


@dataclass(frozen=True, slots=True)
class LoadParams:
    """What one `voxgate load` run does; percents are fractions of sessions (0..1)."""

    url: str
    scenario: str = "baseline"
    concurrency: int = 50
    cps: float = 5.0
    duration_s: float = 60.0
    units: str = "words"
    disconnect: float = 0.0
    cancel: float = 0.0
    backpressure: float = 0.0
    backpressure_pause_s: float = 10.0
    reconnect_delay_s: float = 1.0
    utterance_units: int = 0  # end an utterance every this many units (0: the whole text is one)
    starter_units: int | None = None  # session.start's starter_units (None: the server's default)
    seed: int = 0
    api_key: str | None = None
    admin_key: str | None = None
    voice: str | None = None
    text_file: str | None = None
    output_json: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `voxgate load` flags."""
    add = parser.add_argument
    add("--url", default="ws://127.0.0.1:8000/v1/tts/ws", help="gateway URL (default ws://127.0.0.1:8000/v1/tts/ws)")
    add(
        "--scenario",
        default="baseline",
        choices=SCENARIOS,
        help="baseline: no faults; mixed: faults (default 0.1 each); overload: no faults, then a probe of fresh "
        "sessions right after (run it past capacity)",
    )
    add("--concurrency", type=int, default=50, help="sessions started together (default 50)")
    add("--cps", type=float, default=5.0, help="text units sent per second per session (default 5)")
    add("--duration", type=float, default=60.0, help="seconds of text sending per session (default 60)")
    add("--text-file", default=None, help="UTF-8 text to send (default: a built-in English text)")
    add("--units", default="words", choices=["words", "chars"], help="unit of text (default words)")
    add(
        "--utterance-units", type=int, default=0,
        help="end an utterance every N units and go on with the next on the same socket (default 0: one utterance)",
    )  # fmt: skip
    for kind in ("disconnect", "cancel", "backpressure"):
        add(
            f"--{kind}-percent", type=float, default=None, help=f"fraction of sessions with a {kind} (0..1; mixed: 0.1)"
        )
    add("--backpressure-pause-s", type=float, default=10.0, help="how long a backpressure session stops reading")
    add("--reconnect-delay-s", type=float, default=1.0, help="wait before reconnecting after a dropped socket")
    add(
        "--starter-units", type=int, default=None,
        help="session.start's starter_units: the first segment's size (0: none; default: the server's, 3)",
    )  # fmt: skip
    add("--api-key", default=None, help="bearer key, when the server has API keys")
    add(
        "--admin-key", default=None,
        help="admin key for the server's own first-audio stages (GET /debug/timings; default: --api-key)",
    )  # fmt: skip
    add("--voice", default=None, help="voice id (default: the server's)")
    add("--seed", type=int, default=0, help="seed of the fault plan (default 0)")
    add("--output-json", default=None, help="where to write results (default bench/results/load-<time>.json)")
    add(
        "--find-capacity", action="store_true",
        help="raise the sessions from --concurrency (x --capacity-growth a round) until a round has an underrun, "
        "first audio p95 over --ttfa-bound-ms, a lost unit or a refused session; then narrow it to 10%%",
    )  # fmt: skip
    add("--capacity-max", type=int, default=1024, help="most sessions a capacity round tries (default 1024)")
    add("--capacity-growth", type=float, default=1.5, help="sessions grow by this factor per round (default 1.5)")
    add("--ttfa-bound-ms", type=float, default=1000.0, help="first-audio p95 a capacity round may have (default 1000)")
    add(
        "--max-underrun-ms", type=float, default=0.0,
        help="underrun ms a capacity round may add up to and still pass (default 0: any underrun fails it)",
    )  # fmt: skip
    add(
        "--underruns", choices=("all", "text-in-hand"), default="all",
        help="which underruns fail a capacity or overload round: all (default), or text-in-hand: not those after "
        "the listener waited for the text (each as short as a segment's first audio; reported either way)",
    )  # fmt: skip
    add("--probe-sessions", type=int, default=4, help="overload: fresh sessions started once it ends (default 4)")
    add("--probe-duration", type=float, default=10.0, help="overload: the probe's seconds of text (default 10)")


def params_from_args(args: argparse.Namespace) -> LoadParams:
    """Parameters from the parsed flags; `baseline` forces every fault fraction to 0."""
    given = {k: getattr(args, f"{k}_percent") for k in ("disconnect", "cancel", "backpressure")}
    if args.scenario in ("baseline", "overload"):
        faults = dict.fromkeys(given, 0.0)
    else:
        faults = {k: MIXED_DEFAULT_PERCENT if v is None else v for k, v in given.items()}
    params = LoadParams(
        url=args.url, scenario=args.scenario, concurrency=args.concurrency, cps=args.cps, duration_s=args.duration,
        units=args.units, utterance_units=args.utterance_units, backpressure_pause_s=args.backpressure_pause_s,
        reconnect_delay_s=args.reconnect_delay_s, starter_units=args.starter_units,
        seed=args.seed, api_key=args.api_key, admin_key=args.admin_key, voice=args.voice, text_file=args.text_file,
        output_json=args.output_json, **faults,
    )  # fmt: skip
    check_params(params)
    return params


def check_params(params: LoadParams) -> None:
    """Refuse values the run cannot honour, with a message naming the flag."""
    for name in ("disconnect", "cancel", "backpressure"):
        value = getattr(params, name)
        if not 0.0 <= value <= 1.0:
            raise InvalidRequest(f"--{name}-percent is a fraction of sessions in 0..1, got {value}")
    if params.utterance_units < 0:
        raise InvalidRequest("--utterance-units must not be negative (0: the whole text is one utterance)")
    if params.concurrency < 1:
        raise InvalidRequest("--concurrency must be at least 1")
    if params.cps <= 0 or params.duration_s <= 0:
        raise InvalidRequest("--cps and --duration must be positive")
    if params.backpressure_pause_s < 0 or params.reconnect_delay_s < 0:
        raise InvalidRequest("--backpressure-pause-s and --reconnect-delay-s must not be negative")
    if not params.url.startswith(("ws://", "wss://")):
        raise InvalidRequest(f"--url must be a ws:// or wss:// URL, got {params.url!r}")


# ---------------------------------------------------------------------------- text


@dataclass(frozen=True, slots=True)
class TextPlan:
    """The deltas one session sends: one unit each, with the spaces that follow it."""

    deltas: tuple[str, ...]
    available: int  # units in the whole text
    needed: int  # cps x duration

    @property
    def short(self) -> bool:
        return self.available < self.needed


def unit_deltas(text: str, units: str) -> list[str]:
    """Cut `text` into deltas of exactly one unit (as the gateway counts them) plus trailing spaces."""
    if units == "words":
        starts = [u.start for u in split_units(text)]
    else:
        starts = [m.start() for m in re.finditer(r"\S", text)]
    ends = [*starts[1:], len(text)]
    return [text[s:e] for s, e in zip(starts, ends, strict=True)]


def plan_text(text: str, units: str, cps: float, duration_s: float) -> TextPlan:
    """The deltas for `duration_s` at `cps`; a text too short is kept whole and flagged, never padded."""
    deltas = unit_deltas(text.strip(), units)
    needed = math.ceil(cps * duration_s - 1e-9)
    return TextPlan(tuple(deltas[:needed]), len(deltas), needed)


def load_text(path: str | None) -> str:
    """The text of `--text-file`, or the built-in one."""
    if path is None:
        return DEFAULT_TEXT
    text = Path(path).read_text(encoding="utf-8")
    if not text.strip():
        raise InvalidRequest(f"--text-file {path} has no text")
    return text


def short_text_warning(plan: TextPlan, cps: float) -> str | None:
    """The line to print when the text runs out before the duration (None when it does not)."""
    if not plan.short:
        return None
    return (
        f"warning: the text has {plan.available} units, fewer than cps x duration = {plan.needed}; "
        f"each session sends text.end when it runs out (after {plan.available / cps:.1f} s)"
    )


# ---------------------------------------------------------------------------- faults


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """When (seconds after the run starts) each injected fault of one session happens; None = never."""

    disconnect_at: float | None = None
    cancel_at: float | None = None
    backpressure_at: float | None = None

    def events(self) -> list[tuple[float, str]]:
        """(time, kind) in time order."""
        pairs = [(self.disconnect_at, "disconnect"), (self.cancel_at, "cancel"), (self.backpressure_at, "backpressure")]
        return sorted((t, kind) for t, kind in pairs if t is not None)


def plan_faults(params: LoadParams, sending_s: float) -> list[FaultPlan]:
    """One plan per session, reproducible from `params.seed`: each kind is drawn independently
    with its fraction and placed in the middle of the sending time (`FAULT_WINDOW`); a
    backpressure pause starts early enough to end before the text does, where it can."""
    rng = random.Random(params.seed)
    low, high = FAULT_WINDOW[0] * sending_s, FAULT_WINDOW[1] * sending_s
    windows = {"disconnect": (low, high), "cancel": (low, high),
               "backpressure": (low, max(low, min(high, sending_s - params.backpressure_pause_s)))}  # fmt: skip
    plans = []
    for _ in range(params.concurrency):
        times = {}
        for kind, (start, end) in windows.items():
            hit, at = rng.random() < getattr(params, kind), round(rng.uniform(start, end), 3)
            times[f"{kind}_at"] = at if hit else None
        plans.append(FaultPlan(**times))
    return plans


# ---------------------------------------------------------------------------- the run


def execute(params: LoadParams) -> dict[str, Any]:
    """Run the load and return the report (no file written); warnings go to stderr."""
    from voxgate.bench.load_client import run_sessions  # websockets is imported only when a run starts

    text = plan_text(load_text(params.text_file), params.units, params.cps, params.duration_s)
    warning = short_text_warning(text, params.cps)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    before = machine()
    started = datetime.now(UTC)
    wall = time.perf_counter()
    settle_heap()  # the client's own collections must not pause its clock
    ledgers = run(run_sessions(params, text))
    results = summarize(ledgers, len(text.deltas) / params.cps)
    results["server_first_audio"] = server_first_audio(params, started.timestamp())
    return {
        "bench": "load",
        "date": started.isoformat(timespec="seconds"),
        "machine": before,
        "load_avg_1m_after": machine()["load_avg_1m"],
        "client_event_loop": loop_name(),  # the server reports its own at start-up
        "parameters": _parameters(params),
        "text": {
            "units": text.available,
            "units_needed": text.needed,
            "units_sent_per_session": len(text.deltas),
            "text_short": text.short,
            "note": warning,
        },
        "wall_s": round(time.perf_counter() - wall, 2),
        "results": results,
    }


def wait_idle(params: LoadParams, timeout_s: float = 180.0, poll_s: float = 1.0) -> float | None:
    """Wait until the server computes no stream (`/healthz` active_streams 0): the sessions of
    a round that ran past capacity may leave work behind (a segment under way each), and the
    next round must not inherit it. Returns the seconds waited, or None when the server would
    not say or was still busy after `timeout_s` (the round then starts anyway)."""
    import httpx

    base = _http_base(params)
    start = time.monotonic()
    while True:
        try:
            active = httpx.get(f"{base}/healthz", timeout=10).json()["active_streams"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        if active == 0:
            return round(time.monotonic() - start, 1)
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(poll_s)


def server_first_audio(params: LoadParams, since: float) -> dict[str, Any]:
    """The server's own split of each segment's first audio during this run (queue, slot,
    engine, hop, write: see the README's metrics), from `GET /debug/timings`, an admin route.
    Percentiles in ms over the segments that opened an utterance and over all segments; a
    reason instead when the server would not say (no admin key, an older server, a ring of
    timings smaller than the run: raise VOXGATE_TIMINGS_KEPT)."""
    import httpx

    base = _http_base(params)
    key = params.admin_key or params.api_key
    try:
        reply = httpx.get(f"{base}/debug/timings", params={"last": 100_000},
                          headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=30)  # fmt: skip
        reply.raise_for_status()
        body = reply.json()
        kept, capacity = body["timings"], body.get("capacity")
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return {"unavailable": f"GET /debug/timings: {type(exc).__name__}: {exc}"[:300]}
    ours = [t for t in kept if t.get("status") == "first_audio" and t.get("t_wall", 0) >= since and "stages_ms" in t]
    note = None
    oldest = min((t.get("t_wall", t.get("t_req_in", 0.0)) for t in kept), default=0.0)
    if capacity is not None and len(kept) >= capacity and oldest >= since:
        note = f"the server keeps {capacity} timings, all from this run: it may have dropped the earliest"

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"segments": len(rows)}
        for stage in (*rows[0]["stages_ms"], "total") if rows else ():
            values = [r["ttfa_ms"] if stage == "total" else r["stages_ms"][stage] for r in rows]
            out[stage] = {f"p{q}": round(percentile(values, q) or 0.0, 2) for q in (50, 95, 99)}
        split = [r["engine_ms"] for r in rows if "engine_ms" in r]  # the engine's own clocks, where it keeps them
        if split:
            out["engine_split"] = {stage: {f"p{q}": round(percentile([s[stage] for s in split], q) or 0.0, 2)
                                           for q in (50, 95, 99)} for stage in split[0]}  # fmt: skip
        return out

    return {"utterance_first": summary([t for t in ours if t["opens_utterance"]]), "all": summary(ours), "note": note}


def _command(params: LoadParams) -> str:
    """This command line for the report, keys redacted."""
    command = shlex.join(["voxgate", *sys.argv[1:]])
    for key in (params.api_key, params.admin_key):
        if key:
            command = command.replace(key, "***")
    return command


def _parameters(params: LoadParams) -> dict[str, Any]:
    """The run's parameters for the report, without the keys."""
    return {k: v for k, v in asdict(params).items() if k not in ("api_key", "admin_key")}


def _http_base(params: LoadParams) -> str:
    """The server's HTTP root, from the gateway URL."""
    return re.sub(r"^ws", "http", params.url.split("/v1/")[0])


def run_load(args: argparse.Namespace) -> int:
    """`voxgate load`: run, print the table, write the JSON; exit 1 if any unit was lost or mangled."""
    params = params_from_args(args)
    if args.find_capacity or args.scenario == "overload":
        return run_capacity(args, params)
    report = {"command": _command(params), **execute(params)}
    stamp = datetime.fromisoformat(report["date"])
    results = report["results"]
    table = markdown_table(results)
    if report["text"]["text_short"]:
        table += "\n\n" + report["text"]["note"]
    write_report(report, "load", stamp, params.output_json, table)
    u = results["units"]
    return 1 if u["missing"] or u["duplicate"] or u["mismatched"] else 0


def run_capacity(args: argparse.Namespace, params: LoadParams) -> int:
    """`--find-capacity` or `--scenario overload` (see `capacity`): rounds of `execute`, one report."""
    from voxgate.bench.capacity import capacity_table, find_capacity, overload

    started = datetime.now(UTC)
    report: dict[str, Any] = {
        "command": _command(params),
        "bench": "load",
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "parameters": _parameters(params),
    }

    def settled(round_params: LoadParams) -> dict[str, Any]:
        """A round once the server has nothing left of the round before."""
        waited = wait_idle(round_params)
        note = "the server did not get idle in 180 s" if waited is None else f"waited {waited} s for an idle server"
        print(f"[capacity] {note}; {round_params.concurrency} sessions", file=sys.stderr, flush=True)
        out = execute(round_params)
        out["results"]["idle_wait_s"] = waited
        return out

    if args.find_capacity:
        found = find_capacity(
            params, settled, limit=args.capacity_max, growth=args.capacity_growth, ttfa_bound_ms=args.ttfa_bound_ms,
            underrun_ms_max=args.max_underrun_ms, text_waits=args.underruns == "all",
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )  # fmt: skip
        report["capacity"] = found
        table = capacity_table(found)
        code = 0
    else:
        result = overload(params, execute, probe_sessions=args.probe_sessions, probe_duration_s=args.probe_duration,
                          ttfa_bound_ms=args.ttfa_bound_ms, underrun_ms_max=args.max_underrun_ms,
                          text_waits=args.underruns == "all")  # fmt: skip
        report["overload"] = result
        crowd, probe = result["crowd"], result["probe_after"]
        table = "\n".join([
            markdown_table(result["crowd_results"]), "",
            f"crowd ({crowd['sessions']} sessions): {'within' if crowd['passed'] else 'past'} capacity "
            f"({'; '.join(crowd['why_not']) or 'no underrun, first audio in bound'})",
            f"probe right after ({probe['sessions']} fresh sessions): first audio p95 "
            f"{probe['first_audio_p95_ms']} ms, underruns {probe['underruns']}, errors {probe['errors'] or 'none'}",
        ])  # fmt: skip
        units = result["crowd_results"]["units"]
        code = 1 if units["missing"] or units["duplicate"] or units["mismatched"] else 0
    write_report(report, "load", started, params.output_json, table)
    return code
