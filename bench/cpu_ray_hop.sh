#!/bin/sh
# The Ray hop on this machine (issue 21), tone engine: one `voxgate serve` process against
# `voxgate serve --replicas 1` (Ray Serve), each timed through its front door by
# `voxgate bench http --url` (N sequential requests, then a burst of BURST streams), the two
# alternated ROUNDS times while both are up (the same background load for both), with the
# load average before each run. One Ray cluster at a time; each is stopped before the next.
# Usage: sh bench/cpu_ray_hop.sh OUTDIR [VARIANT ...]
#   VARIANT: name[:ENV=VALUE,ENV=VALUE...] for both servers of that variant, e.g. base
#   grpc:RAY_SERVE_PROXY_USE_GRPC=1  before:TREE=/tmp/old (servers run from another voxgate tree:
#   cwd and PYTHONPATH, so Ray's workers import it too). A name may repeat (before after before
#   after: alternated); runs are numbered per name.
# Environment: ROUNDS (3), N (30), BURST (64), PY (.venv/bin/python).
set -u
OUTDIR=$1; shift
[ $# -gt 0 ] || set -- base
ROUNDS=${ROUNDS:-3}; N=${N:-30}; BURST=${BURST:-64}; PY=${PY:-$PWD/.venv/bin/python}
PLAIN_PORT=8792; RAY_PORT=8791
mkdir -p "$OUTDIR"
export VOXGATE_ENGINE=tone VOXGATE_ADMIN_KEYS=bench-admin VOXGATE_MAX_STREAMS=256 \
    VOXGATE_MAX_STREAMS_PER_CLIENT=256 VOXGATE_TIMINGS_KEPT=100000 VOXGATE_LLM_EMBEDDED=false
wait_url() {  # url pid log
    for i in $(seq 180); do
        curl -sf "$1" > /dev/null && return 0
        kill -0 $2 2>/dev/null || { echo "server exited"; tail -20 $3; return 1; }
        sleep 1
    done
    echo "not up after 180 s: $1"; return 1
}
bench() {  # port name
    echo "$(date +%T) $(cut -d' ' -f1-3 /proc/loadavg) $2" >> "$OUTDIR/loadavg.txt"
    $PY -m voxgate bench http --engines tone --url http://127.0.0.1:$1 --admin-key bench-admin --n $N \
        --warmup 4 --concurrency $BURST --output-json "$OUTDIR/$2.json" > "$OUTDIR/$2.txt" 2>&1
    echo "== $2 (load $(cut -d' ' -f1 /proc/loadavg))"; grep -E "^\| tone" "$OUTDIR/$2.txt" || tail -5 "$OUTDIR/$2.txt"
}
RAY=; PLAIN=
trap 'kill -TERM $RAY $PLAIN 2>/dev/null' EXIT INT TERM
for VARIANT in "$@"; do
    NAME=${VARIANT%%:*}
    ENVS=$(echo "$VARIANT" | sed -n 's/^[^:]*://p' | tr ',' ' ')
    TREE=$(echo " $ENVS" | sed -n 's/.* TREE=\([^ ]*\).*/\1/p')
    ENVS=$(echo " $ENVS" | sed 's/ TREE=[^ ]*//')
    DIR=$(cd "${TREE:-.}" && pwd)  # exec: $! is the server itself, which SIGTERM stops
    (cd "$DIR" && exec env PYTHONPATH="$DIR" $ENVS $PY -m voxgate serve --port $PLAIN_PORT > "$OUTDIR/plain-$NAME.log" 2>&1) &
    PLAIN=$!
    (cd "$DIR" && exec env PYTHONPATH="$DIR" $ENVS $PY -m voxgate serve --port $RAY_PORT --replicas 1 --ray-cpus 2 \
        > "$OUTDIR/ray-$NAME.log" 2>&1) &
    RAY=$!
    if wait_url http://127.0.0.1:$PLAIN_PORT/healthz $PLAIN "$OUTDIR/plain-$NAME.log" &&
        wait_url http://127.0.0.1:$RAY_PORT/readyz $RAY "$OUTDIR/ray-$NAME.log"; then
        for R in $(seq $ROUNDS); do
            RUN=$(( $(ls "$OUTDIR" | grep -c "^plain-$NAME-[0-9]*\.json$") + 1 ))
            bench $PLAIN_PORT plain-$NAME-$RUN
            bench $RAY_PORT ray-$NAME-$RUN
        done
    fi
    kill -TERM $RAY $PLAIN; wait $RAY $PLAIN 2>/dev/null  # the driver stops Serve and Ray (local.py)
    while curl -s -o /dev/null http://127.0.0.1:$RAY_PORT/ || curl -s -o /dev/null http://127.0.0.1:$PLAIN_PORT/; do
        sleep 1  # the next variant's servers need the ports
    done
done
$PY - "$OUTDIR" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "*-*-[0-9]*.json"))):
    name = os.path.basename(path)[:-5]
    side, variant, run = name.split("-", 2)[0], name.split("-")[1], name.rsplit("-", 1)[1]
    series = json.load(open(path))["results"]["tone"]
    burst = next(v for k, v in series.items() if k.startswith("concurrent_"))
    rows.setdefault(variant, {}).setdefault(side, []).append({
        "run": int(run),
        "one_client_p50": series["ten_words"]["client_ttfa_ms"]["p50"],
        "one_server_p50": series["ten_words"]["server_ttfa_ms"]["p50"],
        "starter_client_p50": series["starter_hit"]["client_ttfa_ms"]["p50"],
        "burst_client_p50": burst["client_ttfa_ms"]["p50"],
        "burst_server_p50": burst["server_ttfa_ms"]["p50"],
        "burst_audio_s_per_s": burst["audio_s_per_s"],
    })
summary = {}
for variant, sides in rows.items():
    med = {side: {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "run"} for side, runs in sides.items()}
    hop = {k: round(med["ray"][k] - med["plain"][k], 3) for k in med.get("ray", {}) if "p50" in k} if "ray" in med else {}
    summary[variant] = {"runs": sides, "median": med, "ray_minus_plain_ms": hop}
summary["loadavg_before_each_run"] = open(os.path.join(out, "loadavg.txt")).read().splitlines()
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
for variant, s in rows.items():
    s = summary[variant]
    print(variant, json.dumps(s["median"]), "hop", json.dumps(s["ray_minus_plain_ms"]))
PY
