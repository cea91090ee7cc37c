"""The voice agent as the server runs it: each WebRTC call (`serving/agent_http.py`) gets a
`CallDriver` with its own VAD, turn detector and controller; the transcriber (whisper, loaded
once on the first call, or an OpenAI-compatible STT server), the turn model (Smart Turn, loaded
once; if it is not installed the VAD alone ends turns), the engine and the LLM are shared.
Settings: `VOXGATE_AGENT_*`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from voxgate.agent.controller import ControllerConfig
from voxgate.agent.driver import AgentConfig, CallDriver
from voxgate.agent.host import AgentHost
from voxgate.agent.stt import HttpSttConfig, HttpTranscriber, Transcriber, WhisperConfig, WhisperTranscriber
from voxgate.agent.turn import SmartTurnModel, TurnConfig, TurnDetector, TurnModelMissing
from voxgate.agent.vad import VAD_RATE, StreamingVad, VadConfig
from voxgate.agent.webrtc import PeerSession

log = logging.getLogger(__name__)


class AgentService:
    """`await service(session, call_id)` runs one call until the peer hangs up."""

    def __init__(self, state: AgentHost) -> None:
        self.state = state
        self._transcriber: Transcriber | None = None
        self._turn_model: SmartTurnModel | None = None
        self._turn_model_tried = False
        self._lock = threading.Lock()
        self.drivers: dict[str, CallDriver] = {}

    def transcriber(self) -> Transcriber:
        with self._lock:  # loaded once, on a worker thread, by the first call
            if self._transcriber is None:
                s = self.state.settings
                if s.agent_stt_url:
                    self._transcriber = HttpTranscriber(HttpSttConfig(s.agent_stt_url))
                else:
                    whisper = WhisperTranscriber(WhisperConfig(
                        model=s.agent_whisper_model, device=s.agent_whisper_device,
                        compute_type=s.agent_whisper_compute_type, cpu_threads=s.agent_whisper_threads,
                        fallback=s.agent_whisper_fallback))  # fmt: skip
                    whisper.warmup()
                    self._transcriber = whisper
            return self._transcriber

    def turn_model(self) -> SmartTurnModel | None:
        """The shared turn model, loaded on the first call; None (said once) when it is off or missing."""
        with self._lock:
            s = self.state.settings
            if not self._turn_model_tried and s.agent_turn_model:
                self._turn_model_tried = True
                try:
                    self._turn_model = SmartTurnModel(s.agent_turn_model_path, threads=s.agent_turn_threads)
                    log.info("turn model %s on the CPU (%d threads)", self._turn_model.path.name, s.agent_turn_threads)
                except TurnModelMissing as exc:
                    log.warning("voice agent: %s; the VAD alone ends turns", exc.message)
            return self._turn_model

    def turn_detector(self, model: SmartTurnModel | None) -> TurnDetector | None:
        s = self.state.settings
        if model is None:
            return None
        config = TurnConfig(threshold=s.agent_turn_threshold, max_silence_ms=s.agent_turn_max_silence_ms)
        return TurnDetector(model, config, executor=self.state.executor)  # ~100 ms a call: off the loop

    async def __call__(self, session: PeerSession, call_id: str, client: str | None = None) -> None:
        """`client`: the caller's identity for the limits (the API key's index, else the address)."""
        s = self.state.settings
        loop = asyncio.get_running_loop()
        transcriber = await loop.run_in_executor(self.state.executor, self.transcriber)
        turn = self.turn_detector(await loop.run_in_executor(self.state.executor, self.turn_model))
        vad = StreamingVad(VadConfig(hangover_ms=s.agent_vad_hangover_ms, min_speech_ms=s.agent_min_speech_ms),
                           input_rate=VAD_RATE, turn=turn)  # fmt: skip
        trace_file = s.agent_trace_dir / f"{call_id}.jsonl" if s.agent_trace_dir else None
        if trace_file is not None:
            trace_file.parent.mkdir(parents=True, exist_ok=True)
        config = AgentConfig(system=s.agent_system_prompt, max_tokens=s.agent_max_tokens, trace_file=trace_file,
                             history_chars=self.state.history_chars(), capture_dir=s.agent_capture_dir,
                             stt_streaming=s.agent_stt_streaming,
                             stt_partial_s=s.agent_stt_partial_ms / 1000)  # fmt: skip
        controller = ControllerConfig(min_interruption_s=s.agent_min_interruption_ms / 1000,
                                      confirm_after_s=s.agent_confirm_after_ms / 1000,
                                      opener_hold_s=s.agent_opener_hold_ms / 1000,
                                      min_gap_s=s.agent_min_gap_ms / 1000,
                                      question_gap_s=s.agent_question_gap_ms / 1000, detail_events=True)  # fmt: skip
        driver = CallDriver(self.state, call_id, session.outbound, session, transcriber, vad, config, controller,
                            client=client)  # fmt: skip
        self.drivers[call_id] = driver
        session.on_message(lambda m: m.get("type") == "hangup" and asyncio.ensure_future(session.close()))
        # The hangover is a fixed wait before each end of turn, not in the traces: the page adds it.
        session.send_event({"type": "call.started", "call_id": call_id, "vad_hangover_ms": s.agent_vad_hangover_ms})
        try:
            if session.inbound is None:
                await session.closed.wait()
                return
            run = asyncio.ensure_future(driver.run(session.inbound))
            closed = asyncio.ensure_future(session.closed.wait())
            await asyncio.wait((run, closed), return_when=asyncio.FIRST_COMPLETED)
            for task in (run, closed):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        finally:
            self.drivers.pop(call_id, None)
            log.info("call %s ended: %d turns", call_id, len(driver.traces))
