#!/bin/sh
# On the device machine (after bench/gpu_bundle.sh here, carrying .gpu): the WebSocket gateway
# on qwen3 (random 0.6B-CustomVoice, bf16, CUDA graphs), 64 sessions at 5 words/s, with and
# without the starter segment; results under $OUT. Usage: sh bench/gpu_gateway.sh [seed]
set -u
SEED=${1:-11}
python3 -m pip install -q --no-index --no-deps .gpu/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD VOXGATE_LLM_EMBEDDED=false VOXGATE_AGENT_MAX_CALLS=0
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } > $OUT/machine.txt
python3 -m voxgate make-random-checkpoint --configs .gpu/qwen3-tts --model Qwen3-TTS-12Hz-0.6B-CustomVoice --out /tmp/cv06 --seed $SEED > $OUT/checkpoint.txt 2>&1 || exit 1
VOXGATE_ENGINE=qwen3 VOXGATE_QWEN3_MODEL_DIR=/tmp/cv06 VOXGATE_QWEN3_DEVICE=cuda VOXGATE_QWEN3_DTYPE=bfloat16 \
VOXGATE_MAX_STREAMS=64 VOXGATE_MAX_STREAMS_PER_CLIENT=64 VOXGATE_MAX_SESSIONS_PER_CLIENT=64 \
    python3 -m voxgate serve --port 8765 > $OUT/serve.log 2>&1 &
SERVER=$!
for i in $(seq 300); do
    curl -sf localhost:8765/healthz > /dev/null && break
    kill -0 $SERVER 2>/dev/null || { echo "server exited"; tail -30 $OUT/serve.log; exit 1; }
    sleep 1
done
curl -s localhost:8765/healthz > $OUT/healthz.json
for su in 3 0; do
    python3 -m voxgate load --url ws://127.0.0.1:8765/v1/tts/ws --concurrency 64 --cps 5 --duration 30 \
        --starter-units $su --output-json $OUT/load-starter$su.json > $OUT/load-starter$su.txt 2>&1
done
kill $SERVER
