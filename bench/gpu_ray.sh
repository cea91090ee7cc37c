#!/bin/sh
# On a 2-GPU device machine (issue 21): voxgate on Ray Serve with qwen3, against one process.
# (1) one process on GPU 0, (2) Ray Serve with 1 replica, (3) Ray Serve with 2 replicas (a GPU
# each), each timed by `voxgate bench http --url` through its front door: one stream's TTFA (the
# Ray hop: (2) against (1)) and a burst of PER_REPLICA concurrent streams per replica, as
# throughput (audio-s/s: (3) against (2)).
# Wheels: .gpu/ (bench/gpu_bundle.sh) and RAY_DIR's .gpu-ray1..3 (bench/gpu_bundle_ray.sh's, carried
# by earlier calls on the same machine and copied outside the tree, default /tmp/carry).
# Usage: sh bench/gpu_ray.sh [seed] [model]
# Environment: RES (default: packed into $OUT/results-TAG.tgz), PER_REPLICA (64), N (sequential requests, 32), RUNS (default
# "plain hap1 hap2": one process, then 1 and 2 replicas behind Ray's HAProxy ingress, `voxgate serve
# --ingress haproxy`; "1" and "2" are 1 and 2 replicas behind Ray's own proxy, the default ingress).
# Then $RES/ray-$TAG-summary.json: the Ray hop (one stream's client TTFA p50 through Ray minus one
# process's) and the aggregate: the 2-replica burst's throughput (2 x PER_REPLICA streams) over one
# replica's (PER_REPLICA) and over one process's (target >= 1.9), from the runs present.
set -u
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; gpu_setup, wait_server
PER_REPLICA=${PER_REPLICA:-64}
N=${N:-32}
gpu_setup || exit 1
RUNS=${RUNS:-plain hap1 hap2}
if ! python3 -c "import ray" 2>/dev/null; then
    RAY_DIR=${RAY_DIR:-/tmp/carry}
    cat "$RAY_DIR"/.gpu-ray*/ray.part.* > "/tmp/$(cat "$RAY_DIR"/.gpu-ray1/ray.name)"
    python3 -m pip install -q --no-index --no-deps "$RAY_DIR"/.gpu-ray*/*.whl \
        "/tmp/$(cat "$RAY_DIR"/.gpu-ray1/ray.name)" 2>&1 | tail -2
fi
python3 -c "import ray; print('ray', ray.__version__)" | tee -a $RES/machine.txt
export VOXGATE_QWEN3_MODEL_DIR=/tmp/ckpt-$TAG-$SEED VOXGATE_QWEN3_DEVICE=cuda VOXGATE_QWEN3_DTYPE=bfloat16 \
    VOXGATE_ENGINE=qwen3 VOXGATE_MAX_STREAMS=256 VOXGATE_MAX_STREAMS_PER_CLIENT=256 \
    VOXGATE_QWEN3_MAX_STREAMS=$PER_REPLICA VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_TIMINGS_KEPT=100000 \
    VOXGATE_PORT=8765 PYTHONPATH=$PWD
wait_cluster() {  # until /cluster/readyz lists $1 ready replicas
    for i in $(seq 600); do
        curl -s localhost:8765/cluster/readyz 2>/dev/null | python3 -c "
import json, sys
body = json.load(sys.stdin)
sys.exit(0 if sum(r['ready'] for r in body['replicas'].values()) >= $1 else 1)" 2>/dev/null && return 0
        kill -0 $2 2>/dev/null || { echo "ray serve exited"; tail -40 $3; return 1; }
        sleep 1
    done
    echo "cluster not ready after 600 s"; return 1
}
bench() {  # name concurrency (the GPUs sampled every 200 ms meanwhile: both busy in a 2-replica burst?)
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -lms 200 \
        > $RES/smi-$TAG-$1.csv 2>/dev/null &
    SMI=$!
    python3 -m voxgate bench http --engines qwen3 --url http://127.0.0.1:8765 --admin-key bench-admin --n $N \
        --warmup 4 --concurrency $2 --output-json $RES/ray-$TAG-$1.json > $RES/ray-$TAG-$1.txt 2>&1
    kill $SMI 2>/dev/null
    echo "== $1"; grep -E "^\| qwen3" $RES/ray-$TAG-$1.txt || tail -20 $RES/ray-$TAG-$1.txt
}
if echo "$RUNS" | grep -qw plain; then
    CUDA_VISIBLE_DEVICES=0 python3 -m voxgate serve > $RES/serve-$TAG-plain.log 2>&1 &
    SERVER=$!
    wait_server $SERVER $RES/serve-$TAG-plain.log && bench plain $PER_REPLICA
    kill $SERVER; wait $SERVER 2>/dev/null
fi
for RUN in $(echo "$RUNS" | sed 's/plain//'); do  # 1, 2: Ray's proxy; hap1, hap2: Ray's HAProxy ingress
    R=${RUN#hap}; NAME=ray$RUN; HAP=0
    [ "$RUN" = "$R" ] || { NAME=hap$R; HAP=1; }
    INGRESS=proxy; [ $HAP = 1 ] && INGRESS=haproxy
    python3 -m voxgate serve --replicas $R --ingress $INGRESS > $RES/serve-$TAG-$NAME.log 2>&1 &
    SERVER=$!
    wait_cluster $R $SERVER $RES/serve-$TAG-$NAME.log && bench $NAME $((R * PER_REPLICA))
    curl -s localhost:8765/cluster/metrics | grep -E "^voxgate_(engine_streams_total|cluster)" > $RES/ray-$TAG-$NAME-metrics.txt
    kill -TERM $SERVER; wait $SERVER 2>/dev/null
    sleep 3
done
python3 - "$RES" "$TAG" <<'PY'
import json, os, sys
res, tag = sys.argv[1:]
runs = {}
for name in ("plain", "ray1", "ray2", "hap1", "hap2"):
    path = os.path.join(res, f"ray-{tag}-{name}.json")
    if os.path.exists(path):
        series = json.load(open(path))["results"]["qwen3"]
        burst = next(v for k, v in series.items() if k.startswith("concurrent_"))
        runs[name] = {"one_stream_client_ttfa_p50_ms": series["ten_words"]["client_ttfa_ms"]["p50"],
                      "one_stream_server_ttfa_p50_ms": series["ten_words"]["server_ttfa_ms"]["p50"],
                      "burst_streams": burst["concurrency"], "burst_audio_s_per_s": burst["audio_s_per_s"],
                      "burst_client_ttfa_p50_ms": burst["client_ttfa_ms"]["p50"],
                      "burst_stream_total_ms_p50_max": [burst.get("client_total_ms", {}).get(k) for k in ("p50", "max")],
                      "burst_wall_s": burst["wall_s"], "burst_client_procs": burst.get("client_procs")}
def ratio(a, b, key="burst_audio_s_per_s"):
    return round(runs[a][key] / runs[b][key], 3) if a in runs and b in runs and runs[b][key] else None
summary = {
    "runs": runs,
    "ray_hop_ms": {name: round(runs[name]["one_stream_client_ttfa_p50_ms"] - runs["plain"]["one_stream_client_ttfa_p50_ms"], 2)
                   for name in ("ray1", "ray2", "hap1", "hap2") if name in runs and "plain" in runs},
    "throughput_ratio_2_replicas_over_1": ratio("ray2", "ray1"),
    "throughput_ratio_2_replicas_over_one_process": ratio("ray2", "plain"),
    "throughput_ratio_1_replica_over_one_process": ratio("ray1", "plain"),
    "haproxy_throughput_ratio_2_replicas_over_1": ratio("hap2", "hap1"),
    "haproxy_throughput_ratio_2_replicas_over_one_process": ratio("hap2", "plain"),
    "haproxy_throughput_ratio_1_replica_over_one_process": ratio("hap1", "plain"),
}
json.dump(summary, open(os.path.join(res, f"ray-{tag}-summary.json"), "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
