"""Command line: voxgate serve | say | voices | chat | bench | load | agent | agent-bot | protocol-schema |
make-random-checkpoint | download | regress."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxgate import __version__

if TYPE_CHECKING:  # the CLI imports each command's needs lazily (bench tts runs without the server's)
    from pydantic import ValidationError

    from voxgate.config import Settings


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    """Settings from the environment, with command-line flags taking precedence; an
    unknown engine name is refused here, before anything starts."""
    from voxgate.config import Settings
    from voxgate.engines.registry import engine_names
    from voxgate.types import UnknownEngine

    overrides = {k: v for k, v in extra.items() if v is not None}
    for name in ("host", "port", "engine", "log_level"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    settings = Settings(**overrides)
    if settings.engine not in engine_names():
        raise UnknownEngine(f"no engine named {settings.engine!r}; available: {', '.join(engine_names())}")
    return settings


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def cmd_serve(args: argparse.Namespace) -> int:
    if not args.replicas and (args.ingress or args.max_replicas or args.ray_cpus):
        raise SystemExit("voxgate serve: --ingress, --max-replicas and --ray-cpus need --replicas N")
    import uvicorn

    from voxgate.runtime import loop_name, set_switch_interval
    from voxgate.serving.app import create_app
    from voxgate.serving.auth import redact_secrets
    from voxgate.serving.lifecycle import drain
    from voxgate.serving.transport import quiet_client_faults, uvicorn_config

    settings = _settings(args, warmup=False if args.no_warmup else None)
    _logging(settings.log_level)
    if args.replicas:
        from voxgate.cluster.local import run_local

        return run_local(settings, args.replicas, args.max_replicas, args.ray_cpus, args.ingress)
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        server.should_exit = True

    set_switch_interval(settings.gil_switch_ms)
    app = create_app(settings, on_fatal=on_fatal, settle_heap_when_ready=settings.gc_freeze)

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.servers:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                print(
                    f"voxgate {__version__} serving on http://{host}:{port}  (engine={settings.engine}, "
                    f"loop={loop_name()}; "
                    f"warming up, GET /healthz says when ready; Ctrl-C stops)",
                    flush=True,
                )

        async def shutdown(self, sockets: Any = None) -> None:
            """Drain first, with the listener still open: new sessions get `server_draining`
            and /readyz 503 while running ones finish (a second Ctrl-C cuts it short)."""
            await drain(app.state, settings.drain_s, lambda: self.force_exit)
            await super().shutdown(sockets)

    config = uvicorn_config(app, settings, access_log=args.access_log)
    redact_secrets()  # after uvicorn set up its loggers: no key or token in a log line
    quiet_client_faults()
    server = Server(config)
    server.run()
    if fatal:
        print(f"voxgate: error: start-up failed: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


def cmd_say(args: argparse.Namespace) -> int:
    import numpy as np

    from voxgate.audio import check_output, resample, wav_bytes
    from voxgate.engines.base import check_request, stream_pieces
    from voxgate.engines.registry import create_engine
    from voxgate.text import check_text
    from voxgate.types import CancelToken, SynthesisRequest

    settings = _settings(args)
    _logging(settings.log_level if args.verbose else "warning")
    check_text(args.text, settings.max_text_chars)
    fmt = _format_of(args.output)
    engine = create_engine(settings.engine, settings)
    voice = args.voice or settings.default_voice or engine.voices()[0].id
    rate = check_output(fmt, args.sample_rate, engine.sample_rate, formats=_SAY_FORMATS)
    request = SynthesisRequest(text=args.text, voice=voice, speed=args.speed)
    check_request(engine, request)
    t0 = time.perf_counter()
    parts, first = [], None
    for chunk in stream_pieces(engine, request, CancelToken(), settings.max_piece_chars):
        first = first or chunk.t_ready - t0
        parts.append(chunk.samples)
    elapsed = time.perf_counter() - t0
    samples = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if fmt == "wav":
        data = wav_bytes(resample(samples, engine.sample_rate, rate), rate)
    else:
        from voxgate.audio_encode import CompressedEncoder

        encoder = CompressedEncoder(fmt, engine.sample_rate, rate)
        data = encoder.encode(samples) + encoder.flush()
    Path(args.output).write_bytes(data)
    duration = len(samples) / engine.sample_rate
    print(
        f"wrote {args.output}: {duration:.2f} s at {rate} Hz (engine={engine.name}, voice={voice}; "
        f"first chunk {1000 * (first or 0):.0f} ms, total {elapsed:.2f} s, RTF {elapsed / max(duration, 1e-9):.3f})"
    )
    return 0


_SAY_FORMATS = ("wav", "mp3", "opus", "aac", "flac")
_EXTENSIONS = {"wav": "wav", "mp3": "mp3", "opus": "opus", "ogg": "opus", "aac": "aac", "flac": "flac"}


def _format_of(path: str) -> str:
    """`voxgate say`'s output format, from the file's extension (a file is what its name says)."""
    from voxgate.types import UnsupportedFormat

    fmt = _EXTENSIONS.get(Path(path).suffix.lower().lstrip("."))
    if fmt is None:
        names = ", ".join(f".{ext}" for ext in _EXTENSIONS)
        raise UnsupportedFormat(f"cannot tell the audio format of {path!r} from its extension; use one of {names}")
    return fmt


def cmd_voices(args: argparse.Namespace) -> int:
    from voxgate.engines.registry import create_engine

    settings = _settings(args)
    engine = create_engine(settings.engine, settings)
    for i, voice in enumerate(engine.voices()):
        default = "  (default)" if i == 0 else ""
        print(f"{voice.id}\t{','.join(voice.languages)}\t{voice.description}{default}")
    return 0


def cmd_bench_http(args: argparse.Namespace) -> int:
    from voxgate.bench.http import run_http_bench

    return run_http_bench(args)


def cmd_bench_tts(args: argparse.Namespace) -> int:
    from voxgate.bench.tts import run_tts_bench

    return run_tts_bench(args)


def cmd_bench_bridge(args: argparse.Namespace) -> int:
    from voxgate.bench.bridge import run_bridge_bench

    return run_bridge_bench(args)


def cmd_bench_segmenter(args: argparse.Namespace) -> int:
    from voxgate.bench.segmenter import run_segmenter_bench

    return run_segmenter_bench(args)


def cmd_bench_agent(args: argparse.Namespace) -> int:
    from voxgate.bench.agent import run_agent_bench

    return run_agent_bench(args)


def cmd_bench_abuse(args: argparse.Namespace) -> int:
    from voxgate.bench.abuse import run_abuse_bench

    return run_abuse_bench(args)


def cmd_bench_parity(args: argparse.Namespace) -> int:
    from voxgate.bench.parity import run_parity_bench

    return run_parity_bench(args)


def cmd_bench_page(args: argparse.Namespace) -> int:
    from voxgate.bench.page import run_page_bench

    return run_page_bench(args)


def cmd_bench_vad_stt(args: argparse.Namespace) -> int:
    from voxgate.bench.vad_stt import run_vad_stt_bench

    return run_vad_stt_bench(args)


def cmd_agent(args: argparse.Namespace) -> int:
    import json

    from voxgate.agent.report import format_table, read_traces, summarise
    from voxgate.config import Settings

    hangover = args.hangover_ms if args.hangover_ms is not None else Settings().agent_vad_hangover_ms
    turns, files = read_traces(Path(args.report))
    report = summarise(turns, hangover_ms=hangover, files=files)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print(format_table(report))
    return 0


def cmd_agent_bot(args: argparse.Namespace) -> int:
    from voxgate.agent.bot import run_agent_bot

    return run_agent_bot(args)


def cmd_chat(args: argparse.Namespace) -> int:
    from voxgate.bridge.chat import run_chat

    return run_chat(args)


def cmd_load(args: argparse.Namespace) -> int:
    from voxgate.bench.load import run_load

    return run_load(args)


def cmd_protocol_schema(args: argparse.Namespace) -> int:
    import json

    from voxgate.serving.wsproto import schema

    print(json.dumps(schema(), indent=2, sort_keys=True))
    return 0


def cmd_make_random_checkpoint(args: argparse.Namespace) -> int:
    from voxgate.engines.qwen3.checkpoint import make_random_checkpoint

    _logging("info")
    started = time.perf_counter()
    config_root = Path(args.configs) if args.configs else None
    out = make_random_checkpoint(args.model, Path(args.out), tiny=args.tiny, seed=args.seed, config_root=config_root)
    print(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from voxgate.types import NotSupported

    try:
        from voxgate.engines.qwen3.hub import resolve_model
    except ImportError as exc:  # huggingface_hub comes with the qwen3 extra
        raise NotSupported(f"voxgate download needs the qwen3 extra (pip install 'voxgate[qwen3]'): {exc}") from exc
    # huggingface_hub draws its own progress bars and retry warnings on stderr; stdout carries the path only
    print(resolve_model(args.model, args.revision, cache_dir=args.cache_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxgate", description="Real-time voice stack.")
    parser.add_argument("--version", action="version", version=f"voxgate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server (settings: VOXGATE_* environment variables)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000; 0 = any free port)")
    serve.add_argument("--engine", help="engine: piper (default) or tone")
    serve.add_argument("--log-level", dest="log_level", help="debug | info | warning | error")
    serve.add_argument("--no-warmup", action="store_true", help="skip the engine warm-up synthesis")
    serve.add_argument("--access-log", action="store_true", help="log every HTTP request")
    serve.add_argument("--replicas", type=int, help="run N replicas on a local Ray Serve (needs voxgate[ray])")
    serve.add_argument("--max-replicas", type=int, help="with --replicas: autoscale up to this many on active streams")
    serve.add_argument("--ray-cpus", type=int, help="with --replicas: CPUs the local Ray may use (default: all)")
    serve.add_argument(
        "--ingress",
        choices=("proxy", "haproxy"),
        default=None,
        help="with --replicas: Ray's proxy (default: routes by ?session= or the X-Voxgate-Session header, "
        "key-less requests to the less loaded replica) or Ray's HAProxy ingress (about 8 ms less first audio "
        "and no throughput lost on a GPU; routes by ?session= only). RAY_SERVE_ENABLE_HA_PROXY=1 also picks haproxy",
    )
    serve.set_defaults(func=cmd_serve)

    say = sub.add_parser("say", help="synthesise text to an audio file")
    say.add_argument("text")
    say.add_argument(
        "-o", "--output", default="out.wav",
        help="file to write, encoded as its extension says: .wav, .mp3, .opus/.ogg, .aac, .flac (default out.wav)",
    )  # fmt: skip
    say.add_argument("--engine", help="engine name (default from VOXGATE_ENGINE, else piper)")
    say.add_argument("--voice", help="voice id (default: the engine's first voice)")
    say.add_argument("--speed", type=float, default=1.0, help="speaking rate, 0.25-4.0")
    say.add_argument("--sample-rate", type=int, help="output rate (default: the engine's)")
    say.add_argument("-v", "--verbose", action="store_true")
    say.set_defaults(func=cmd_say)

    voices = sub.add_parser("voices", help="list the voices of an engine")
    voices.add_argument("--engine", help="engine name")
    voices.set_defaults(func=cmd_voices)

    bench = sub.add_parser("bench", help="benchmarks that write JSON").add_subparsers(dest="bench", required=True)
    from voxgate.bench.http import add_arguments

    http = bench.add_parser("http", help="TTFA and RTF of the HTTP server (spawns servers on loopback)")
    add_arguments(http)
    http.set_defaults(func=cmd_bench_http)
    from voxgate.bench.tts import add_arguments as add_tts_arguments

    tts = bench.add_parser("tts", help="qwen3 per-frame cost, TTFA and RTF for a checkpoint")
    add_tts_arguments(tts)
    tts.set_defaults(func=cmd_bench_tts)

    from voxgate.bench.bridge import add_arguments as add_bridge_arguments

    bridge = bench.add_parser("bridge", help="LLM-to-speech bridge: first audio vs LLM first token, cancel->silence")
    add_bridge_arguments(bridge)
    bridge.set_defaults(func=cmd_bench_bridge)

    from voxgate.bench.agent import add_arguments as add_agent_arguments

    agent = bench.add_parser("agent", help="voice-agent turns over a WebRTC call: end of turn -> first audio")
    add_agent_arguments(agent)
    agent.set_defaults(func=cmd_bench_agent)

    from voxgate.bench.page import add_arguments as add_page_arguments

    page = bench.add_parser("page", help="the voice agent's page in a headless Chromium: one spoken call, checked")
    add_page_arguments(page)
    page.set_defaults(func=cmd_bench_page)

    from voxgate.bench.abuse import add_arguments as add_abuse_arguments

    abuse = bench.add_parser("abuse", help="one client's floods vs another client's /healthz, audio and server memory")
    add_abuse_arguments(abuse)
    abuse.set_defaults(func=cmd_bench_abuse)

    from voxgate.bench.vad_stt import add_arguments as add_vad_stt_arguments

    vad_stt = bench.add_parser("vad-stt", help="Silero VAD ms per window and whisper tiny.en RTF on this machine")
    add_vad_stt_arguments(vad_stt)
    vad_stt.set_defaults(func=cmd_bench_vad_stt)

    from voxgate.bench.segmenter import add_arguments as add_segmenter_arguments

    segmenter = bench.add_parser(
        "segmenter", help="segmenter quality on the written and generated corpora, us per piece"
    )
    add_segmenter_arguments(segmenter)
    segmenter.set_defaults(func=cmd_bench_segmenter)

    from voxgate.bench.parity import add_arguments as add_parity_arguments

    parity = bench.add_parser("parity", help="qwen3 bf16 production path vs the official fp32 (teacher-forced KL, SNR)")
    add_parity_arguments(parity)
    parity.set_defaults(func=cmd_bench_parity)

    from voxgate.bench.load import add_arguments as add_load_arguments

    load = sub.add_parser("load", help="WebSocket gateway load test with fault injection (a running server)")
    add_load_arguments(load)
    load.set_defaults(func=cmd_load)

    from voxgate.bridge.chat import add_arguments as add_chat_arguments

    chat = sub.add_parser("chat", help="talk to a running server's LLM bridge; replies are spoken as they are written")
    add_chat_arguments(chat)
    chat.set_defaults(func=cmd_chat)

    from voxgate.agent.bot import add_arguments as add_agent_bot_arguments

    agent_bot = sub.add_parser("agent-bot", help="join a voice-agent call as the user: say a WAV, record the reply")
    add_agent_bot_arguments(agent_bot)
    agent_bot.set_defaults(func=cmd_agent_bot)

    agent = sub.add_parser("agent", help="the voice agent's latency breakdown from its trace files")
    agent.add_argument("--report", required=True, metavar="PATH", help="a call's trace JSONL, or a directory of them")
    agent.add_argument("--json", metavar="FILE", help="also write the report as JSON here")
    agent.add_argument("--hangover-ms", type=float, help="VAD hangover shown (default: the setting)")
    agent.set_defaults(func=cmd_agent)

    schema = sub.add_parser("protocol-schema", help="JSON schema of the WebSocket protocol's client messages")
    schema.set_defaults(func=cmd_protocol_schema)

    from voxgate.engines.qwen3.config import MODELS  # no torch: the CLI starts fast

    mrc = sub.add_parser("make-random-checkpoint", help="random-weight Qwen3-TTS checkpoint in the official layout")
    mrc.add_argument("--model", required=True, choices=MODELS)
    mrc.add_argument("--out", required=True, help="directory to write")
    mrc.add_argument("--tiny", action="store_true", help="shrink layers and widths for fast CPU tests")
    mrc.add_argument("--seed", type=int, default=0)
    mrc.add_argument("--configs", help="folder with the official configs (default ../shared/qwen3-tts)")
    mrc.set_defaults(func=cmd_make_random_checkpoint)

    download = sub.add_parser(
        "download", help="fetch a Qwen3-TTS checkpoint from the Hugging Face Hub into its cache; prints its path"
    )
    download.add_argument("model", help="Hugging Face model id, e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    download.add_argument("--revision", help="branch, tag or commit (default: main)")
    download.add_argument("--cache-dir", help="cache to use (default: HF_HUB_CACHE, else HF_HOME/hub)")
    download.set_defaults(func=cmd_download)

    names = argparse.ArgumentParser().add_subparsers()
    _add_regress_commands(names)  # the help lists the commands there are
    about = f"regression gates and golden baselines: {', '.join(names.choices)}"
    regress = sub.add_parser("regress", help=about, description=about)
    _add_regress_commands(regress.add_subparsers(dest="regress", required=True))
    return parser


def _add_regress_commands(commands: Any) -> None:
    from voxgate.regress.cli import add_regress_commands
    from voxgate.regress.e2e.command import add_e2e_commands

    add_regress_commands(commands)
    add_e2e_commands(commands)


def main(argv: list[str] | None = None) -> int:
    """Run a command; what the user can fix (bad input, invalid settings, a path that cannot be
    read or written) is one line, `voxgate: error: <code>: <message>`, and exit status 2."""
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    from voxgate.types import VoxgateError

    try:
        return int(args.func(args))
    except VoxgateError as exc:
        return _fail(str(exc))
    except ValidationError as exc:
        if exc.title != "Settings":  # another model's: a bug, with its traceback
            raise
        return _fail(f"invalid_settings: {_describe_settings(exc)}")
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        return _fail(f"os_error: {exc.strerror or exc}{where}")
    except KeyboardInterrupt:
        return 130


def _fail(line: str) -> int:
    print(f"voxgate: error: {line}", file=sys.stderr)
    return 2


def _describe_settings(exc: ValidationError) -> str:
    """A settings `ValidationError` as `name (VOXGATE_NAME): problem; ...`: the setting may come
    from the environment or from a flag, so the variable is named (a check across settings has
    no one name)."""
    parts = []
    for err in exc.errors():
        name = str(err["loc"][0]) if err["loc"] else ""
        parts.append(f"{name} (VOXGATE_{name.upper()}): {err['msg']}" if name else err["msg"])
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
