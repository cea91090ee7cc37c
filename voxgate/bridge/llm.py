"""A client for OpenAI-compatible streaming chat completions (vLLM, SGLang, llama.cpp's
server, OpenAI, and voxgate's own embedded `/v1/chat/completions`).

`LLMClient.stream(messages)` yields the reply's text deltas as they arrive. A server that
is down, answers with an error, or says nothing for `first_token_timeout_s` is retried
(`retries` times, with a short backoff) only until the first token: after that a retry
would repeat words already spoken, so a failure mid-reply raises. Every failure is a typed
`LLMError` with a clear message that says what failed and never where (no URL, port or key:
the message may reach voxgate's clients); the details go to the server log. The LLM's refusal
of the request (400/422: a prompt over its context, say) is voxgate's `invalid_request` with
the LLM's message (`refusal`), as `/v1/chat/completions` reports it. `Conversation`
keeps the multi-turn history, recording of each assistant turn only what was actually spoken
(after a barge-in, the truncated text).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from voxgate.text import speakable
from voxgate.types import InvalidRequest, VoxgateError

log = logging.getLogger(__name__)
REFUSALS = (400, 422)  # the LLM's word on what is wrong with the request
_REFUSAL_CHARS = 500  # of the LLM's message: enough to say what is wrong, not a dump of the request


class LLMError(VoxgateError):
    """The LLM server failed; `code` says how."""

    status = 502
    code = "llm_error"


class LLMUnavailable(LLMError):
    code = "llm_unavailable"


class LLMBadResponse(LLMError):
    code = "llm_bad_response"


class LLMTimeout(LLMError):
    code = "llm_timeout"


class LLMNotConfigured(VoxgateError):
    """No LLM to call: none configured, or the embedded one failed to start (503)."""

    status = 503
    code = "llm_unavailable"


@dataclass(frozen=True)
class LLMConfig:
    base_url: str  # e.g. http://127.0.0.1:8000/v1
    model: str = "default"
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 30.0
    idle_timeout_s: float = 30.0  # longest silence between two deltas once the reply started
    retries: int = 2
    temperature: float | None = None
    max_tokens: int | None = None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every LLM connection: building one (loading the CA bundle) costs
    ~60 ms of CPU, which every new httpx client (one per reply) would spend on the event loop."""
    return httpx.create_ssl_context()


class LLMClient:
    def __init__(self, config: LLMConfig, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        timeout = httpx.Timeout(config.idle_timeout_s, connect=config.connect_timeout_s)
        self._http = http or httpx.AsyncClient(timeout=timeout, verify=tls_context())
        self._owns_http = http is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def stream(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        """The reply's text deltas, cleaned to what can be spoken (`speakable`: an LLM may write
        control characters or unpaired surrogates, which break engines); retries before the
        first one only."""
        attempt = 0
        while True:
            started = False
            try:
                async for delta in self._attempt(messages):
                    started = True
                    yield speakable(delta)
                return
            except LLMError as exc:
                if started or attempt >= self.config.retries or isinstance(exc, LLMBadResponse):
                    raise
            attempt += 1
            await asyncio.sleep(0.2 * attempt)

    async def _attempt(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        url = self.config.base_url.rstrip("/") + "/chat/completions"
        body: dict[str, Any] = {"model": self.config.model, "messages": messages, "stream": True}
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        headers = {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        try:
            async with self._http.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    answer = await response.aread()
                    if response.status_code in REFUSALS:
                        raise refusal(response.status_code, answer)  # the request's fault: not retried
                    text = answer.decode(errors="replace")[:300]
                    kind = LLMUnavailable if response.status_code >= 500 else LLMBadResponse
                    raise _failed(kind, f"the LLM server answered {response.status_code}", url, text)
                lines = response.aiter_lines()
                first = True
                while True:
                    timeout = self.config.first_token_timeout_s if first else self.config.idle_timeout_s
                    try:
                        line = await asyncio.wait_for(anext(lines), timeout)
                    except StopAsyncIteration:
                        raise _failed(LLMBadResponse, "the LLM stream ended without [DONE]", url) from None
                    except TimeoutError:
                        raise _failed(LLMTimeout, f"the LLM server sent nothing for {timeout:g} s", url) from None
                    delta = _parse_line(line, url)
                    if delta is _DONE:
                        return
                    if delta:
                        first = False
                        yield delta
        except httpx.TransportError as exc:
            name = type(exc).__name__
            raise _failed(LLMUnavailable, f"cannot reach the LLM server ({name})", url, str(exc)) from None


_DONE = object()


def _failed(kind: type[LLMError], message: str, url: str, detail: str = "") -> LLMError:
    """The error for the caller says what failed; where (the URL) and the server's own words
    go to the log only (an internal address or an upstream's text must not reach clients)."""
    log.warning("LLM request to %s failed: %s%s", url, message, f": {detail}" if detail else "")
    return kind(message)


def refusal(status: int, body: bytes) -> InvalidRequest:
    """The LLM's refusal of a request as voxgate's `invalid_request`, with the LLM's status,
    message and `param`: OpenAI's `{"error": {...}}` (llama.cpp's has an integer `code`), a
    framework's `{"detail": ...}` and a plain-text body all give their message."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        data = body.decode(errors="replace").strip()
    found = data.get("error", data.get("detail", data.get("message"))) if isinstance(data, dict) else data
    param = None
    if isinstance(found, dict):
        param, found = found.get("param"), found.get("message")
    message = found if isinstance(found, str) else json.dumps(found) if found else ""
    error = InvalidRequest(message[:_REFUSAL_CHARS] or f"the LLM refused the request ({status})")
    error.status, error.param = status, param if isinstance(param, str) else None
    return error


def _parse_line(line: str, url: str) -> Any:
    """One server-sent-events line -> text delta ('' for none), or _DONE."""
    line = line.strip()
    if not line or line.startswith(":") or not line.startswith("data:"):
        return ""  # blank keep-alives, comments, other SSE fields
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    try:
        event = json.loads(data)
        if "error" in event:
            raise _failed(LLMBadResponse, "the LLM server reported an error", url, str(event["error"])[:300])
        choices = event.get("choices") or [{}]
        return choices[0].get("delta", {}).get("content") or ""
    except (ValueError, AttributeError, TypeError, IndexError):
        raise _failed(LLMBadResponse, "the LLM server sent an unreadable event", url, repr(data[:200])) from None


@dataclass
class Conversation:
    """Multi-turn history in the chat-completions message format.

    The history sent is cut, oldest turns first, to `max_turns` and `max_chars`. The cut moves
    rarely: once the history outgrows a limit it drops to half of it, so the prompt then starts
    with the same messages for many turns and the LLM server's prompt cache stays valid (cutting
    one turn at a time changed the prompt's start every turn: a long call's every reply waited
    for the whole history to be read again, ~10 s here instead of ~0.4 s).
    """

    system: str | None = None
    max_turns: int = 20
    max_chars: int = 6000
    turns: list[dict[str, str]] = field(default_factory=list)
    _start: int = field(default=0, repr=False)  # the oldest recorded message still sent

    def messages(self, user: str) -> list[dict[str, str]]:
        """The request for a new user turn (not yet recorded): the newest whole turns that fit."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        budget = self.max_chars - len(self.system or "") - len(user)
        kept = self.turns[self._start :]
        if len(kept) > 2 * self.max_turns or _chars(kept) > budget:
            half = _newest(kept, 2 * max(1, self.max_turns // 2), budget // 2)
            kept = half or _newest(kept, 2 * self.max_turns, budget)  # one turn over half still goes if it fits
            self._start = len(self.turns) - len(kept)
        return [*head, *kept, {"role": "user", "content": user}]

    def record(self, user: str, spoken: str) -> None:
        """The finished turn: what the user said and what of the reply was actually heard."""
        self.turns += [{"role": "user", "content": user}, {"role": "assistant", "content": spoken}]


def _chars(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _newest(messages: list[dict[str, str]], max_messages: int, max_chars: int) -> list[dict[str, str]]:
    """The newest whole turns (a user message and its reply go together) within both limits."""
    kept = messages
    while kept and (len(kept) > max_messages or _chars(kept) > max_chars):
        kept = kept[2:]
    return kept
