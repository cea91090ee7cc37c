"""qwen3 checkpoints by Hugging Face id: resolved from a real hub cache on disk, never the Hub.

A tiny random checkpoint is laid out the way huggingface_hub lays out its cache
(`models--Org--Name/snapshots/<commit>/`, `refs/<branch>`), and huggingface_hub itself resolves
ids against it. Child processes get HF_HUB_OFFLINE=1 and an HF_ENDPOINT on a closed loopback
port, so even a bug cannot reach the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from voxgate.bench.server import ServerProcess
from voxgate.config import Settings
from voxgate.engines.qwen3.checkpoint import make_random_checkpoint
from voxgate.engines.qwen3.engine import create
from voxgate.engines.qwen3.hub import (
    MODEL_FILES,
    ModelNotCached,
    ModelNotFound,
    ModelUnavailable,
    is_local,
    resolve_model,
)
from voxgate.engines.qwen3.loader import REQUIRED_FILES
from voxgate.types import EngineFailure

REPO = "voxgate-test/Qwen3-TTS-tiny"
MAIN = "a" * 40
OTHER = "b" * 40
CLOSED_PORT_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens, a request fails at once


def _add_snapshot(cache: Path, repo: str, commit: str, source: Path, refs: tuple[str, ...]) -> Path:
    """`source` as snapshot `commit` of `repo`, with `refs` (branches, tags) pointing at it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (folder / "refs" / ref).write_text(commit)
    return snapshot.resolve()


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding REPO at two commits (main and v2), and a repository that is not Qwen3-TTS."""
    root = tmp_path_factory.mktemp("hub")
    tiny = make_random_checkpoint("Qwen3-TTS-12Hz-0.6B-CustomVoice", root / "tiny", tiny=True, seed=3)
    cache = root / "cache"
    _add_snapshot(cache, REPO, MAIN, tiny, ("main",))
    _add_snapshot(cache, REPO, OTHER, tiny, ("v2",))
    other = root / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    _add_snapshot(cache, "voxgate-test/not-tts", MAIN, other, ("main",))
    return cache


def _snapshot(cache: Path, commit: str) -> Path:
    return (cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit).resolve()


def _offline_env(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """What a user sets; child processes inherit it (huggingface_hub reads it at import)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT_ENDPOINT)


def _voxgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voxgate", *args], capture_output=True, text=True, timeout=120)


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(hub_cache):
    assert resolve_model(REPO, cache_dir=hub_cache, offline=True).resolve() == _snapshot(hub_cache, MAIN)


@pytest.mark.parametrize("revision", ["v2", OTHER])
def test_a_revision_selects_its_snapshot(hub_cache, revision):
    path = resolve_model(REPO, revision, cache_dir=hub_cache, offline=True)
    assert path.resolve() == _snapshot(hub_cache, OTHER)


@pytest.mark.parametrize(("repo", "revision"), [("voxgate-test/missing", None), (REPO, "v3"), (REPO, "c" * 40)])
def test_an_uncached_model_offline_names_the_download_command(hub_cache, repo, revision):
    with pytest.raises(ModelNotCached) as caught:
        resolve_model(repo, revision, cache_dir=hub_cache, offline=True)
    command = f"voxgate download {repo}" + (f" --revision {revision}" if revision else "")
    assert command in caught.value.message and caught.value.code == "model_not_cached"


def test_a_repository_that_is_not_qwen3_tts_is_refused_before_its_weights(hub_cache):
    with pytest.raises(ModelNotFound, match="not a Qwen3-TTS 12 Hz checkpoint"):
        resolve_model("voxgate-test/not-tts", cache_dir=hub_cache, offline=True)


def test_an_invalid_id_is_a_typed_error():
    with pytest.raises(ModelNotFound, match="neither a directory nor a Hugging Face model id"):
        resolve_model("no spaces/in ids", offline=True)


def test_only_the_files_the_loader_reads_are_fetched():
    assert sorted(MODEL_FILES) == sorted(REQUIRED_FILES)


def test_local_directories_and_hub_ids_are_told_apart(tmp_path):
    assert is_local(tmp_path) and is_local(str(tmp_path)) and is_local("./models/x") and is_local("~/ck")
    assert is_local("/no/such/dir") and is_local("a/b/c")
    assert not is_local("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") and not is_local("gpt2")
    assert resolve_model(str(tmp_path)) == tmp_path
    with pytest.raises(ModelUnavailable, match="local directory"):
        resolve_model(tmp_path, "main")


def test_model_and_model_dir_may_name_one_directory_only(tmp_path):
    same = Settings(qwen3_model=f"{tmp_path}/.", qwen3_model_dir=tmp_path)
    assert same.qwen3_model_dir == tmp_path
    with pytest.raises(ValidationError, match="name different checkpoints"):
        Settings(qwen3_model=REPO, qwen3_model_dir=tmp_path)


def test_qwen3_without_a_model_names_both_settings():
    with pytest.raises(EngineFailure) as caught:
        create(Settings(engine="qwen3"))
    assert "VOXGATE_QWEN3_MODEL " in caught.value.message and "VOXGATE_QWEN3_MODEL_DIR" in caught.value.message


def test_download_prints_the_cached_path_offline(hub_cache, monkeypatch):
    _offline_env(monkeypatch, hub_cache)
    done = _voxgate("download", REPO)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve() == _snapshot(hub_cache, MAIN)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache.parent / "elsewhere"))
    done = _voxgate("download", REPO, "--revision", "v2", "--cache-dir", str(hub_cache))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve() == _snapshot(hub_cache, OTHER)


def test_download_of_an_uncached_model_offline_fails_in_one_line(hub_cache, monkeypatch):
    _offline_env(monkeypatch, hub_cache)
    done = _voxgate("download", "voxgate-test/missing")
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("voxgate: error:"), done.stderr
    assert "voxgate download voxgate-test/missing" in lines[0]


@pytest.mark.slow
def test_the_server_speaks_a_model_named_by_its_hub_id(hub_cache, monkeypatch):
    _offline_env(monkeypatch, hub_cache)
    env = {"QWEN3_MODEL": REPO, "QWEN3_REVISION": "v2", "STARTER_CACHE": "false", "QWEN3_PACKET_FRAMES": "2"}
    with ServerProcess("qwen3", env=env) as server:
        body = {"text": "Hello from the hub.", "voice": "vivian", "language": "en", "seed": 1}
        spoken = httpx.post(f"{server.url}/tts/stream", json=body, timeout=120)
        log = "\n".join(server.log)
    assert spoken.status_code == 200 and len(spoken.content) > 0
    assert f"loaded {OTHER}" in log  # the loader names the directory: v2's snapshot, not main's
