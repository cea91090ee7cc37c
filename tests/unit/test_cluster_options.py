"""The Ray Serve options voxgate's replicas run with: the app on the replica's own event loop
(what lets Ray batch a stream's messages, tests/integration/test_ray_batches.py), and the session
router left out under Ray's HAProxy ingress (Ray refuses a deployment with both)."""

from __future__ import annotations

import os

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


def test_the_ingress_flag_overrides_the_environment_and_keeps_every_other_ray_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from voxgate.cluster.local import HAPROXY_BALANCE, ingress_environment

    names = ("ENABLE_HA_PROXY", "HAPROXY_BALANCE_ALGORITHM", "SESSION_ID_HEADER_KEY", "RUN_ROUTER_IN_SEPARATE_LOOP")
    for name in names:
        monkeypatch.delenv(f"RAY_SERVE_{name}", raising=False)  # each restored after the test
    ingress_environment(None)  # nothing chosen: the environment decides (here: Ray's proxy)
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    ingress_environment("haproxy")
    env = os.environ
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_HAPROXY_BALANCE_ALGORITHM"] == HAPROXY_BALANCE
    assert env["RAY_SERVE_SESSION_ID_HEADER_KEY"] == "x-voxgate-session"
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BALANCE_ALGORITHM", "leastconn")  # the user's own choice stays
    ingress_environment("proxy")
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "0" and env["RAY_SERVE_HAPROXY_BALANCE_ALGORITHM"] == "leastconn"
