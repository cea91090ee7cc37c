"""The Ray Serve options voxgate's replicas run with: the app on the replica's own event loop
(what lets Ray batch a stream's messages, tests/integration/test_ray_batches.py), and the session
router left out under Ray's HAProxy ingress (Ray refuses a deployment with both)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")

from voxgate.cluster.deployment import deployment_options
from voxgate.cluster.router import ROUTER_PATH
from voxgate.config import Settings


def test_replicas_run_the_app_on_their_own_loop_and_route_by_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    options = deployment_options(Settings(engine="tone"), replicas=2)
    assert options["ray_actor_options"]["runtime_env"]["env_vars"]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert options["request_router_config"].request_router_class == ROUTER_PATH


def test_under_haproxy_there_is_no_custom_router(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    options = deployment_options(Settings(engine="tone"), replicas=2)
    assert "request_router_config" not in options
    assert options["ray_actor_options"]["runtime_env"]["env_vars"]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
