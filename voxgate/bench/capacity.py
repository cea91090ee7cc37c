"""`voxgate load --find-capacity` and `--scenario overload`: what a gateway can serve in real time.

Capacity (ARCHITECTURE.md): the most concurrent sessions with no underrun and first audio
p95 within its bound; beyond it, new sessions should get `busy` rather than a slow start.
`find_capacity` runs the load at a rising number of sessions (times `growth` each round)
until a round fails, then halves the gap between the last round that passed and the first
that failed until it is within 10%: the knee, and where it saturates. A round fails on any
underrun, a first-audio p95 over the bound, a lost or duplicated unit, or any session refused
or failed (`busy` included: a refusal is the right answer past capacity, but it is not
capacity). With `text_waits=False` (`--underruns text-in-hand`) an underrun after the listener
waited for the text (`load_stats`: the segment's first audio after a starved listener, as short
as the server's first-audio latency and never zero) is reported but fails no round: where text
comes slower than speech (`tone`; a random-weight model's short segments) every such segment
has one, whatever the server's load, so the strict count measures the text, not the capacity.
`overload` runs the load as given (meant to be past capacity), then at once a small probe of
fresh sessions: whether the server still starts new speech promptly once the crowd has left
(no work of departed sessions voiced ahead of it).

Plain functions over `execute` (injected, so the search itself is tested without a server).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from voxgate.bench.load import LoadParams

Execute = Callable[["LoadParams"], dict[str, Any]]
EVENTS_KEPT = 20  # a round keeps its longest underruns one by one (session, when, how long), in time order
RESOLUTION = 0.1  # the search stops once the gap between pass and fail is within 10% (or 1 session)


def judge(
    concurrency: int,
    results: dict[str, Any],
    ttfa_bound_ms: float,
    underrun_ms_max: float = 0.0,
    text_waits: bool = True,
) -> dict[str, Any]:
    """One round's figures and whether it passed, with the reasons it did not (an underrun
    fails it unless the round's underruns add up to at most `underrun_ms_max`; those after a
    text wait only with `text_waits`)."""
    units, x = results["units"], results["underruns"]
    p95 = results["ttfa_ms"]["all"]["p95"]
    refused = dict(results["errors"]["other"])
    why = []
    waited = x["after_text_wait"]
    count, total = x["count"], x["total_ms"]
    if not text_waits:
        count, total = count - waited["count"], round(total - waited["total_ms"], 1)
    if count and total > underrun_ms_max:
        why.append(f"{x['count']} underruns ({x['total_ms']} ms; {waited['count']} after the listener waited for text)")
    if p95 is None or p95 > ttfa_bound_ms:
        why.append(f"first audio p95 {p95} ms > {ttfa_bound_ms:g}")
    if units["missing"] or units["duplicate"] or units["mismatched"]:
        lost = {k: units[k] for k in ("missing", "duplicate", "mismatched")}
        why.append(f"units {lost}")
    if results["sessions_ok"] < results["sessions"] or refused:
        why.append(f"{results['sessions'] - results['sessions_ok']} sessions failed; errors {refused}")
    return {
        "sessions": concurrency,
        "first_audio_p95_ms": p95,
        "gateway_added_p95_ms": results["gateway_ttfa_ms"]["all"]["p95"],
        "unit_latency_p95_ms": results["unit_latency_ms"]["all"]["p95"],
        "underruns": x["count"],
        "underrun_ms": x["total_ms"],
        "underruns_after_text_wait": waited["count"],
        "underrun_events": sorted(sorted(x["events"], key=lambda e: -e["ms"])[:EVENTS_KEPT], key=lambda e: e["at_s"]),
        "errors": refused,
        "passed": not why,
        "why_not": why,
    }


def find_capacity(
    params: LoadParams,
    execute: Execute,
    *,
    limit: int,
    growth: float = 1.5,
    ttfa_bound_ms: float = 1000.0,
    underrun_ms_max: float = 0.0,
    text_waits: bool = True,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Rounds from `params.concurrency` up (at most `limit` sessions); see the module doc."""
    if growth <= 1.0:
        raise ValueError("growth must be > 1")
    rounds: list[dict[str, Any]] = []

    def attempt(n: int) -> bool:
        results = execute(replace(params, concurrency=n))["results"]
        verdict = judge(n, results, ttfa_bound_ms, underrun_ms_max, text_waits)
        rounds.append(verdict)
        outcome = "pass" if verdict["passed"] else "FAIL: " + "; ".join(verdict["why_not"])
        progress(f"[capacity] {n} sessions: {outcome}")
        return verdict["passed"]

    passed, failed = 0, None
    n = max(1, params.concurrency)
    while n <= limit:
        if not attempt(n):
            failed = n
            break
        passed = n
        if n == limit:
            break
        n = min(limit, max(n + 1, math.ceil(n * growth)))
    while failed is not None and passed and failed - passed > max(1, math.floor(passed * RESOLUTION)):
        mid = (passed + failed) // 2
        if attempt(mid):
            passed = mid
        else:
            failed = mid
    return {
        "criteria": {
            "underrun_ms_at_most": underrun_ms_max,
            "underruns_counted": "all" if text_waits else "text in hand (not those after a text wait)",
            "first_audio_p95_ms_at_most": ttfa_bound_ms,
            "units_lost": 0,
            "sessions_refused_or_failed": 0,
        },
        "capacity": passed or None,  # None: even the first round failed
        "saturates_at": failed,  # None: every round up to `limit` passed
        "limit": limit,
        "rounds": sorted(rounds, key=lambda r: r["sessions"]),
    }


def overload(
    params: LoadParams,
    execute: Execute,
    *,
    probe_sessions: int,
    probe_duration_s: float,
    ttfa_bound_ms: float,
    underrun_ms_max: float = 0.0,
    text_waits: bool = True,
) -> dict[str, Any]:
    """The load as given, then at once `probe_sessions` fresh sessions at the same pace: the
    probe's first audio says whether the crowd's leftover work was dropped with it."""
    crowd = execute(params)
    probe = execute(replace(params, concurrency=probe_sessions, duration_s=probe_duration_s,
                            disconnect=0.0, cancel=0.0, backpressure=0.0))  # fmt: skip
    return {
        "crowd": judge(params.concurrency, crowd["results"], ttfa_bound_ms, underrun_ms_max, text_waits),
        "probe_after": judge(probe_sessions, probe["results"], ttfa_bound_ms, underrun_ms_max, text_waits),
        "crowd_results": crowd["results"],
        "probe_results": probe["results"],
    }


def capacity_table(found: dict[str, Any]) -> str:
    lines = [
        "| sessions | first audio p95 ms | gateway-added p95 ms | unit latency p95 ms "
        "| underruns (ms; after a text wait) | errors | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in found["rounds"]:
        verdict = "pass" if r["passed"] else "; ".join(r["why_not"])
        lines.append(f"| {r['sessions']} | {r['first_audio_p95_ms']} | {r['gateway_added_p95_ms']} "
                     f"| {r['unit_latency_p95_ms']} | {r['underruns']} ({r['underrun_ms']}; "
                     f"{r['underruns_after_text_wait']}) | {r['errors'] or ''} | {verdict} |")  # fmt: skip
    saturates = found["saturates_at"] or f"not within {found['limit']}"
    counted = found["criteria"]["underruns_counted"]
    lines += ["", f"capacity: {found['capacity']} sessions; saturates at {saturates} (underruns counted: {counted})"]
    return "\n".join(lines)
