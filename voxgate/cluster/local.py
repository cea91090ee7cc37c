"""`voxgate serve --replicas N`: a local Ray (this machine's cores and GPUs) running the
voxgate deployment behind Ray Serve's proxy (or its HAProxy ingress) on VOXGATE_HOST:VOXGATE_PORT, until SIGTERM or
Ctrl-C, then a graceful stop: the app is deleted first, so each replica drains
(`deployment.py`) while Ray's proxy still carries its sockets (`serve.shutdown()` alone kills
the proxy first, and every socket with it), then Serve and Ray stop."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from voxgate import __version__
from voxgate.config import Settings

log = logging.getLogger(__name__)


def ingress_environment(ingress: str | None) -> None:
    """What Ray reads from the environment (every Ray process started here inherits it) for the
    ingress chosen: `ingress` overrides `RAY_SERVE_ENABLE_HA_PROXY` (None leaves it to the
    environment); every other value already set is kept."""
    if ingress is not None:
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if ingress == "haproxy" else "0"
    # Ray's proxy hashes the session header it is told of.
    os.environ.setdefault("RAY_SERVE_SESSION_ID_HEADER_KEY", "x-voxgate-session")
    # Ray's proxy routes on its own event loop, not a second one (a thread hop each way per request
    # and per streamed message; part of Ray's documented RAY_SERVE_THROUGHPUT_OPTIMIZED).
    os.environ.setdefault("RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP", "0")
    # Under Ray's HAProxy ingress HAProxy routes: by `?session=`, on a consistent hash (Ray 2.60 puts
    # the value after `balance` in its config's defaults section, a line of its own: the hash type is
    # the next line there). HAProxy 2.8 places a server by its place in the list, so a replica added
    # or removed moves fewer of the others' keys than a plain hash on average, not always (README).
    os.environ.setdefault("RAY_SERVE_HAPROXY_BALANCE_ALGORITHM", HAPROXY_BALANCE)


HAPROXY_BALANCE = "url_param session\n    hash-type consistent"


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def run_local(
    settings: Settings,
    replicas: int,
    max_replicas: int | None = None,
    num_cpus: int | None = None,
    ingress: str | None = None,
) -> int:
    """Start Ray and the app; block until a signal; shut down gracefully. Returns the exit code.
    `ingress`: "proxy" (Ray's), "haproxy" (Ray's HAProxy ingress) or None (the environment's
    `RAY_SERVE_ENABLE_HA_PROXY`, else Ray's proxy)."""
    ingress_environment(ingress)
    import ray
    from ray import serve

    from voxgate.cluster.deployment import build, haproxy_ingress

    port = settings.port or free_port(settings.host)
    ray.init(num_cpus=num_cpus, include_dashboard=False, configure_logging=False, log_to_driver=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": port})
        serve.run(build(settings, replicas, max_replicas), name="voxgate", route_prefix="/", blocking=False)
        print(f"voxgate {__version__} serving on http://{settings.host}:{port}  (engine={settings.engine}, "
              f"ray serve, {replicas} replicas, {'haproxy' if haproxy_ingress() else 'ray proxy'} ingress; "
              "GET /cluster/readyz says when ready; Ctrl-C stops)",
              flush=True)  # fmt: skip
        stop.wait()
        log.info("stopping: each replica drains for up to %.1f s", settings.drain_s)
        serve.delete("voxgate")  # the replicas drain while the proxy still carries their sockets
        serve.shutdown()
    finally:
        ray.shutdown()
    return 0
