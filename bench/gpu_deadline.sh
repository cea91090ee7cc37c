#!/bin/sh
# On the device machine (after bench/gpu_bundle.sh here, carrying .gpu): the deadline rule, A/B on
# one machine. For each lead in LEADS (VOXGATE_QWEN3_LEAD_MS; 0 = holding off) a fresh server with
# ROWS rows: its step profile, then `voxgate load` at each count in SESSIONS (5 words/s, starter
# segments), then the overload scenario (text 4x faster from twice the rows, then 8 probe sessions),
# and the runner's held-step counter from /metrics.
# Usage: sh bench/gpu_deadline.sh [seed] [model]   (model default Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (default: packed into $OUT/results-TAG.tgz), ROWS (128), LEADS ("1500 0"), SESSIONS ("64 128"), DURATION (20),
# OVERLOAD=0 (skip it), EXTRA (more server settings, KEY=VALUE without the VOXGATE_ prefix).
set -u
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; gpu_setup, wait_server, summary
ROWS=${ROWS:-128}
DURATION=${DURATION:-20}
gpu_setup || exit 1
LOAD="python3 -m voxgate load --url ws://127.0.0.1:8765/v1/tts/ws --starter-units 3 --admin-key bench-admin"
for LEAD in ${LEADS:-1500 0}; do
    NAME=$TAG-rows$ROWS-lead$LEAD
    env PYTHONPATH=$PWD VOXGATE_QWEN3_MODEL_DIR=/tmp/ckpt-$TAG-$SEED VOXGATE_QWEN3_DEVICE=cuda \
        VOXGATE_QWEN3_DTYPE=bfloat16 VOXGATE_QWEN3_MAX_STREAMS=$ROWS VOXGATE_QWEN3_LEAD_MS=$LEAD VOXGATE_ENGINE=qwen3 \
        VOXGATE_MAX_STREAMS=512 VOXGATE_MAX_STREAMS_PER_CLIENT=512 VOXGATE_MAX_SESSIONS_PER_CLIENT=512 \
        VOXGATE_WS_MAX_SESSIONS=1024 VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_TIMINGS_KEPT=100000 \
        $(for kv in ${EXTRA:-}; do printf 'VOXGATE_%s ' $kv; done) \
        python3 -m voxgate serve --port 8765 > $RES/serve-$NAME.log 2>&1 &
    SERVER=$!
    wait_server $SERVER $RES/serve-$NAME.log || exit 1
    echo "== lead $LEAD ms"; grep -E "step cost" $RES/serve-$NAME.log
    SLOTS=$(curl -s localhost:8765/healthz | python3 -c "import json,sys; print(json.load(sys.stdin)['stream_slots'])")
    for N in ${SESSIONS:-64 128}; do
        PYTHONPATH=$PWD $LOAD --concurrency $N --cps 5 --duration $DURATION \
            --output-json $RES/deadline-$NAME-$N.json > $RES/deadline-$NAME-$N.txt 2>&1
        echo "-- $N sessions"; summary $RES/deadline-$NAME-$N.json
    done
    if [ "${OVERLOAD:-1}" = 1 ]; then
        PYTHONPATH=$PWD $LOAD --scenario overload --concurrency $((SLOTS * 2)) --cps 20 --duration $DURATION \
            --probe-sessions 8 --probe-duration 10 --output-json $RES/deadline-$NAME-overload.json \
            > $RES/deadline-$NAME-overload.txt 2>&1
        echo "-- overload"; tail -12 $RES/deadline-$NAME-overload.txt
    fi
    curl -s localhost:8765/metrics | grep -E "stream_steps" | tee $RES/metrics-$NAME.txt
    kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
done
