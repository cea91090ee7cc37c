"""The voice agent's latency report (voxgate/agent/report.py) on hand-made trace files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voxgate.agent.report import TraceFileError, format_table, read_traces, summarise
from voxgate.cli import main


def _turn(call: str, status: str, **marks: float) -> dict:
    return {"call_id": call, "trace_id": f"{call}-x", "status": status, "user": "hi", "heard": "", "marks": marks,
            "error": None}  # fmt: skip


def _answered(call: str, eot: float, stt: float, llm: float, seg: float, tts: float, pub: float) -> dict:
    """A completed turn whose stages take the given seconds, one after another from vad_end = eot."""
    at = [eot]
    for gap in (stt, llm, seg, tts, pub):
        at.append(at[-1] + gap)
    names = ("vad_end", "stt_done", "llm_first_token", "first_segment", "tts_first_audio", "first_frame_published")
    return _turn(call, "completed", vad_start=eot - 1.0, **dict(zip(names, at, strict=True)), playout_done=at[-1] + 2)


def _write(path: Path, turns: list[dict]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def _rows(report) -> dict[str, tuple[int, float | None, float | None]]:
    return {r.stage: (r.n, r.p50_ms, r.p95_ms) for r in report.rows}


def test_each_stage_is_the_gap_between_its_marks_and_they_add_up_to_eot_to_first_audio():
    turns = [_answered("a", 10.0, 0.2, 0.1, 0.05, 0.1, 0.01), _answered("a", 20.0, 0.4, 0.3, 0.05, 0.2, 0.03)]
    rows = _rows(summarise(turns))
    assert rows["STT"] == (2, 300.0, 390.0)  # linear interpolation between 200 and 400
    assert rows["LLM TTFT"] == (2, 200.0, 290.0)
    assert rows["first segment"] == (2, 50.0, 50.0)
    assert rows["TTS first audio"] == (2, 150.0, 195.0)
    assert rows["publish"] == (2, 20.0, 29.0)
    assert rows["EoT -> first audio"] == (2, 720.0, 954.0)  # turns of 460 and 980 ms


def test_turns_without_a_stages_marks_are_left_out_of_it_but_counted_by_status():
    dropped = _turn("a", "empty", vad_start=1.0, vad_end=1.5, stt_done=1.8)
    failed = _turn("a", "failed", vad_start=3.0, vad_end=3.5, stt_done=3.6, llm_first_token=3.7)
    report = summarise([_answered("a", 10.0, 0.2, 0.1, 0.05, 0.1, 0.01), dropped, failed])
    rows = _rows(report)
    assert rows["STT"][0] == 3 and rows["LLM TTFT"][0] == 2 and rows["EoT -> first audio"][0] == 1
    assert report.statuses == {"completed": 1, "empty": 1, "failed": 1} and report.turns == 3


def test_barge_in_is_measured_from_the_interrupters_speech_to_the_cut_replys_cancel():
    cut = _turn("a", "interrupted", vad_end=1.0, first_frame_published=1.5, cancel=4.0)
    interrupter = _turn("a", "completed", vad_start=3.2, vad_end=4.1)
    other_call = _turn("b", "completed", vad_start=3.0, vad_end=3.5)
    report = summarise([cut, interrupter, _turn("a", "interrupted", cancel=9.0), other_call])
    assert _rows(report)["barge-in -> cancel"] == (1, 800.0, 800.0)
    assert report.calls == 2


def test_no_turns_give_empty_rows_not_an_error():
    report = summarise([])
    assert all(r.n == 0 and r.p50_ms is None for r in report.rows) and report.statuses == {}
    assert "| STT | vad_end -> stt_done | 0 | - | - |" in format_table(report)


def test_a_directory_reads_every_call_file(tmp_path):
    _write(tmp_path / "one.jsonl", [_answered("one", 1.0, 0.2, 0.1, 0.05, 0.1, 0.01)])
    _write(tmp_path / "two.jsonl", [_answered("two", 1.0, 0.2, 0.1, 0.05, 0.1, 0.01)] * 2)
    (tmp_path / "notes.txt").write_text("not a trace")
    turns, files = read_traces(tmp_path)
    assert len(turns) == 3 and files == 2


@pytest.mark.parametrize(
    ("line", "says"),
    [("{not json", "not JSON"), ('["a list"]', "not a turn trace"), ('{"status": "completed"}', "not a turn trace"),
     ('{"status": "completed", "marks": {"vad_end": "soon"}}', "marks must be numbers")],
)  # fmt: skip
def test_a_bad_line_is_a_typed_error_naming_file_and_line(tmp_path, line, says):
    path = tmp_path / "call.jsonl"
    path.write_text(json.dumps(_turn("a", "completed")) + "\n\n" + line + "\n")
    with pytest.raises(TraceFileError, match=rf"call\.jsonl:3: {says}"):
        read_traces(path)


def test_a_missing_path_is_a_typed_error(tmp_path):
    with pytest.raises(TraceFileError, match="no such file"):
        read_traces(tmp_path / "nowhere.jsonl")


def test_the_cli_prints_the_table_with_the_hangover_and_writes_json(tmp_path, capsys):
    path = _write(tmp_path / "call.jsonl", [_answered("a", 1.0, 0.2, 0.1, 0.05, 0.1, 0.01)])
    out = tmp_path / "report.json"
    assert main(["agent", "--report", str(path), "--hangover-ms", "200", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| VAD hangover | (setting, before vad_end) | - | 200.0 | - |" in table
    assert "| EoT -> first audio | vad_end -> first_frame_published | 1 | 460.0 | 460.0 |" in table
    assert "1 turns in 1 calls (1 files); statuses: completed 1" in table
    written = json.loads(out.read_text())
    assert written["statuses"] == {"completed": 1} and written["hangover_ms"] == 200.0
    assert {r["stage"]: r["p50_ms"] for r in written["rows"]}["STT"] == 200.0


def test_the_cli_reports_a_bad_file_as_an_error_exit(tmp_path, capsys):
    path = tmp_path / "call.jsonl"
    path.write_text("{broken\n")
    assert main(["agent", "--report", str(path)]) == 2
    assert "agent_bad_trace" in capsys.readouterr().err
