from pathlib import Path

import pytest
from pydantic import ValidationError

from voxgate.config import Settings, describe_settings
from voxgate.speech.limits import StreamLimiter
from voxgate.types import Busy, TooManyStreams


def test_limiter_enforces_per_client_then_global_limits():
    limiter = StreamLimiter(max_streams=3, max_per_client=2)
    limiter.acquire("a")
    limiter.acquire("a")
    with pytest.raises(TooManyStreams):
        limiter.acquire("a")
    limiter.acquire("b")
    with pytest.raises(Busy):
        limiter.acquire("c")
    limiter.release("a")
    limiter.acquire("c")
    assert limiter.active == 3


def test_settings_read_env_lists_as_csv_or_json(monkeypatch):
    monkeypatch.setenv("VOXGATE_API_KEYS", "k1, k2")
    monkeypatch.setenv("VOXGATE_STARTER_PHRASES", '["Okay, ", "好的"]')
    s = Settings()
    assert s.api_keys == ["k1", "k2"]
    assert s.starter_phrases == ["Okay, ", "好的"]


def test_settings_are_frozen_and_validated(monkeypatch):
    s = Settings()
    with pytest.raises(ValidationError):
        s.port = 1  # type: ignore[misc]
    monkeypatch.setenv("VOXGATE_PORT", "99999")
    with pytest.raises(ValidationError):
        Settings()


def test_defaults_are_safe():
    s = Settings()
    assert s.host == "127.0.0.1" and s.api_keys == [] and s.engine == "piper"


def test_readme_documents_every_setting():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    missing = [name for name, _, _ in describe_settings() if f"`{name}`" not in readme]
    assert missing == []
