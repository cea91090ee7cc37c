"""Which replica a request goes to: a consistent hash of its session key, so a WebSocket
session and every resume of it reach the replica that holds it.

Ray Serve's `ConsistentHashRouter` (experimental in Ray 2.60) hashes the session id its proxy
read from a header (`RAY_SERVE_SESSION_ID_HEADER_KEY`, which `voxgate serve --replicas` sets to
`x-voxgate-session`). Browsers cannot put a header on a WebSocket, so `SessionRouter` also
takes voxgate's `?session=` query parameter from the request the proxy forwards. A request
with neither (an HTTP stream, a session-less call) has no replica to return to, so it goes to
the least loaded one (Ray probes each candidate's ongoing requests), not to a hash of its
request id: hashing spreads requests evenly only on average, and on a 2-GPU H200 a burst of
128 HTTP streams over two 64-row replicas sent more than 64 to one, which said `busy`.

When the ring changes (a replica added or gone) only the keys of the changed replica move;
a session on a removed replica is gone with it (its resume: `resume_not_available`).
"""

from __future__ import annotations

import pickle
from typing import Any
from urllib.parse import parse_qsl

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter

ROUTER_PATH = "voxgate.cluster.router.SessionRouter"
SESSION_HEADER = "x-voxgate-session"  # the same header the gateway reads (serving/ws.py)


class SessionRouter(ConsistentHashRouter):
    """Ray's consistent-hash ring, keyed on the header or voxgate's `?session=`."""

    def _routing_key(self, pending_request: Any) -> str | None:
        if pending_request is None:
            return None
        return session_key(pending_request) or str(pending_request.metadata.internal_request_id)

    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[list[Any]]:
        """A session's replica by the hash ring; a request without a session: every candidate at
        once, of which Ray takes the least loaded."""
        if pending_request is not None and candidate_replicas and session_key(pending_request) is None:
            return [candidate_replicas]
        return await super().choose_replicas(candidate_replicas, pending_request)


def session_key(pending_request: Any) -> str | None:
    """The request's session: the header Ray's proxy read, else `?session=`."""
    if pending_request.metadata.session_id:
        return str(pending_request.metadata.session_id)
    return query_session(pending_request.args)


def query_session(args: Any) -> str | None:
    """`?session=` of the HTTP or WebSocket request Ray's proxy forwards (its first argument:
    the pickled ASGI scope, from Ray's own proxy), or None."""
    if not args or not isinstance(args[0], bytes) or b"session=" not in args[0]:
        return None
    try:
        scope = pickle.loads(args[0]).asgi_scope
    except Exception:  # not a proxied HTTP request (a handle call): no key
        return None
    raw = scope.get("query_string", b"")
    if b"session=" not in raw:
        return None
    values = [v for k, v in parse_qsl(raw[:4096].decode("latin-1")) if k == "session"]
    return values[0] if values else None
