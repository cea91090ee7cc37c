"""Joining a model split across packages (whisper base ships as model.bin.part1 + .part2)."""

from __future__ import annotations

import os

import pytest

from voxgate.agent.stt import SttModelMissing, join_model_parts


@pytest.fixture
def packages(tmp_path):
    one, two = tmp_path / "part1" / "data", tmp_path / "part2" / "data"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    (one / "model.bin.part1").write_bytes(b"A" * 1000)
    (two / "model.bin.part2").write_bytes(b"B" * 700)
    (one / "config.json").write_text('{"k": 1}')
    (one / "vocabulary.txt").write_text("a\nb\n")
    return [two, one]  # the order of the packages does not matter, the part numbers do


def test_parts_are_joined_in_order_and_other_files_copied(packages, tmp_path):
    target = join_model_parts(packages, tmp_path / "cache" / "whisper-base")
    assert (target / "model.bin").read_bytes() == b"A" * 1000 + b"B" * 700
    assert (target / "config.json").read_text() == '{"k": 1}'
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.bin", "vocabulary.txt"]


def test_a_complete_model_is_not_rewritten_but_a_truncated_one_is(packages, tmp_path):
    target = join_model_parts(packages, tmp_path / "cache")
    model = target / "model.bin"
    os.utime(model, (1, 1))
    join_model_parts(packages, tmp_path / "cache")
    assert model.stat().st_mtime == 1  # kept
    model.write_bytes(b"A" * 1000)  # as a crash mid-copy would have left it without the rename
    join_model_parts(packages, tmp_path / "cache")
    assert model.read_bytes() == b"A" * 1000 + b"B" * 700


def test_a_missing_part_is_a_typed_error(packages, tmp_path):
    (packages[0] / "model.bin.part2").rename(packages[0] / "model.bin.part3")
    with pytest.raises(SttModelMissing, match=r"parts \[1, 3\]"):
        join_model_parts(packages, tmp_path / "cache")
