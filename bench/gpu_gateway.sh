#!/bin/sh
# On the device machine (after bench/gpu_bundle.sh here, carrying .gpu): the WebSocket gateway
# on qwen3 (random-weight checkpoint, bf16, CUDA graphs), 64 sessions at 5 words/s, with and
# without the starter segment; then 64 concurrent HTTP /tts/stream.
# Usage: sh bench/gpu_gateway.sh [seed] [model]   (model default Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (results folder; default: packed into $OUT/results-TAG.tgz), SRC (the voxgate tree the server runs, default
# this one: e.g. an older commit's voxgate/ unpacked with `git archive`, for an A/B on one machine; the
# load client is always this tree's), STARTERS (starter_units values, default "3 0"), EXTRA
# (more server settings, KEY=VALUE without the VOXGATE_ prefix, e.g. "QWEN3_PROMPT_THREAD=true"),
# LOAD=0 / HTTP=0 (skip a part).
set -u
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; gpu_setup, wait_server, summary
SRC=${SRC:-$PWD}
gpu_setup || exit 1
QWEN="QWEN3_MODEL_DIR=/tmp/ckpt-$TAG-$SEED QWEN3_DEVICE=cuda QWEN3_DTYPE=bfloat16 ${EXTRA:-}"
if [ "${LOAD:-1}" = 1 ]; then
    (cd "$SRC" && exec env PYTHONPATH=$SRC $(for kv in $QWEN; do printf 'VOXGATE_%s ' $kv; done) \
        VOXGATE_ENGINE=qwen3 VOXGATE_MAX_STREAMS=64 VOXGATE_MAX_STREAMS_PER_CLIENT=64 \
        VOXGATE_MAX_SESSIONS_PER_CLIENT=64 VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_TIMINGS_KEPT=100000 \
        python3 -m voxgate serve --port 8765) > $RES/serve-$TAG.log 2>&1 &
    SERVER=$!
    wait_server $SERVER $RES/serve-$TAG.log || exit 1
    for su in ${STARTERS:-3 0}; do
        PYTHONPATH=$PWD python3 -m voxgate load --url ws://127.0.0.1:8765/v1/tts/ws --concurrency 64 --cps 5 \
            --duration 30 --starter-units $su --admin-key bench-admin \
            --output-json $RES/load-$TAG-starter$su.json > $RES/load-$TAG-starter$su.txt 2>&1
        tail -4 $RES/load-$TAG-starter$su.txt
    done
    kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
fi
if [ "${HTTP:-1}" = 1 ]; then
    (cd "$SRC" && PYTHONPATH=$SRC python3 -m voxgate bench http --engines qwen3 --n 64 --warmup 4 --concurrency 64 \
        $(for kv in $QWEN AGENT_MAX_CALLS=0; do printf -- '--set %s ' $kv; done) \
        --output-json $RES/http-$TAG.json) > $RES/http-$TAG.txt 2>&1
    tail -8 $RES/http-$TAG.txt
fi
