#!/bin/sh
# On the device machine (after bench/gpu_bundle.sh here, carrying .gpu): qwen3 with ROWS batch
# rows (default 128) behind the WebSocket gateway; the engine's own capacity estimate (its step
# cost by bucket, /healthz stream_slots), then `voxgate load --find-capacity` (5 words/s,
# starter segments) and `--scenario overload` (text 4x faster, twice the estimate, then a probe).
# Usage: sh bench/gpu_admission.sh [seed] [model]   (model default Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (results folder; default: packed into $OUT/results-TAG.tgz), ROWS, KV (qwen3_kv_capacity, default 2048),
# CAPACITY=0 / OVERLOAD=0 (skip a part), DURATION (seconds of text a round, default 15), START,
# CAPMAX, GROWTH, UNDERRUN_MS (the search: from 64 sessions, at most the engine's estimate,
# doubling, no underrun allowed), UNDERRUNS (which fail a round: all, or text-in-hand; `voxgate load --underruns`),
# EXTRA (more server settings, KEY=VALUE without the VOXGATE_ prefix).
set -u
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; gpu_setup, wait_server, summary
ROWS=${ROWS:-128}
DURATION=${DURATION:-15}
gpu_setup || exit 1
env PYTHONPATH=$PWD VOXGATE_QWEN3_MODEL_DIR=/tmp/ckpt-$TAG-$SEED VOXGATE_QWEN3_DEVICE=cuda VOXGATE_QWEN3_DTYPE=bfloat16 \
    VOXGATE_QWEN3_MAX_STREAMS=$ROWS VOXGATE_QWEN3_KV_CAPACITY=${KV:-2048} VOXGATE_ENGINE=qwen3 \
    VOXGATE_MAX_STREAMS=512 VOXGATE_MAX_STREAMS_PER_CLIENT=512 VOXGATE_MAX_SESSIONS_PER_CLIENT=512 \
    VOXGATE_WS_MAX_SESSIONS=1024 VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_TIMINGS_KEPT=100000 \
    $(for kv in ${EXTRA:-}; do printf 'VOXGATE_%s ' $kv; done) \
    python3 -m voxgate serve --port 8765 > $RES/serve-$TAG-rows$ROWS.log 2>&1 &
SERVER=$!
wait_server $SERVER $RES/serve-$TAG-rows$ROWS.log || exit 1
curl -s localhost:8765/healthz > $RES/healthz-rows$ROWS.json
grep -E "captured|step cost" $RES/serve-$TAG-rows$ROWS.log
cat $RES/healthz-rows$ROWS.json; echo
SLOTS=$(python3 -c "import json; print(json.load(open('$RES/healthz-rows$ROWS.json'))['stream_slots'])")
LOAD="python3 -m voxgate load --url ws://127.0.0.1:8765/v1/tts/ws --starter-units 3 --admin-key bench-admin"
if [ "${CAPACITY:-1}" = 1 ]; then
    PYTHONPATH=$PWD $LOAD --find-capacity --concurrency ${START:-64} --capacity-max ${CAPMAX:-$SLOTS} --capacity-growth ${GROWTH:-2} --max-underrun-ms ${UNDERRUN_MS:-0} \
        --underruns ${UNDERRUNS:-all} --cps 5 \
        --duration $DURATION --output-json $RES/capacity-$TAG-rows$ROWS.json > $RES/capacity-$TAG-rows$ROWS.txt 2>&1
    grep "\[capacity\]" $RES/capacity-$TAG-rows$ROWS.txt; tail -3 $RES/capacity-$TAG-rows$ROWS.txt
fi
if [ "${OVERLOAD:-1}" = 1 ]; then
    PYTHONPATH=$PWD $LOAD --scenario overload --concurrency $((SLOTS * 2)) --cps 20 --duration $DURATION \
        --probe-sessions 8 --probe-duration 10 --output-json $RES/overload-$TAG-rows$ROWS.json \
        > $RES/overload-$TAG-rows$ROWS.txt 2>&1
    tail -12 $RES/overload-$TAG-rows$ROWS.txt
fi
curl -s localhost:8765/metrics | grep -E "^voxgate_(stream_slots|active_streams|streams_waiting|errors_total|engine_streams_total)" > $RES/metrics-rows$ROWS.txt
kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
