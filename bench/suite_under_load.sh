#!/bin/sh
# The README's test command from N fresh clones in a row, beside `stress-ng --cpu 2` (issue 16:
# the suite must pass on a busy 2-core machine). Clones go beside this checkout (tests/model
# reads ../shared/qwen3-tts). Usage: bench/suite_under_load.sh [runs=5]; a line per run in
# ../suite-under-load.log: commit, exit status, seconds, load average, pytest's summary line.
set -u
RUNS=${1:-5}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PARENT=$(dirname "$HERE")
LOG=$PARENT/suite-under-load.log
command -v stress-ng > /dev/null || { echo "needs stress-ng (apt-get install stress-ng)"; exit 2; }
stress-ng --cpu 2 --timeout 0 > /dev/null 2>&1 &
STRESS=$!
trap 'kill $STRESS 2> /dev/null' EXIT
COMMIT=$(git -C "$HERE" rev-parse HEAD)  # every run tests this commit, even if HEAD moves meanwhile
echo "$(date -u +%FT%TZ) stress-ng --cpu 2 beside $RUNS runs of $(git -C "$HERE" rev-parse --short HEAD)" >> "$LOG"
i=1
while [ $i -le "$RUNS" ]; do
    DIR=$PARENT/suite-check-$i
    rm -rf "$DIR" && git clone -q "$HERE" "$DIR" && git -C "$DIR" checkout -q "$COMMIT"
    start=$(date +%s)
    (cd "$DIR" && make test) > "$DIR.log" 2>&1
    rc=$?
    summary=$(grep -E "passed|failed" "$DIR.log" | tail -1)
    echo "run $i: $(git -C "$DIR" rev-parse --short HEAD) rc=$rc $(($(date +%s) - start)) s; load $(cut -d' ' -f1-3 /proc/loadavg); $summary" >> "$LOG"
    i=$((i + 1))
done
