#!/bin/sh
# On the device machine (after bench/gpu_bundle.sh here, carrying .gpu): where the server's time
# goes while the WebSocket gateway serves streamed text on qwen3. For each variant in VARIANTS a
# fresh server (ROWS rows) runs `voxgate load` (SESSIONS sessions at 5 words/s, DURATION s); the
# variant named `pyspy` runs the server under py-spy (sampling the threads that hold the GIL,
# without pausing it) and writes collapsed stacks to $RES/pyspy-*.txt. The server's /debug/timings
# after each run go to $RES/timings-*.json.
# A variant is NAME or NAME:KEY=VALUE,KEY=VALUE (server environment, full names; TREE=DIR runs
# the server from another voxgate tree, e.g. an older commit unpacked with `git archive`), e.g.
#   VARIANTS="old1:TREE=/tmp/old new1 old2:TREE=/tmp/old new2 pyspy"
# Usage: sh bench/gpu_profile.sh [seed] [model]; environment RES, ROWS (64), SESSIONS (64),
# DURATION (20), VARIANTS ("base pyspy"), SRC (the server's tree, default this one).
set -u
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; gpu_setup, wait_server, summary
ROWS=${ROWS:-64}
SESSIONS=${SESSIONS:-64}
DURATION=${DURATION:-20}
SRC=${SRC:-$PWD}
gpu_setup || exit 1
for VARIANT in ${VARIANTS:-base pyspy}; do
    NAME=${VARIANT%%:*}
    ENVS=$(echo "${VARIANT#$NAME}" | sed 's/^://; s/,/ /g')
    TREE=$SRC
    for kv in $ENVS; do case $kv in TREE=*) TREE=${kv#TREE=} ;; esac; done
    RUN="python3 -m voxgate serve --port 8765"
    [ "$NAME" = pyspy ] && RUN="py-spy record --gil --nonblocking --rate 250 --format raw --threads \
        -o $RES/pyspy-$TAG-$NAME.txt -- $RUN"
    (cd "$TREE" && exec env PYTHONPATH=$TREE VOXGATE_QWEN3_MODEL_DIR=/tmp/ckpt-$TAG-$SEED VOXGATE_QWEN3_DEVICE=cuda \
        VOXGATE_QWEN3_DTYPE=bfloat16 VOXGATE_QWEN3_MAX_STREAMS=$ROWS VOXGATE_ENGINE=qwen3 \
        VOXGATE_MAX_STREAMS=512 VOXGATE_MAX_STREAMS_PER_CLIENT=512 VOXGATE_MAX_SESSIONS_PER_CLIENT=512 \
        VOXGATE_WS_MAX_SESSIONS=1024 VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_TIMINGS_KEPT=100000 \
        VOXGATE_LLM_EMBEDDED=false VOXGATE_AGENT_MAX_CALLS=0 $ENVS $RUN) > $RES/serve-$TAG-$NAME.log 2>&1 &
    SERVER=$!
    wait_server $SERVER $RES/serve-$TAG-$NAME.log || exit 1
    PYTHONPATH=$PWD python3 -m voxgate load --url ws://127.0.0.1:8765/v1/tts/ws --starter-units 3 \
        --admin-key bench-admin --concurrency $SESSIONS --cps 5 --duration $DURATION \
        --output-json $RES/profile-$TAG-$NAME.json > $RES/profile-$TAG-$NAME.txt 2>&1
    echo "== $VARIANT"; summary $RES/profile-$TAG-$NAME.json
    grep -E "^(server, |engine stage)" $RES/profile-$TAG-$NAME.txt
    curl -s localhost:8765/metrics | grep -E "^voxgate_engine_streams" > $RES/metrics-$TAG-$NAME.txt
    curl -s -H "Authorization: Bearer bench-admin" "localhost:8765/debug/timings?last=100000" \
        > $RES/timings-$TAG-$NAME.json  # at_ms and first_step: how the burst queued and was grouped
    grep -E "steps_launched_gpu_idle|name=\"steps\"" $RES/metrics-$TAG-$NAME.txt
    kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null
    pkill -f "voxgate serve --port 8765" 2>/dev/null; sleep 2
done
