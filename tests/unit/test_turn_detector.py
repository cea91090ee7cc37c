"""The end-of-turn rules on scripted VAD probabilities and scripted turn-model answers (no model)."""

from __future__ import annotations

import json
from concurrent.futures import Executor, Future
from dataclasses import asdict

import numpy as np
import pytest

from voxgate.agent import controller as fsm
from voxgate.agent.turn import TurnConfig, TurnDecision, TurnDetector
from voxgate.agent.vad import SpeechEnded, SpeechStarted, VadSegmenter
from voxgate.types import InvalidRequest

W = 512  # samples per 32 ms window at 16 kHz
SILENT, VOICED = 0.02, 0.93
HANGOVER_W = 7  # 200 ms in whole windows
MAX_SILENCE_W = 47  # 1500 ms from the last voiced window -> decided in the 47th silent window
PRE_ROLL = 3200


def script(*runs: tuple[float, int]) -> list[float]:
    return [p for p, n in runs for _ in range(n)]


class Answers:
    """A turn model that gives scripted probabilities and keeps the clips it was asked about."""

    def __init__(self, *answers: float | Exception) -> None:
        self.answers, self.clips = list(answers), []

    def probability(self, audio: np.ndarray) -> float:
        self.clips.append(audio)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Later(Executor):
    """An executor whose work runs when the test says so: the model's answer arrives late."""

    def __init__(self) -> None:
        self.queued: list[tuple[Future, object, tuple]] = []

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self.queued.append((future, fn, args))
        return future

    def finish(self) -> None:
        for future, fn, args in self.queued:
            future.set_result(fn(*args))
        self.queued.clear()


def positions(n: int) -> np.ndarray:
    """Audio whose every sample is its own position: a clip shows which samples were sent."""
    return np.arange(n, dtype=np.float32)


def run(probs: list[float], model: Answers, config: TurnConfig | None = None, executor: Executor | None = None,
        flush: bool = True) -> list:  # fmt: skip
    seg, detector = VadSegmenter(), TurnDetector(model, config, executor)
    audio = positions(len(probs) * W)
    events = []
    for p in probs:
        events += detector.step(seg.push(p), seg.position, lambda a, b: audio[a:b])
    return events + (detector.flush(seg.flush()) if flush else [])


def test_a_pause_judged_complete_ends_the_turn_at_the_hangover():
    model = Answers(0.9)
    events = run(script((SILENT, 20), (VOICED, 30), (SILENT, 60)), model)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
    end = events[1]
    assert (end.sample, end.start_sample, end.end_sample) == ((50 + HANGOVER_W) * W, 20 * W - PRE_ROLL, 50 * W)
    assert end.end_of_turn.reason == "complete" and end.end_of_turn.probability == 0.9
    assert end.end_of_turn.incomplete == 0 and end.end_of_turn.latency_ms >= 0
    assert end.end_of_turn.silence_ms == pytest.approx(224)  # decided at the hangover, inline
    (clip,) = model.clips  # the turn from its first sample (pre-roll included) to the decision
    assert clip[0] == 20 * W - PRE_ROLL and clip[-1] == end.sample - 1


def test_speech_after_a_pause_judged_incomplete_continues_the_same_turn():
    model = Answers(0.1, 0.8)
    probs = script((SILENT, 20), (VOICED, 20), (SILENT, 18), (VOICED, 25), (SILENT, 60))
    events = run(probs, model)
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
    end = events[1]
    assert end.start_sample == 20 * W - PRE_ROLL and end.end_sample == 83 * W  # one utterance, both parts
    assert end.end_of_turn == TurnDecision("complete", 0.8, end.end_of_turn.latency_ms, 1, silence_ms=224.0)
    assert model.clips[1][0] == 20 * W - PRE_ROLL  # the second question hears the whole turn


def test_a_pause_judged_incomplete_ends_the_turn_after_max_silence():
    events = run(script((VOICED, 20), (SILENT, 200)), Answers(0.2), flush=False)
    (_, end) = events
    assert end.sample == (20 + MAX_SILENCE_W) * W and end.end_sample == 20 * W
    assert (end.end_of_turn.reason, end.end_of_turn.probability, end.end_of_turn.incomplete) == ("timeout", 0.2, 1)


def test_threshold_and_max_silence_are_configurable():
    config = TurnConfig(threshold=0.95, max_silence_ms=500)
    (_, end) = run(script((VOICED, 20), (SILENT, 100)), Answers(0.9), config, flush=False)
    assert end.end_of_turn.reason == "timeout" and end.sample == (20 + 16) * W  # 500 ms -> 15.6 windows


def test_a_failing_model_leaves_the_vad_end_of_turn():
    (_, end) = run(script((VOICED, 20), (SILENT, 60)), Answers(RuntimeError("onnx broke")))
    assert end.sample == (20 + HANGOVER_W) * W
    assert end.end_of_turn == TurnDecision("error", None, None, 0, silence_ms=224.0)


def test_an_answer_from_the_executor_is_taken_at_the_next_window():
    later = Later()
    seg, detector = VadSegmenter(), TurnDetector(Answers(0.9), executor=later)
    audio = positions(200 * W)

    def step(p: float) -> list:
        return detector.step(seg.push(p), seg.position, lambda a, b: audio[a:b])

    assert [type(e) for p in script((VOICED, 20), (SILENT, 10)) for e in step(p)] == [SpeechStarted]
    assert detector.holding and len(later.queued) == 1
    later.finish()
    (end,) = step(SILENT)
    assert end.end_of_turn.reason == "complete" and end.sample == 31 * W and end.end_sample == 20 * W
    assert end.end_of_turn.silence_ms == pytest.approx(11 * 32)  # the hangover and the model's 4 windows


def test_an_answer_that_arrives_after_speech_resumed_is_ignored():
    later = Later()
    seg, detector = VadSegmenter(), TurnDetector(Answers(0.9, 0.7), executor=later)
    audio = positions(200 * W)
    events = []
    for p in script((VOICED, 20), (SILENT, 10), (VOICED, 20)):
        events += detector.step(seg.push(p), seg.position, lambda a, b: audio[a:b])
    later.finish()  # "complete", but about a pause the user already talked through
    for p in script((SILENT, 10)):
        events += detector.step(seg.push(p), seg.position, lambda a, b: audio[a:b])
    later.finish()
    events += detector.step(seg.push(SILENT), seg.position, lambda a, b: audio[a:b])
    assert [type(e) for e in events] == [SpeechStarted, SpeechEnded]
    assert events[1].end_sample == 50 * W and events[1].end_of_turn.probability == 0.7


def test_the_stream_ending_ends_a_held_pause_and_open_speech():
    (_, end) = run(script((VOICED, 20), (SILENT, 20)), Answers(0.1))
    assert end.end_of_turn.reason == "ended" and end.end_sample == 20 * W
    (_, end) = run(script((VOICED, 20)), Answers())
    assert end.end_of_turn == TurnDecision("ended", None, None, 0, silence_ms=0.0)


def test_turn_config_rejects_impossible_values():
    for bad in ({"threshold": 0}, {"threshold": 1.5}, {"max_silence_ms": -1}):
        with pytest.raises(InvalidRequest):
            TurnConfig(**bad)


def test_the_turn_trace_carries_how_the_end_of_turn_was_decided():
    decision = TurnDecision("complete", 0.93, 101.5, incomplete=1)
    c = fsm.DuplexController(fsm.ControllerConfig(), call_id="c")
    c.handle(fsm.SpeechStarted(1.0))
    (stt,) = [a for a in c.handle(fsm.SpeechEnded(2.0, end_of_turn=decision)) if isinstance(a, fsm.StartStt)]
    (done,) = [a for a in c.handle(fsm.Transcript(stt.trace_id, stt.part, "", 2.2)) if isinstance(a, fsm.TraceDone)]
    assert done.trace.status == "empty" and done.trace.end_of_turn == decision
    row = json.loads(json.dumps(asdict(done.trace)))  # as the driver writes the trace file
    assert row["end_of_turn"] == {"reason": "complete", "probability": 0.93, "latency_ms": 101.5, "incomplete": 1,
                                  "silence_ms": 0.0}  # fmt: skip
    assert fsm.TurnTrace("t", "completed", "", "", {}).end_of_turn is None  # no turn model: no verdict
