"""Who a request is: the one client identity every limit and every owned thing is keyed on.

A request is authenticated once, in `RequestGate` (voxgate/serving/app.py), for HTTP and
WebSocket alike, and the result (`Client`) is stamped into the ASGI scope. The identity is
the API key (its index, never the key itself) when the server has keys, else the peer
address. Admin keys (`VOXGATE_ADMIN_KEYS`) are separate: they open `/debug/*` (off without
them) and work as API keys too.

Browsers cannot put a header on a WebSocket upgrade, and a key in a URL ends up in logs and
histories, so `POST /v1/auth/token` trades the key for a short-lived single-use token
(`?token=` on one upgrade). `?api_key=` is still taken for old clients; both are redacted
from every log line (`redact_secrets`).

Origins: a browser page on another site (or a DNS-rebound name) must not drive a server that
trusts its network, so a request that carries an `Origin` is refused unless the origin is the
server's own or listed in `VOXGATE_ALLOWED_ORIGINS`; a server bound to loopback also refuses
a `Host` that is not a loopback name.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from voxgate.types import Forbidden, RateLimited, Unauthorized

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAX_TOKENS = 10_000  # outstanding browser tokens, all clients together (oldest dropped first)
MAX_TOKENS_PER_CLIENT = 32


@dataclass(frozen=True, slots=True)
class Client:
    """One client identity: `key0`, `admin1`, or `addr:<ip>` on a server without keys."""

    id: str
    admin: bool = False


class Authenticator:
    """Checks bearer keys and single-use tokens; issues the tokens. Used on the event loop
    thread only (no lock)."""

    def __init__(
        self,
        api_keys: list[str],
        admin_keys: list[str],
        token_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = [(f"key{i}", k.encode()) for i, k in enumerate(api_keys)]
        self._keys += [(f"admin{i}", k.encode()) for i, k in enumerate(admin_keys)]
        self.required = bool(api_keys)  # admin keys alone protect only the admin endpoints
        self.token_ttl_s = token_ttl_s
        self._clock = clock
        self._tokens: OrderedDict[str, tuple[Client, float]] = OrderedDict()

    def identify(self, authorization: bytes, query: dict[str, str], peer: str) -> Client:
        """The request's client. Where keys are required, a missing or wrong key or token
        raises `Unauthorized`; elsewhere an unknown one is ignored (OpenAI SDKs always send
        one) and the client is its address."""
        given = _bearer(authorization) or query.get("api_key", "").encode()
        client = self._by_key(given) if given else None
        if client is None and "token" in query:
            client = self._redeem(query["token"])
        if client is not None:
            return client
        if self.required:
            if given or "token" in query:
                raise Unauthorized("the API key or token is not valid")
            raise Unauthorized("missing bearer token: send 'Authorization: Bearer <key>'")
        return Client(f"addr:{peer}")

    def _by_key(self, given: bytes) -> Client | None:
        found = None
        for name, key in self._keys:  # compare with every key: the time taken does not say which matched
            if hmac.compare_digest(key, given) and found is None:
                found = name
        return None if found is None else Client(found, admin=found.startswith("admin"))

    # ------------------------------------------------------------------ browser tokens

    def issue(self, client: Client) -> str:
        """A single-use token for one WebSocket upgrade, valid `token_ttl_s`."""
        self._expire()
        mine = [t for t, (owner, _) in self._tokens.items() if owner == client]
        if len(mine) >= MAX_TOKENS_PER_CLIENT:
            raise RateLimited(f"at most {MAX_TOKENS_PER_CLIENT} unused tokens per client; use or let them expire")
        while len(self._tokens) >= MAX_TOKENS:
            self._tokens.popitem(last=False)
        token = secrets.token_urlsafe(32)
        self._tokens[token] = (client, self._clock() + self.token_ttl_s)
        return token

    def _redeem(self, token: str) -> Client | None:
        entry = self._tokens.pop(token, None)
        return entry[0] if entry is not None and entry[1] >= self._clock() else None

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, (_, until) in self._tokens.items() if until < now]:
            del self._tokens[token]


def _bearer(header: bytes) -> bytes:
    scheme, _, token = header.partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


# ---------------------------------------------------------------------- origins and hosts


class OriginPolicy:
    """Which browser origins and `Host` names may reach the server (see the module doc)."""

    def __init__(self, allowed_origins: list[str], bound_host: str) -> None:
        self.any_origin = "*" in allowed_origins
        self.origins = {o.rstrip("/").lower() for o in allowed_origins if o != "*"}
        self.loopback_only = _is_loopback(bound_host)

    def check(self, origin: bytes | None, host: bytes | None, server: tuple[str, int] | None) -> None:
        """Raise `Forbidden` for a foreign origin or (on a loopback server) a foreign Host."""
        host_text = (host or b"").decode("latin-1").strip().lower()
        if self.loopback_only and server is not None and _is_loopback(server[0]):
            name = _host_name(host_text)
            if host_text and name not in LOOPBACK_NAMES:
                raise Forbidden(f"this server is bound to loopback and does not answer for host {name!r}")
        if origin is None or self.any_origin:
            return
        text = origin.decode("latin-1").strip().rstrip("/").lower()
        if text in self.origins:
            return
        if text != "null" and urlsplit(text).netloc == host_text:
            return  # the server's own page
        raise Forbidden("requests from this browser origin are not allowed (VOXGATE_ALLOWED_ORIGINS)")


def _host_name(host: str) -> str:
    """`Host` header -> name without the port (`[::1]:8000` -> `::1`)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------- logs

_SECRET_PARAM = re.compile(r"(?i)\b(api_key|token|key|access_token)=[^&\s\"']*")


def redact(text: str) -> str:
    """Secrets in URL query strings replaced by `***`."""
    return _SECRET_PARAM.sub(lambda m: f"{m.group(1)}=***", text)


class _Redactor(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def redact_secrets() -> None:
    """Put the redacting filter on every handler that prints request lines (uvicorn's and the
    root's: records of every logger pass one of them) and on uvicorn's own loggers. Idempotent."""
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    for target in [*loggers, *(h for lg in loggers for h in lg.handlers)]:
        if not any(isinstance(f, _Redactor) for f in target.filters):
            target.addFilter(_Redactor())
