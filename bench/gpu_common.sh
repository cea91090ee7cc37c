# Sourced by the bench/gpu_*.sh scripts on the device machine (after bench/gpu_bundle.sh here),
# with their arguments: [seed] [model] (default 11, Qwen3-TTS-12Hz-0.6B-CustomVoice).
SEED=${1:-11}
MODEL=${2:-Qwen3-TTS-12Hz-0.6B-CustomVoice}
TAG=$(echo $MODEL | sed 's/Qwen3-TTS-12Hz-//')
# RES: where the results go. Unset: a folder of this run, packed into $OUT/results-$TAG.tgz at exit
# (only 8 files come back from $OUT, and a run writes more); a later run of the same call (an A/B:
# `SRC=/tmp/old sh bench/gpu_gateway.sh; sh bench/gpu_gateway.sh`) packs into results-$TAG-2.tgz, ...
pack_results() {
    tgz=$OUT/results-$TAG.tgz n=1
    while [ -e "$tgz" ]; do n=$((n + 1)); tgz=$OUT/results-$TAG-$n.tgz; done
    tar -czf "$tgz" -C "$RES" . && echo "results: $tgz"
}
if [ -z "${RES:-}" ]; then
    RES=/tmp/results-$TAG-$$
    trap pack_results EXIT
    trap 'exit 143' TERM INT  # a `timeout` still packs what the run wrote
fi
# setup_bundle BUNDLE WHEELS: install the carried wheels (WHEELS/*.whl), write $RES/machine.txt,
# build the random-weight checkpoint /tmp/ckpt-$TAG-$SEED once from BUNDLE/qwen3-tts's configs
# (without voxgate's CLI, which a small bundle cannot import whole); fails if that build fails.
# gpu_setup: the same from .gpu/ (bench/gpu_bundle.sh), for a server.
# wait_server PID LOG: until /healthz answers on :8765, or the server has exited (then fail).
setup_bundle() {
    mkdir -p "$RES"
    python3 -m pip install -q --no-index --no-deps "$2"/*.whl 2>&1 | tail -2
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      python3 -c "import torch; print('torch', torch.__version__)"; echo "server tree: ${SRC:-$PWD}"; } > $RES/machine.txt
    [ -d /tmp/ckpt-$TAG-$SEED ] || PYTHONPATH=$PWD python3 -c "import sys; from pathlib import Path
from voxgate.engines.qwen3.checkpoint import make_random_checkpoint as make
print('wrote', make(sys.argv[1], Path(sys.argv[2]), seed=int(sys.argv[3]), config_root=Path(sys.argv[4])))" \
        $MODEL /tmp/ckpt-$TAG-$SEED $SEED "$1/qwen3-tts" > $RES/checkpoint-$TAG.txt 2>&1 \
        || { tail -20 $RES/checkpoint-$TAG.txt; return 1; }
}

gpu_setup() {
    export VOXGATE_LLM_EMBEDDED=false VOXGATE_AGENT_MAX_CALLS=0
    setup_bundle .gpu .gpu/wheels
}

wait_server() {
    for i in $(seq 400); do
        curl -sf localhost:8765/healthz > /dev/null && return 0
        kill -0 $1 2>/dev/null || { echo "server exited"; tail -30 $2; return 1; }
        sleep 1
    done
    echo "server not up after 400 s"; return 1
}

# summary JSON: one line from a `voxgate load` result (first audio, gateway-added, underruns, units).
summary() {
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])).get("results", {})
if r:
    t, g, u, n = r["ttfa_ms"]["all"], r["gateway_ttfa_ms"]["all"], r["underruns"], r["units"]
    print(f"first audio p50/p95 {t['p50']}/{t['p95']} ms, gateway-added {g['p50']}/{g['p95']} ms, "
          f"underruns {u['count']} ({u['total_ms']} ms), units sent {n['sent']} missing {n['missing']} dup {n['duplicate']}")
PY
}
