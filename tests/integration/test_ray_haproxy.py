"""voxgate on a local Ray Serve behind Ray's HAProxy ingress (`voxgate serve --replicas 2 --ingress
haproxy`): HAProxy forwards each connection straight to a replica's own HTTP server, routed by
`?session=` on a consistent hash. A key reaches one replica every time and keys spread over both,
a session resumes on its replica through HAProxy, readiness adds up, and SIGTERM drains.
Waits are on events and states, with generous timeouts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.raycluster import (
    RayServer,
    keys_by_replica,
    resume_on_its_replica,
    sigterm_drains_every_session,
    started,
)

pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("haproxy")


@pytest.fixture(scope="module")
def cluster(config_dir: Path) -> Iterator[RayServer]:
    # Ray writes HAProxy's config (and its sockets) beside this path; the test reads the config back.
    ray_env = {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(config_dir / "haproxy.cfg")}
    server = started(RayServer({"TONE_DELAY_MS": "5", "DRAIN_S": "3"}, ("--ingress", "haproxy"), ray_env))
    try:
        yield server
    finally:
        server.stop()


def test_haproxy_routes_by_the_session_key_on_a_consistent_hash(cluster, config_dir):
    configs = list(config_dir.rglob("haproxy.cfg"))
    assert configs, "Ray wrote no HAProxy config where it was told to"
    text = configs[0].read_text()
    # Ray puts the balance setting in its defaults section; voxgate's adds the hash type's line.
    assert "balance url_param session\n    hash-type consistent\n" in text
    keys = keys_by_replica(cluster)
    assert len(keys) == 2  # 30 keys on one replica of two: p = 2**-29
    for replica, some in keys.items():
        for key in some[:5]:
            assert cluster.replica_of(key)["replica"] == replica  # asked again: the same replica


def test_a_session_resumes_through_haproxy_on_its_replica(cluster):
    resume_on_its_replica(cluster, "resume-through-haproxy")


def test_readiness_adds_up_and_sigterm_drains_every_session(cluster):
    ready = cluster.readyz()
    assert ready["ready"] and ready["live_replicas"] == 2
    assert ready["free_slots"] == sum(r["free_slots"] for r in ready["replicas"].values())
    sigterm_drains_every_session(cluster)
