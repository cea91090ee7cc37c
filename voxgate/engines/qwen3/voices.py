"""Cloned voices of a Base model: their prompt tensors, computed once and cached.

Registering a voice runs the speaker encoder (x-vector) and, for in-context cloning, the
codec encoder (reference codes) once; the result is kept under the voice id together with
a hash of its content, so re-registering the same audio costs nothing and every request
for the voice only does the text-dependent work.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from voxgate.types import InvalidRequest, NotFound, UnknownVoice

MAX_REFERENCE_S = 30.0
MIN_REFERENCE_S = 0.5


@dataclass(frozen=True)
class ClonedVoice:
    voice_id: str
    content_hash: str
    speaker_embedding: torch.Tensor  # (hidden,)
    ref_codes: torch.Tensor | None  # (frames, 16), in-context mode only
    ref_text: str | None
    duration_s: float
    decoder_context: Any = None  # the codec decoder's state after the reference codes (in-context only)

    @property
    def mode(self) -> str:
        return "icl" if self.ref_codes is not None else "xvector"


def content_hash(audio_24k: np.ndarray, ref_text: str | None, icl: bool) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(audio_24k, dtype=np.float32).tobytes())
    digest.update(f"\0{ref_text or ''}\0{int(icl)}".encode())
    return digest.hexdigest()[:16]


class VoiceStore:
    """Thread-safe map from voice id to its cached prompt tensors."""

    def __init__(
        self,
        embed: Callable[[torch.Tensor], torch.Tensor],
        encode: Callable[[torch.Tensor], torch.Tensor] | None,
        preroll: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        self._embed, self._encode, self._preroll = embed, encode, preroll
        self._voices: dict[str, ClonedVoice] = {}
        self._lock = threading.Lock()

    def add(self, voice_id: str, audio_24k: np.ndarray, ref_text: str | None, icl: bool) -> tuple[ClonedVoice, bool]:
        """Register (or refresh) a voice; returns (voice, computed) — computed is False on a cache hit."""
        duration = len(audio_24k) / 24000
        if not MIN_REFERENCE_S <= duration <= MAX_REFERENCE_S:
            raise InvalidRequest(
                f"reference audio must last {MIN_REFERENCE_S}-{MAX_REFERENCE_S} s, got {duration:.2f} s"
            )
        if icl and not (ref_text and ref_text.strip()):
            raise InvalidRequest("in-context cloning needs `text`, the transcript of the reference audio")
        if icl and self._encode is None:
            raise InvalidRequest("this checkpoint has no codec encoder; register without `text` (x-vector only)")
        key = content_hash(audio_24k, ref_text if icl else None, icl)
        with self._lock:
            known = self._voices.get(voice_id)
        if known is not None and known.content_hash == key:
            return known, False
        wav = torch.from_numpy(np.ascontiguousarray(audio_24k, dtype=np.float32))
        codes = self._encode(wav) if icl and self._encode is not None else None
        # In-context audio continues the reference: the decoder starts from the state the
        # reference codes leave behind (the reference decodes ref + new codes and cuts the ref).
        context = self._preroll(codes) if codes is not None and self._preroll is not None else None
        voice = ClonedVoice(voice_id, key, self._embed(wav), codes, ref_text if icl else None, duration, context)
        with self._lock:
            self._voices[voice_id] = voice
        return voice, True

    def get(self, voice_id: str) -> ClonedVoice:
        with self._lock:
            voice = self._voices.get(voice_id)
        if voice is None:
            raise UnknownVoice(f"no cloned voice {voice_id!r}; register one with POST /v1/voices")
        return voice

    def remove(self, voice_id: str) -> None:
        with self._lock:
            if self._voices.pop(voice_id, None) is None:
                raise NotFound(f"no cloned voice {voice_id!r}")

    def all(self) -> list[ClonedVoice]:
        with self._lock:
            return list(self._voices.values())
