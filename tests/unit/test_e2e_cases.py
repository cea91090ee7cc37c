"""regress e2e, pure: the shipped case file and tiers, the user-audio injections and their
P1 fingerprints, and how a call's recording is cut into replies."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from voxgate.regress import signals
from voxgate.regress.e2e import inject, judge, probe
from voxgate.regress.e2e.call import CallRecording, Said
from voxgate.regress.e2e.cases import CaseError, load_cases, select
from voxgate.regress.e2e.speech import USER_PEAK, prepare

RATE = 22050


def words(seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """Syllables at lognormal levels (speech's spread: the loudest far above the median)."""
    rng = np.random.default_rng(seed)
    n = round(0.125 * RATE)
    t = np.arange(n) / RATE
    count = round(seconds / 0.125)
    levels = rng.lognormal(0.0, 1.0, count)
    x = np.concatenate([a * np.sin(2 * np.pi * rng.uniform(100, 200) * t) * np.hanning(n) for a in levels])
    return (x / np.max(np.abs(x))).astype(np.float32)


def test_the_mini_tier_is_four_runnable_p0_cases_and_chinese_is_skipped_with_its_reason() -> None:
    cases = load_cases()
    mini = select(cases, "mini")
    assert [c.id for c in mini] == ["endpoint_short_hello", "endpoint_long_sentence", "interrupt_once",
                                    "noise_background"]  # fmt: skip
    assert all(c.priority == "P0" and c.skip is None for c in mini)
    fast = select(cases, "fast")
    assert {c.anomaly.kind for c in fast if c.priority == "P1"} == {"spike", "speed", "distort"}  # type: ignore[union-attr]
    chinese = next(c for c in fast if c.language == "zh")
    assert chinese.skip and "tiny.en" in chinese.skip and "Piper" in chinese.skip


def test_nightly_cycles_runnable_p0_cases_over_fresh_calls() -> None:
    nightly = select(load_cases(), "nightly", turns=9)
    assert len(nightly) == 9 and len({c.id for c in nightly}) == 9  # each turn its own call id
    assert nightly[0].id.endswith("@1") and all(c.priority == "P0" and c.skip is None for c in nightly)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.pop("steps"), "missing or bad field"),
        (lambda c: c.update(priority="P7"), "priority"),
        (lambda c: c["steps"].append({"text": "again", "when": "start"}), "first step"),
    ],
)
def test_a_bad_case_file_is_a_typed_error(tmp_path: Path, change, message: str) -> None:
    case = {"id": "x", "priority": "P0", "steps": [{"text": "hi"}]}
    change(case)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"cases": [case]}))
    with pytest.raises(CaseError, match=message):
        load_cases(path)
    with pytest.raises(CaseError, match="unknown tier"):
        select([], "weekly")


def test_noise_is_mixed_at_the_asked_snr() -> None:
    speech = 0.3 * words()  # room to add noise without the mix being scaled down
    for snr in (5.0, 15.0):
        mixed = inject.mix_at_snr(speech, RATE, snr, "pink", seed=3)
        noise = mixed - speech
        voiced = signals.speech_frames(speech, RATE)
        n = round(0.01 * RATE)
        level = signals.rms(speech[: len(voiced) * n].reshape(-1, n)[voiced])
        assert 20 * np.log10(level / signals.rms(noise)) == pytest.approx(snr, abs=0.5)


def _case(kind: str, params: dict):
    from voxgate.regress.e2e.cases import Anomaly, Case, Step

    return Case("p1", "P1", (Step("hi"),), anomaly=Anomaly(kind, params))


@pytest.mark.parametrize(("kind", "params"), [("spike", {"at_s": 0.8}), ("speed", {"factor": 1.15}),
                                              ("distort", {"gain": 8.0})])  # fmt: skip
def test_each_user_anomaly_shows_in_its_fingerprint_and_clean_speech_shows_none(kind: str, params: dict) -> None:
    case = _case(kind, params)
    clean = prepare(words(), RATE, _case(kind, {}).__class__("c", "P0", case.steps))
    sent = prepare(words(), RATE, case)
    assert float(np.max(np.abs(clean.samples))) == pytest.approx(USER_PEAK, abs=1e-6)  # a mic's level
    assert judge.fingerprint(case, clean.samples, sent.samples, RATE, 0.001)["ok"]
    assert not judge.fingerprint(case, clean.samples, clean.samples, RATE, 0.001)["ok"]
    if kind == "speed":
        assert sent.duration_s < clean.duration_s and sent.speech_end_s < clean.speech_end_s


def _recording() -> CallRecording:
    """Two replies: the first cut by a barge-in, the second completed; frames every 20 ms."""
    rec = CallRecording("interrupt_once", 1, call_id="c", record_rate=16000)
    loud, quiet = np.full(320, 0.2, np.float32), np.zeros(320, np.float32)
    for i in range(600):  # 12 s of frames
        t = 0.02 * i
        speaking = 3.0 <= t < 4.0 or 8.0 <= t < 9.0
        rec.audio.append((t, loud if speaking else quiet))
    rec.said = [Said(0, 0.5, 2.2, 2.0), Said(1, 4.0, 6.2, 6.0)]
    rec.events = [(1.0, {"type": "call.started"}), (2.5, {"type": "reply.start", "trace_id": "c-1"}),
                  (3.0, {"type": "reply.segment", "trace_id": "c-1", "index": 0}),
                  (4.3, {"type": "reply.end", "trace_id": "c-1", "status": "interrupted"}),
                  (7.0, {"type": "reply.start", "trace_id": "c-2"}),
                  (8.0, {"type": "reply.segment", "trace_id": "c-2", "index": 0}),
                  (9.2, {"type": "reply.end", "trace_id": "c-2", "status": "completed"})]  # fmt: skip
    return rec


def test_replies_are_cut_by_their_events_and_tied_to_the_words_they_answer() -> None:
    first, second = probe.replies(_recording())
    assert (first.reply_seq, first.trace_id, first.status, first.cut) == (1, "c-1", "interrupted", True)
    assert first.t_eot == 2.0 and first.t_first_audio == pytest.approx(3.0)
    assert len(first.post) == round((4.8 - 2.5) / 0.02) * 320  # to reply.end + 0.5 s
    assert second.t_eot == 6.0 and second.t_first_audio == pytest.approx(8.0) and not second.cut
    assert probe.call_audible(_recording())


def test_a_silent_capture_is_called_again_once_and_the_second_attempt_is_kept(monkeypatch, tmp_path: Path) -> None:
    import asyncio

    from voxgate.regress.e2e import runner

    calls: list[int] = []

    async def fake_call(url, case, utterances, attempt=1, **kw):  # the first call hears nothing
        calls.append(attempt)
        rec = _recording()
        if attempt == 1:
            rec.audio = [(t, np.zeros_like(x)) for t, x in rec.audio]
        return dataclasses.replace(rec, attempt=attempt)

    monkeypatch.setattr(runner, "run_call", fake_call)
    case = select(load_cases(), "mini", only=["interrupt_once"])[0]
    recordings = asyncio.run(runner._calls("http://x", [case], {case.id: []}, True, lambda line: None))
    assert calls == [1, 2] and [r.attempt for r in recordings[case.id]] == [1, 2]
    (tmp_path / "events").mkdir()
    (tmp_path / "post").mkdir()
    result, replies = runner._measure(case, recordings[case.id], None, None, None, tmp_path)
    assert result.attempts == 2 and result.retried_because == "nothing heard" and result.audible
    assert [r.attempt for r in replies] == [2, 2] and (tmp_path / "events" / f"{case.id}.attempt1.json").is_file()
    calls.clear()
    asyncio.run(runner._calls("http://x", [case], {case.id: []}, False, lambda line: None))
    assert calls == [1]  # --no-retry
