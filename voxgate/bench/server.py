"""Start a real `voxgate serve` in a child process on a free loopback port.

Used by `voxgate bench ...` and by the integration tests, so both measure the same thing
a user runs.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from types import TracebackType

import httpx

_URL_RE = re.compile(r"serving on (http://\S+)")


def settings_env(pairs: list[str], command: str) -> dict[str, str]:
    """`--set KEY=VALUE` options as a started server's environment (`KEY` with or without VOXGATE_)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{command}: --set wants KEY=VALUE, got {pair!r}")
        out[key.upper().removeprefix("VOXGATE_")] = value
    return out


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a VOXGATE_ setting for the started server, e.g. LLM_THREADS=1 (repeatable)",
    )


class ServerError(RuntimeError):
    pass


class ServerProcess:
    """`with ServerProcess(engine="tone") as server: server.url ...`

    `env` entries are VOXGATE_* settings without the prefix, e.g. {"TONE_DELAY_MS": "20"}.
    """

    def __init__(
        self,
        engine: str = "tone",
        env: dict[str, str] | None = None,
        ready_timeout: float = 120.0,
        wait_ready: bool = True,
    ) -> None:
        self.engine = engine
        self.wait_ready = wait_ready
        # The embedded LLM only where asked for (each server would load it otherwise).
        # An admin key of its own, so benches and tests can read /debug/timings (off without one).
        self.env = {"VOXGATE_LLM_EMBEDDED": "false", "VOXGATE_ADMIN_KEYS": f"admin-{secrets.token_hex(8)}",
                    **{f"VOXGATE_{k}": str(v) for k, v in (env or {}).items()}}  # fmt: skip
        self.ready_timeout = ready_timeout
        self.url = ""
        self.log: deque[str] = deque(maxlen=400)
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ServerProcess:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}  # only what we set
        env = {**inherited, **self.env, "VOXGATE_ENGINE": self.engine, "VOXGATE_PORT": "0", "VOXGATE_HOST": "127.0.0.1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "voxgate", "serve"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        found = threading.Event()
        threading.Thread(target=self._pump, args=(found,), daemon=True).start()
        try:
            if self.wait_ready:
                self._wait_ready(found)
            else:
                self._wait_url(found)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _pump(self, found: threading.Event) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.log.append(line.rstrip())
            match = _URL_RE.search(line)
            if match and not found.is_set():
                self.url = match.group(1)
                found.set()

    def _wait_url(self, found: threading.Event) -> None:
        deadline = time.monotonic() + self.ready_timeout
        assert self._proc is not None
        while not found.wait(0.01):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise ServerError("server did not start:\n" + "\n".join(self.log))

    def _wait_ready(self, found: threading.Event) -> None:
        self._wait_url(found)
        deadline = time.monotonic() + self.ready_timeout
        assert self._proc is not None
        headers = self.auth_headers()
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError("server exited:\n" + "\n".join(self.log))
            try:
                reply = httpx.get(f"{self.url}/healthz", headers=headers, timeout=5)
                if reply.status_code == 200:
                    return
                if reply.json().get("status") == "failed":
                    raise ServerError(f"server failed to start: {reply.text}")
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise ServerError("server not ready in time:\n" + "\n".join(self.log))

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def rss_bytes(self) -> int:
        """The server process's resident memory now (Linux /proc)."""
        with open(f"/proc/{self.pid}/status") as status:
            kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return kb * 1024

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def auth_headers(self) -> dict[str, str]:
        keys = self.env.get("VOXGATE_API_KEYS", "")
        return {"authorization": f"Bearer {keys.split(',')[0]}"} if keys else {}

    def admin_headers(self) -> dict[str, str]:
        """For the admin endpoints (/debug/*)."""
        return {"authorization": f"Bearer {self.env['VOXGATE_ADMIN_KEYS'].split(',')[0]}"}

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
