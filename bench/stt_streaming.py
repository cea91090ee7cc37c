"""STT time after the end of the turn: whole-turn whisper against streaming STT's tail.

Each question is spoken by Piper (seeded), put between silences and fed in real time, 20 ms a
frame, through the Silero VAD; while it is in speech `StreamingStt` runs its partials on a
2-thread executor, as the agent's driver does. At the VAD's end of turn the streaming path's
`finish` is timed (the partial in flight, then the tail); then, with nothing else running,
the whole utterance is transcribed as the agent did before streaming. Prints JSON (seconds).

    .venv/bin/python bench/stt_streaming.py [--partial-ms 2000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np

from voxgate.agent.stt import STT_RATE, WhisperConfig, WhisperTranscriber
from voxgate.agent.stt_stream import StreamingStt, normalise
from voxgate.agent.vad import SpeechEnded, SpeechStarted, StreamingVad
from voxgate.audio import resample
from voxgate.bench.stats import machine, summary

QUESTIONS = (
    "What is the tallest mountain in the world?",
    "Can you tell me how far away the moon is?",
    "Please book a table for four people at seven tonight.",
    "How many legs does a spider have?",
    "What time does the train to London leave tomorrow morning?",
    "Who wrote the play Romeo and Juliet?",
    "Remind me to call my sister after lunch.",
    "What is the weather going to be like this weekend?",
    "How do I boil an egg so the yolk stays soft?",
    "Which planet in our solar system is the largest?",
)
FRAME = 320  # 20 ms at 16 kHz, as WebRTC delivers it


def speech(text: str) -> np.ndarray:
    from voxgate.engines.base import collect
    from voxgate.engines.piper import PiperEngine
    from voxgate.types import SynthesisRequest

    engine = speech.engine = getattr(speech, "engine", None) or PiperEngine()  # type: ignore[attr-defined]
    chunk = collect(engine, SynthesisRequest(text=text, voice=engine.voices()[0].id, seed=0))
    voice = 0.5 * resample(chunk.samples, chunk.sample_rate, STT_RATE)
    line = np.concatenate([np.zeros(STT_RATE // 2), voice, np.zeros(STT_RATE)]).astype(np.float32)
    return line + np.random.default_rng(7).normal(0.0, 0.003, line.size).astype(np.float32)


async def streamed(audio: np.ndarray, whisper: WhisperTranscriber, executor, partial_s: float) -> list[dict]:
    vad, stream, rows = StreamingVad(), None, []
    t0 = time.perf_counter()
    for i in range(0, audio.size, FRAME):
        await asyncio.sleep(max(0.0, t0 + (i + FRAME) / STT_RATE - time.perf_counter()))  # real time
        for event in vad.push(audio[i : i + FRAME]):
            if isinstance(event, SpeechStarted):
                stream = StreamingStt(whisper, executor, lambda lo, hi: audio[lo:hi], event.start_sample, partial_s)
            elif isinstance(event, SpeechEnded) and stream is not None:
                done = await stream.finish(event.end_sample)
                rows.append({"span": (event.start_sample, event.end_sample), "final": done})
                stream = None
        if stream is not None:
            voiced = vad.in_speech and vad.last_probability >= vad.segmenter.config.release
            stream.offer(i + FRAME, pause=not voiced)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partial-ms", type=float, default=2000.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    whisper = WhisperTranscriber(WhisperConfig(cpu_threads=2))
    whisper.warmup()
    executor = ThreadPoolExecutor(2)
    lines = [speech(q) for q in QUESTIONS]
    turns = []
    for _ in range(args.rounds):
        for question, audio in zip(QUESTIONS, lines, strict=True):
            for row in asyncio.run(streamed(audio, whisper, executor, args.partial_ms / 1000)):
                lo, hi = row["span"]
                whole = whisper.transcribe(audio[lo:hi], STT_RATE)
                final = row["final"]
                same = [normalise(w) for w in final.text.split()] == [normalise(w) for w in whole.text.split()]
                turns.append({"question": question, "audio_s": round(final.audio_s, 3),
                              "whole_s": round(whole.took_s, 3), "tail_s": round(final.tail_s, 3),
                              "tail_audio_s": round(final.tail_audio_s, 3), "early": final.early,
                              "partials": final.partials,
                              "committed_words": final.committed_words, "same_text": same,
                              "whole_text": whole.text, "streaming_text": final.text})  # fmt: skip
    result = {
        "command": " ".join(sys.argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "partial_ms": args.partial_ms,
        "whole_turn_s": summary([t["whole_s"] for t in turns]),
        "streaming_tail_s": summary([t["tail_s"] for t in turns]),
        "tail_audio_fraction_mean": round(statistics.mean(t["tail_audio_s"] / t["audio_s"] for t in turns), 3),
        "tail_decoded_in_the_pause": sum(t["early"] for t in turns),
        "same_text": sum(t["same_text"] for t in turns),
        "turns": turns,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
