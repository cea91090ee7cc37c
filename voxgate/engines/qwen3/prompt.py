"""Text tokenizer and the talker's prefill for CustomVoice and VoiceDesign prompts.

The prefill is a sequence of embeddings (text track + codec track summed per row); after it,
each decode step adds the next "trailing" text embedding (streaming-text mode) or tts_pad.

Two forms. `PromptBuilder.build` makes the embeddings at once, with the reference's order of
operations (the parity tests hold it to the official implementation's codes exactly); cloned
voices always take it. `PromptBuilder.plan` says the same prompt as token ids only, on the
host: every row is one text token's projected embedding plus (or not) one codec token's, so
the batch decoder turns all the plans it admits together into embeddings with two lookups in
`TextTable` and the codec table (`BatchDecoder.admit_many`). Why: when many streams start at
once, each building its prompt on the GPU from its own thread (a dozen small kernels and a
wait per prompt) took 49-53 ms p50 of a first chunk on an H200 (BENCHMARKS.md, issue 17); a
plan costs the tokenizer alone, and the GPU work is the runner's, one batch at a time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from voxgate.engines.qwen3.config import Qwen3TTSConfig
from voxgate.engines.qwen3.talker import Talker
from voxgate.types import EmptyText, InvalidRequest, UnknownVoice, UnsupportedLanguage

# The Qwen2 pre-tokenisation pattern (split before byte-level BPE).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def load_text_tokenizer(model_dir: Path) -> Tokenizer:
    """Byte-level BPE from vocab.json + merges.txt, with the special tokens of tokenizer_config.json."""
    bpe = models.BPE.from_file(str(model_dir / "vocab.json"), str(model_dir / "merges.txt"))
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    from tokenizers import AddedToken

    added = [
        AddedToken(v["content"], special=v.get("special", False), normalized=v.get("normalized", False))
        for _, v in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0]))
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


@dataclass(frozen=True)
class Prompt:
    """The talker's prefill embeddings (1, P, H) and the text fed one row per decode step."""

    embeds: torch.Tensor
    trailing: torch.Tensor  # (1, N, H)
    pad: torch.Tensor  # (1, H): fed once the trailing text is used up
    text_tokens: int = 0  # tokens of the text to speak (for the length guard)

    @property
    def length(self) -> int:
        return self.embeds.shape[1]

    @property
    def trailing_rows(self) -> int:
        return self.trailing.shape[1]


NO_CODEC = -1  # a plan row with text only


@dataclass(frozen=True)
class PromptPlan:
    """A prompt as ids: prefill row i is the projected embedding of text token `text[i]` plus the
    codec embedding of `codec[i]` (none where it is `NO_CODEC`); `trailing` are the text tokens
    fed one per decode step, `pad` the text token fed after them."""

    text: np.ndarray  # (P,) int64
    codec: np.ndarray  # (P,) int64
    trailing: np.ndarray  # (N,) int64
    pad: int
    text_tokens: int = 0

    @property
    def length(self) -> int:
        return len(self.text)

    @property
    def trailing_rows(self) -> int:
        return len(self.trailing)


class TextTable:
    """Every text token's projected embedding, computed once (the talker's text embedding and
    projection applied to the whole vocabulary): a prompt's text rows become one lookup. The
    projection is per token, so a row is what `Talker.text` gives for that token (up to the
    rounding of a different matrix shape). Size: vocabulary x hidden (151,936 x 1024 in bf16,
    311 MB, for 0.6B; 622 MB for 1.7B), built in well under a second on a GPU."""

    CHUNK = 8192

    def __init__(self, talker: Talker) -> None:
        vocab = talker.model.text_embedding.num_embeddings
        device = talker.codec_head.weight.device
        with torch.inference_mode():
            self.rows = torch.cat(
                [
                    talker.text(torch.arange(i, min(i + self.CHUNK, vocab), device=device))
                    for i in range(0, vocab, self.CHUNK)
                ]
            )
        codec = talker.model.codec_embedding.weight
        # The codec table with one zero row last, where NO_CODEC points.
        self.codec = torch.cat([codec.detach(), torch.zeros_like(codec[:1])])

    @torch.inference_mode()
    def prompts(self, plans: list[PromptPlan]) -> list[Prompt]:
        """The plans as `Prompt`s, all of them in one host-to-device copy and two lookups (the
        results are views of one tensor)."""
        zero = len(self.codec) - 1
        pieces = [p.text for p in plans] + [p.trailing for p in plans] + [np.array([p.pad]) for p in plans]
        text = np.concatenate(pieces)
        codec = np.concatenate(
            [np.where(p.codec < 0, zero, p.codec) for p in plans]
            + [np.full(len(x), zero) for x in pieces[len(plans) :]]
        )
        ids = torch.from_numpy(np.stack([text, codec]))
        if self.rows.device.type == "cuda":  # without waiting for the GPU work queued before it
            ids = ids.pin_memory().to(self.rows.device, non_blocking=True)
        rows = (self.rows[ids[0]] + self.codec[ids[1]]).split([len(x) for x in pieces])
        n = len(plans)
        return [Prompt(rows[i][None], rows[n + i][None], rows[2 * n + i], p.text_tokens) for i, p in enumerate(plans)]

    def materialize(self, plan: PromptPlan) -> Prompt:
        """One plan as a `Prompt`."""
        return self.prompts([plan])[0]


class PromptBuilder:
    def __init__(self, cfg: Qwen3TTSConfig, tokenizer: Tokenizer, talker: Talker) -> None:
        self.cfg, self.tokenizer, self.talker = cfg, tokenizer, talker
        ids = torch.tensor([[cfg.tts_bos_id, cfg.tts_eos_id, cfg.tts_pad_id]], device=self._device())
        with torch.inference_mode():
            self.tts_bos, self.tts_eos, self.tts_pad = talker.text(ids)[0]  # constant rows, computed once
        self._codec_rows: dict[tuple[int, ...], torch.Tensor] = {}

    def _device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    def _codec(self, ids: tuple[int, ...]) -> torch.Tensor:
        """Codec embeddings of control/speaker ids (exact lookups), cached: a prompt then needs
        one host-to-device copy, for its text, instead of five."""
        rows = self._codec_rows.get(ids)
        if rows is None:
            with torch.inference_mode(False), torch.no_grad():
                rows = self.talker.codec(torch.tensor(ids, device=self._device()))
            self._codec_rows[ids] = rows
        return rows

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor([self.tokenizer.encode(text, add_special_tokens=False).ids], device=self._device())

    def _token_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def language_id(self, language: str | None, speaker: str | None) -> int | None:
        t = self.cfg.talker
        lang = (language or "auto").lower()
        if lang != "auto" and lang not in t.language_ids:
            raise UnsupportedLanguage(f"unknown language {language!r}; use one of auto, {', '.join(t.language_ids)}")
        dialect = t.speaker_dialects.get(speaker or "")
        if dialect and lang in ("chinese", "auto"):
            return t.language_ids[dialect]
        return None if lang == "auto" else t.language_ids[lang]

    @staticmethod
    def _speakable(text: str) -> str:
        if not text.strip():
            raise EmptyText("text is empty")
        # A leading newline would merge with the template's into one token and shift the
        # reference's fixed slicing (it mis-slices such texts); leading newlines carry no speech.
        return text.lstrip("\r\n")

    def _speaker_id(self, speaker: str) -> int:
        t = self.cfg.talker
        key = speaker.lower()
        if key not in t.speaker_ids:
            raise UnknownVoice(f"unknown speaker {speaker!r}; available: {', '.join(t.speaker_ids)}")
        return t.speaker_ids[key]

    def _tags(self, language: str | None, speaker: str | None) -> tuple[int, ...]:
        """The codec track's opening: think (with the language) or no-think tags."""
        t = self.cfg.talker
        lang_id = self.language_id(language, speaker.lower() if speaker else None)
        if lang_id is None:
            return (t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id)
        return (t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id)

    def plan(
        self,
        text: str,
        *,
        speaker: str | None = None,
        language: str | None = None,
        instruct: str | None = None,
        stream_text: bool = False,
    ) -> PromptPlan:
        """`build`'s prompt for a CustomVoice speaker or a VoiceDesign instruction, as ids (no
        GPU work): the same rows in the same order (tests/model/test_qwen3.py holds the two
        together)."""
        t = self.cfg.talker
        text = self._speakable(text)
        ids = self._token_ids(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        if len(ids) <= 8:
            raise InvalidRequest("the text tokenizes to nothing")
        text_ids: list[int] = []
        codec_ids: list[int] = []

        def add(texts: list[int], codecs: list[int] | None = None) -> None:
            text_ids.extend(texts)
            codec_ids.extend(codecs if codecs is not None else [NO_CODEC] * len(texts))

        if instruct:
            add(self._token_ids(f"<|im_start|>user\n{instruct}<|im_end|>\n"))
        add(ids[:3])  # <|im_start|>assistant\n
        speaker_ids = [self._speaker_id(speaker)] if speaker is not None else []
        codec_seq = [*self._tags(language, speaker), *speaker_ids, t.codec_pad_id, t.codec_bos_id]
        add([self.cfg.tts_pad_id] * (len(codec_seq) - 2) + [self.cfg.tts_bos_id], codec_seq[:-1])
        body = ids[3:-5]
        if stream_text:
            add(body[:1], [t.codec_bos_id])
            trailing = [*body[1:], self.cfg.tts_eos_id]
        else:
            add([*body, self.cfg.tts_eos_id], [t.codec_pad_id] * (len(body) + 1))
            add([self.cfg.tts_pad_id], [t.codec_bos_id])
            trailing = [self.cfg.tts_pad_id]
        as_array = lambda values: np.asarray(values, dtype=np.int64)  # noqa: E731
        return PromptPlan(as_array(text_ids), as_array(codec_ids), as_array(trailing), self.cfg.tts_pad_id, len(body))

    @torch.inference_mode()
    def build(
        self,
        text: str,
        *,
        speaker: str | None = None,
        language: str | None = None,
        instruct: str | None = None,
        speaker_embedding: torch.Tensor | None = None,
        ref_codes: torch.Tensor | None = None,
        ref_text: str | None = None,
        stream_text: bool = False,
    ) -> Prompt:
        """Prefill for a CustomVoice (speaker), VoiceDesign (instruct) or cloned voice
        (x-vector `speaker_embedding`, plus `ref_codes` (T, 16) and `ref_text` for in-context
        cloning).

        `stream_text=False` puts the whole text in the prefill (the reference default for
        CustomVoice and VoiceDesign); True feeds it one token per generated frame (the
        reference default for cloning).
        """
        t, talker = self.cfg.talker, self.talker
        text = self._speakable(text)
        ids = self._ids(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        if ids.shape[1] <= 8:
            raise InvalidRequest("the text tokenizes to nothing")
        rows: list[torch.Tensor] = []
        if instruct:
            rows.append(talker.text(self._ids(f"<|im_start|>user\n{instruct}<|im_end|>\n"))[0])
        rows.append(talker.text(ids[:, :3])[0])  # <|im_start|>assistant\n
        speaker_row = None
        if speaker is not None:
            speaker_row = self._codec((self._speaker_id(speaker),))
        elif speaker_embedding is not None:
            speaker_row = speaker_embedding.reshape(1, -1)
        codec = [self._codec(self._tags(language, speaker))]
        if speaker_row is not None:
            codec.append(speaker_row)
        codec.append(self._codec((t.codec_pad_id, t.codec_bos_id)))
        codec_seq = torch.cat(codec)
        text_seq = torch.cat([self.tts_pad.expand(len(codec_seq) - 2, -1), self.tts_bos[None]])
        rows.append(codec_seq[:-1] + text_seq)
        codec_pad = self._codec((t.codec_pad_id,))[0]
        codec_bos = codec_seq[-1]
        body = ids[:, 3:-5]
        if ref_codes is not None:
            if not ref_text:
                raise InvalidRequest("in-context cloning needs the reference audio's transcript")
            rows_icl, trailing = self._icl_rows(body, ref_codes, ref_text, codec_bos, codec_pad, stream_text)
            rows.append(rows_icl)
        elif stream_text:
            rows.append(talker.text(body[:, :1])[0] + codec_bos)
            trailing = torch.cat([talker.text(body[:, 1:])[0], self.tts_eos[None]])
        else:
            text_rows = torch.cat([talker.text(body)[0], self.tts_eos[None]])
            rows.append(text_rows + codec_pad)
            rows.append((self.tts_pad + codec_bos)[None])
            trailing = self.tts_pad[None]
        return Prompt(torch.cat(rows)[None], trailing[None], self.tts_pad[None], body.shape[1])

    def _icl_rows(
        self,
        body: torch.Tensor,
        ref_codes: torch.Tensor,
        ref_text: str,
        codec_bos: torch.Tensor,
        codec_pad: torch.Tensor,
        stream_text: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """In-context cloning: the reference transcript + the text on the text track, the
        reference audio's frames (after codec_bos) on the codec track."""
        talker = self.talker
        ref_ids = self._ids(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[:, 3:-2]
        text = torch.cat([talker.text(torch.cat([ref_ids, body], dim=1))[0], self.tts_eos[None]])
        codes = ref_codes.to(body.device)
        tables = [talker.model.codec_embedding, *talker.code_predictor.model.codec_embedding]
        frames = torch.stack([table(codes[:, i]) for i, table in enumerate(tables)], dim=1).sum(1)
        codec = torch.cat([codec_bos[None], frames])
        if not stream_text:
            return torch.cat([text + codec_pad, codec + self.tts_pad]), self.tts_pad[None]
        if len(text) > len(codec):
            return text[: len(codec)] + codec, text[len(codec) :]
        padded = torch.cat([text, self.tts_pad.expand(len(codec) - len(text), -1)])
        return padded + codec, self.tts_pad[None]
