"""What every replica reports, and the cluster-wide views over it: `/cluster/readyz` (each
replica's readiness, and ready while any is) and `/cluster/metrics` (every replica's
Prometheus samples summed, with the same names as a single server's `/metrics`).

A request reaches one replica, so each replica pushes its readiness and metrics once a second
to a small named Ray actor (`Board`); whichever replica serves `/cluster/*` reads it. A
replica that stopped reporting (killed, removed) drops out after `STALE_S`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from typing import Any

import ray
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.parser import text_string_to_metric_families

from voxgate.serving.lifecycle import readiness

log = logging.getLogger(__name__)
BOARD_NAME = "voxgate-board"
BOARD_NAMESPACE = "voxgate"
REPORT_S = 1.0
STALE_S = 3.0  # three missed reports: the replica is gone
cluster_router = APIRouter()


@ray.remote(num_cpus=0)
class Board:
    """The latest report of each replica: (when, readiness, Prometheus text)."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, dict[str, Any], str]] = {}

    def report(self, replica: str, ready: dict[str, Any], metrics: str) -> None:
        self.reports[replica] = (time.monotonic(), ready, metrics)

    def live(self) -> dict[str, tuple[dict[str, Any], str]]:
        now = time.monotonic()
        return {name: (ready, text) for name, (at, ready, text) in self.reports.items() if now - at <= STALE_S}


def board() -> Any:
    """The cluster's board actor (made by the first replica that asks)."""
    return Board.options(name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True,
                         lifetime="detached").remote()  # fmt: skip


def _readiness(app: Any) -> dict[str, Any]:
    return readiness(app.state.voxgate, len(app.state.ws_gateway.sessions))


async def report_forever(app: Any, replica: str) -> None:
    """This replica's readiness and metrics to the board, once a second (failures logged once)."""
    actor, warned = board(), False
    while True:
        try:
            await actor.report.remote(replica, _readiness(app), app.state.voxgate.metrics.render().decode())
        except Exception:
            if not warned:
                log.exception("cannot report to the cluster board")
                warned = True
        await asyncio.sleep(REPORT_S)


@cluster_router.get("/cluster/replica")
async def which_replica(request: Request) -> JSONResponse:
    """Which replica answered (a request with a session key reaches the key's replica)."""
    return JSONResponse({"replica": request.app.state.replica, "pid": os.getpid()})


@cluster_router.get("/cluster/readyz")
async def cluster_readyz() -> JSONResponse:
    """Each live replica's `/readyz` body; 200 while any replica is ready."""
    reports = await board().live.remote()
    replicas = {name: ready for name, (ready, _) in reports.items()}
    ready = any(r["ready"] for r in replicas.values())
    free = sum(r["free_slots"] for r in replicas.values())
    body = {"ready": ready, "replicas": replicas, "free_slots": free, "live_replicas": len(replicas)}
    return JSONResponse(body, status_code=200 if ready else 503)


@cluster_router.get("/cluster/metrics")
async def cluster_metrics() -> Response:
    """Every live replica's samples summed by name and labels (counters, histograms and
    gauges all add up across replicas), plus `voxgate_cluster_replicas`."""
    reports = await board().live.remote()
    text = sum_metrics([metrics for _, metrics in reports.values()])
    text += f"# TYPE voxgate_cluster_replicas gauge\nvoxgate_cluster_replicas {len(reports)}\n"
    return Response(text, media_type="text/plain; version=0.0.4")


def sum_metrics(texts: list[str]) -> str:
    """Prometheus texts -> one text with each (sample name, labels) summed."""
    kinds: dict[str, str] = {}
    totals: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(lambda: defaultdict(float))
    order: dict[str, list[str]] = defaultdict(list)
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):  # start times: no sum of them means anything
                continue
            kinds.setdefault(family.name, family.type)
            for sample in family.samples:
                if sample.name.endswith("_created"):  # a start time: no sum of it means anything
                    continue
                if sample.name not in order[family.name]:
                    order[family.name].append(sample.name)
                totals[sample.name][tuple(sorted(sample.labels.items()))] += sample.value
    lines = []
    for family, kind in kinds.items():
        lines.append(f"# TYPE {family}{'_total' if kind == 'counter' else ''} {kind}")
        for name in order[family]:
            for labels, value in totals[name].items():
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{label_text}}} {value!r}" if labels else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
