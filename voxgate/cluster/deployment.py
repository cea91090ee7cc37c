"""The Ray Serve deployment: one voxgate server (engine, batching, sessions) per replica,
behind Ray's HTTP/WebSocket proxy, routed by session key (`router.SessionRouter`).

A replica is the whole single-process server (`serving.app.create_app`) as Ray Serve's FastAPI
ingress: the engine loads in the app's lifespan, voxgate's own batching stays inside the
replica, and one replica takes one GPU where the engine runs on CUDA (qwen3), none otherwise.

Autoscaling (`max_replicas` > replicas) uses Ray Serve's own signal, ongoing requests per
replica: every open WebSocket session and every HTTP stream is one ongoing request for its
whole life, so the signal is the replica's active streams (not CPU). The target is
`target_streams` per replica.

Removal (scale-down, redeploy, `serve shutdown`): Ray stops routing new requests to the
replica at once; voxgate's drain (`serving.lifecycle.drain`) then lets running utterances
finish for up to `VOXGATE_DRAIN_S` and ends each session with `server_draining`.
Ray 2.60 tells a replica's own code nothing until every request has ended, so the replica
watches Ray's own shutdown flag (`ShutdownWatch`); `graceful_shutdown_timeout_s` leaves the
drain its time plus a margin.

Where a replica runs its app: on the replica's own event loop (`REPLICA_ENV`), not on the
second loop and thread Ray 2.60 gives user code by default. The app never blocks its loop
(engines run on worker threads; start-up on an executor), and on the second thread every ASGI
message crosses threads one by one (`call_soon_threadsafe`), so Ray's streaming call carried
about one message a piece; on the replica's loop Ray batches what the app sent in one turn
(`serving/stream.py`). On a 2-core CPU (tone, `bench/cpu_ray_hop.sh`, BENCHMARKS.md issue 21)
a burst's Ray messages carried 8.1 pieces each against 4.2, and its server-side first audio
p50 fell from 137 to 85 ms. It is what Ray's documented `RAY_SERVE_THROUGHPUT_OPTIMIZED` sets
for this knob.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig

from voxgate.cluster.board import cluster_router, report_forever
from voxgate.cluster.router import ROUTER_PATH
from voxgate.config import Settings
from voxgate.runtime import set_switch_interval
from voxgate.serving.app import create_app
from voxgate.serving.lifecycle import drain

log = logging.getLogger(__name__)
DRAIN_MARGIN_S = 5.0  # Ray's force-kill comes this long after the drain time: for the closes to go out
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}  # the app on the replica's own loop


@serve.deployment
@serve.ingress()
class VoxgateReplica:
    """One voxgate server in a Ray Serve replica."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = Settings(**settings)
        set_switch_interval(self.settings.gil_switch_ms)  # a replica is a server process too (runtime.py)
        self.server: FastAPI | None = None
        self.replica = serve.get_replica_context().replica_tag
        self._tasks: list[asyncio.Task[None]] = []

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The single-process app, with this replica's name on /cluster/replica and its
        readiness and metrics reported to the cluster's board (`/cluster/*`)."""
        self.server = create_app(self.settings)
        self.server.state.replica = self.replica
        install_cluster_routes(self.server)
        loop = asyncio.get_event_loop()
        self._tasks = [
            loop.create_task(report_forever(self.server, self.replica)),
            loop.create_task(ShutdownWatch().drain_when_stopping(self.server, self.settings.drain_s)),
        ]
        return self.server

    async def check_health(self) -> None:
        """Ray restarts a replica whose engine failed to start (else it would stay 503)."""
        state = self.server.state.voxgate if self.server is not None else None
        if state is not None and state.startup_error:
            raise RuntimeError(f"voxgate replica failed to start: {state.startup_error}")

    async def __del__(self) -> None:
        if self.server is not None:
            await drain(self.server.state, 0)  # sessions still open (a drain cut short): told, not dropped
        for task in self._tasks:
            task.cancel()


class ShutdownWatch:
    """Ray Serve's replica sets `_shutting_down` when the controller stops it, but runs user
    code (`__del__`) only after every ongoing request ended, and a WebSocket session never
    ends by itself. This finds the replica object once and, when the flag turns, runs the
    drain, which ends the sessions. Without the flag (another Ray), Ray's own wait applies
    and `__del__` still tells every session `server_draining`."""

    def __init__(self) -> None:
        self.replica = next((o for o in gc.get_objects() if _is_ray_replica(o)), None)
        if self.replica is None:
            log.warning("Ray's replica object not found: a removed replica drains only when its sessions end")

    async def drain_when_stopping(self, app: FastAPI, drain_s: float) -> None:
        while self.replica is not None and not getattr(self.replica, "_shutting_down", False):
            await asyncio.sleep(0.2)
        if self.replica is not None:
            log.warning("replica stopping: draining for up to %.1f s", drain_s)
            await drain(app.state, drain_s)


def _is_ray_replica(obj: object) -> bool:
    kind = type(obj)
    return kind.__name__ == "Replica" and kind.__module__ == "ray.serve._private.replica"


def install_cluster_routes(app: FastAPI) -> None:
    """`/cluster/replica` (which replica answered: what a session key routes to) and the
    board's views over every replica: `/cluster/readyz`, `/cluster/metrics`."""
    app.include_router(cluster_router)


def haproxy_ingress() -> bool:
    """Ray's HAProxy ingress (`voxgate serve --replicas N --ingress haproxy`, or
    `RAY_SERVE_ENABLE_HA_PROXY=1`; Ray >= 2.55): HAProxy forwards each connection straight to a
    replica's own HTTP server, and no Ray proxy or actor call carries the request, its body or its
    messages. On 2 H200s (qwen3 0.6B, bench/gpu_ray.sh) one stream's first audio p50 was within
    0.6 ms of one process's (8.3 ms more through Ray's proxy, the run before), a burst of 64 kept
    one process's throughput and two replicas gave 2.0-2.3x one's. HAProxy then picks the replica:
    `voxgate serve --replicas` has it hash `?session=` on a consistent hash (`local.py`, round
    robin without one); the `x-voxgate-session` header is not a key there."""
    return os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"


def deployment_options(settings: Settings, replicas: int, max_replicas: int | None = None,
                       target_streams: int = 8) -> dict[str, Any]:  # fmt: skip
    """Ray Serve options for `replicas` voxgate replicas (autoscaled up to `max_replicas`)."""
    gpu = settings.engine == "qwen3" and settings.qwen3_device.startswith("cuda")
    options: dict[str, Any] = {
        "ray_actor_options": {
            "num_gpus": 1 if gpu else 0,
            "num_cpus": 1 if gpu else 0.5,
            "runtime_env": {"env_vars": dict(REPLICA_ENV)},
        },
        "max_ongoing_requests": settings.max_streams + settings.ws_max_sessions,
        "graceful_shutdown_timeout_s": settings.drain_s + DRAIN_MARGIN_S,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": 2.0,
    }
    if not haproxy_ingress():  # Ray refuses a custom router under HAProxy, which balances by itself
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=ROUTER_PATH,
            request_router_kwargs={"num_virtual_nodes": 100, "num_fallback_replicas": 0},
        )
    if max_replicas is not None and max_replicas > replicas:
        options["autoscaling_config"] = {
            "min_replicas": replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_streams,
        }
    else:
        options["num_replicas"] = replicas
    return options


def build(settings: Settings, replicas: int, max_replicas: int | None = None) -> Any:
    """The Ray Serve application: `serve.run(build(...))`."""
    options = deployment_options(settings, replicas, max_replicas)
    return VoxgateReplica.options(**options).bind(settings.model_dump(mode="json"))


def app_builder(args: dict[str, Any]) -> Any:
    """For a Ray Serve config file (`import_path: voxgate.cluster.deployment:app_builder`):
    `args` are VOXGATE_ settings without the prefix (lower case), plus `replicas` and
    `max_replicas`; the rest comes from the environment, as for `voxgate serve`."""
    args = dict(args or {})
    replicas = int(args.pop("replicas", 2))
    max_replicas = args.pop("max_replicas", None)
    settings = Settings(**args)
    return build(settings, replicas, None if max_replicas is None else int(max_replicas))
