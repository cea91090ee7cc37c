"""Question sets recorded on one machine and said on another (`voxgate bench agent
--record-questions DIR`, then `--questions-dir DIR`): what is read back is what was written, to
16-bit rounding, and a set that no longer matches the questions is refused, never said."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from voxgate.bench.agent import basic_questions, same_host
from voxgate.bench.questions import (
    MANIFEST,
    Question,
    QuestionSetError,
    RecordedSet,
    Recording,
    load_questions,
    write_recordings,
)


def _recording(q: Question, rate: int, seed: int) -> Recording:
    samples = (0.3 * np.random.default_rng(seed).uniform(-1, 1, rate)).astype(np.float32)
    spans = tuple((0.1 + i * 0.4, 0.3 + i * 0.4) for i in range(len(q.sentences)))
    return Recording(q, f"espeak:en-us+f3:{150 + seed}", samples, rate, spans)


def test_a_recorded_set_reads_back_as_written(tmp_path: Path):
    questions = [*load_questions()[:3], *basic_questions()[:2]]
    rates = (22050, 16000, 24000, 22050, 8000)
    written = [_recording(q, rate, i) for i, (q, rate) in enumerate(zip(questions, rates, strict=True))]
    write_recordings(tmp_path / "set", written)
    recorded = RecordedSet(tmp_path / "set")
    for rec in written:
        back = recorded.get(rec.question)
        assert (back.question, back.voice, back.sample_rate, back.spans_s) == (
            rec.question, rec.voice, rec.sample_rate, rec.spans_s)  # fmt: skip
        assert back.samples.dtype == np.float32 and len(back.samples) == len(rec.samples)
        assert np.max(np.abs(back.samples - rec.samples)) <= 1 / 32767  # PCM16 rounding, nothing else
    assert questions[0].id in recorded and load_questions()[3].id not in recorded


def test_a_set_recorded_for_other_words_or_pauses_is_refused(tmp_path: Path):
    q = next(q for q in load_questions() if q.multi)
    write_recordings(tmp_path, [_recording(q, 16000, 1)])
    recorded = RecordedSet(tmp_path)
    moved = Question(q.id, q.kind, q.sentences, tuple(p + 10 for p in q.pauses_ms), q.expected)
    reworded = Question(q.id, q.kind, (*q.sentences[:-1], "Something else?"), q.pauses_ms, q.expected)
    for changed in (moved, reworded):
        with pytest.raises(QuestionSetError, match="record the set again"):
            recorded.get(changed)
    other = next(o for o in load_questions() if o.id != q.id)
    with pytest.raises(QuestionSetError, match="no recording"):
        recorded.get(other)


def test_a_missing_broken_or_hostile_set_is_a_typed_error(tmp_path: Path):
    with pytest.raises(QuestionSetError, match="no readable"):
        RecordedSet(tmp_path)  # no manifest
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(QuestionSetError, match="no readable"):
        RecordedSet(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 99, "recordings": []}))
    with pytest.raises(QuestionSetError, match="format"):
        RecordedSet(tmp_path)
    q = basic_questions()[0]
    write_recordings(tmp_path, [_recording(q, 16000, 2)])
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["recordings"][0]["file"] = "../../etc/passwd"  # the manifest names files of its folder only
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(QuestionSetError, match="bad file name"):
        RecordedSet(tmp_path).get(q)
    manifest["recordings"][0]["file"] = "absent.wav"
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(QuestionSetError, match=r"absent\.wav"):
        RecordedSet(tmp_path).get(q)


def test_the_basic_set_is_the_five_questions_then_the_interruption():
    from voxgate.bench.agent import INTERRUPT, QUESTIONS

    assert [q.expected for q in basic_questions()] == [*QUESTIONS, INTERRUPT]
    assert len({q.id for q in basic_questions()} | {q.id for q in load_questions()}) == len(QUESTIONS) + 1 + len(
        load_questions()
    )  # one recorded set holds both


def test_a_loopback_server_shares_the_bench_clock_and_another_host_does_not():
    assert same_host(None) and same_host("http://127.0.0.1:8765") and same_host("http://localhost:8000/")
    assert same_host("http://[::1]:8000")
    assert not same_host("http://10.0.0.5:8000") and not same_host("https://gpu.example.com")
