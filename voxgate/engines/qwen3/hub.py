"""Qwen3-TTS checkpoints by name: a local directory, or a Hugging Face Hub id fetched into
the user's Hugging Face cache.

huggingface_hub reads HF_HOME, HF_HUB_CACHE, HF_ENDPOINT and HF_HUB_OFFLINE itself (once, when
it is imported), so `voxgate serve`, `voxgate download` and every other Hugging Face tool share
one cache and one offline switch; voxgate reads none of them. Only the files the loader reads
are fetched: the official repositories also hold READMEs and the codec's training leftovers.
No torch here, so `voxgate download` starts fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from huggingface_hub import constants, hf_hub_download, is_offline_mode, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from voxgate.engines.qwen3.config import CHECKPOINT_FILES
from voxgate.types import VoxgateError

log = logging.getLogger(__name__)

MODEL_FILES = CHECKPOINT_FILES  # what loader.py reads, and nothing else
MODEL_TYPES = ("custom_voice", "voice_design", "base")
TOKENIZER_TYPE = "qwen3_tts_tokenizer_12hz"


class ModelUnavailable(VoxgateError):
    """A named checkpoint that cannot be had: the base of the errors below."""

    code = "model_unavailable"
    status = 500


class ModelNotFound(ModelUnavailable):
    """No such model (or revision) on the Hub, or one voxgate cannot run."""

    code = "model_not_found"


class ModelNotCached(ModelUnavailable):
    """Offline (HF_HUB_OFFLINE) and the model is not in the cache."""

    code = "model_not_cached"


class HubUnreachable(ModelUnavailable):
    """The Hub could not be reached and the model is not in the cache."""

    code = "hub_unreachable"


def is_local(model: str | Path) -> bool:
    """A `Path`, an existing directory, or anything written as a path (absolute, ./, ../, ~,
    a backslash, more than one /); the rest is a Hub id, as transformers decides."""
    if isinstance(model, Path):
        return True
    text = str(model)
    written_as_path = text.startswith(("/", "./", "../", "~")) or "\\" in text or text.count("/") > 1
    return written_as_path or Path(text).expanduser().is_dir()


def resolve_model(
    model: str | Path, revision: str | None = None, cache_dir: str | Path | None = None, offline: bool = False
) -> Path:
    """The checkpoint directory `model` names: a local directory as it is, a Hub id as its
    snapshot in the cache, downloaded first unless cached or offline (`offline`, or
    HF_HUB_OFFLINE). `cache_dir` overrides huggingface_hub's (HF_HUB_CACHE, else HF_HOME/hub)."""
    if is_local(model):
        if revision is not None:
            raise ModelUnavailable(f"{model} is a local directory: a revision only selects a Hugging Face model's")
        return Path(model).expanduser()
    return fetch_model(str(model), revision, cache_dir, offline or is_offline_mode())


def fetch_model(repo_id: str, revision: str | None, cache_dir: str | Path | None, offline: bool) -> Path:
    """Checks the config first, so a repository that is not a Qwen3-TTS 12 Hz checkpoint
    costs one small file, not gigabytes of weights."""
    with _hub_errors(repo_id, revision, cache_dir, offline):
        config = hf_hub_download(
            repo_id, "config.json", revision=revision, cache_dir=cache_dir, local_files_only=offline
        )
        check_config(json.loads(Path(config).read_text()), repo_id)
        path = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline, allow_patterns=list(MODEL_FILES)
        )
    log.info("qwen3 model %s%s at %s", repo_id, f"@{revision}" if revision else "", path)
    return Path(path)


def check_config(raw: dict[str, Any], name: str) -> None:
    """A Qwen3-TTS 12 Hz config of a kind the engine runs (CustomVoice, VoiceDesign, Base)."""
    kind, tokenizer = raw.get("tts_model_type"), raw.get("tokenizer_type")
    if raw.get("model_type") != "qwen3_tts" or tokenizer != TOKENIZER_TYPE:
        raise ModelNotFound(f"{name} is not a Qwen3-TTS 12 Hz checkpoint (model_type {raw.get('model_type')!r})")
    if kind not in MODEL_TYPES:
        raise ModelNotFound(f"{name} is a Qwen3-TTS model of type {kind!r}; voxgate runs {', '.join(MODEL_TYPES)}")


def download_command(repo_id: str, revision: str | None) -> str:
    return f"voxgate download {repo_id}" + (f" --revision {revision}" if revision else "")


@contextlib.contextmanager
def _hub_errors(repo_id: str, revision: str | None, cache_dir: str | Path | None, offline: bool) -> Iterator[None]:
    """huggingface_hub's exceptions as voxgate's typed errors, each with what to do next."""
    name = repo_id + (f" (revision {revision})" if revision else "")
    try:
        yield
    except HFValidationError as exc:
        raise ModelNotFound(f"{repo_id!r} is neither a directory nor a Hugging Face model id") from exc
    except GatedRepoError as exc:
        raise ModelNotFound(f"{repo_id} is gated: accept its terms on huggingface.co, then `hf auth login`") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFound(f"no model {repo_id} on the Hugging Face Hub (private ones need `hf auth login`)") from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFound(f"{repo_id} has no revision {revision!r}") from exc
    except RemoteEntryNotFoundError as exc:
        raise ModelNotFound(f"{name} has no config.json: not a Qwen3-TTS checkpoint") from exc
    except LocalEntryNotFoundError as exc:  # incomplete snapshots too
        cache = cache_dir or constants.HF_HUB_CACHE
        if offline:
            raise ModelNotCached(
                f"{name} is not (completely) in the Hugging Face cache {cache} and HF_HUB_OFFLINE keeps voxgate "
                f"off the network: run `{download_command(repo_id, revision)}` where the Hub is reachable"
            ) from exc
        raise HubUnreachable(
            f"cannot reach the Hugging Face Hub for {name}, and it is not in the cache {cache}: check the network "
            f"(or HF_ENDPOINT), then run `{download_command(repo_id, revision)}`"
        ) from exc
    except (httpx.TransportError, OfflineModeIsEnabled) as exc:
        raise HubUnreachable(
            f"the connection to the Hugging Face Hub broke while fetching {name}: {_first_line(exc)}"
        ) from exc
    except HfHubHTTPError as exc:
        raise HubUnreachable(f"the Hugging Face Hub refused {name}: {_first_line(exc)}") from exc
    except OSError as exc:  # a full disk, an unwritable cache
        raise ModelUnavailable(f"cannot store {name} in the Hugging Face cache: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
