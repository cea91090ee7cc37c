#!/bin/sh
# On the device machine, carrying `.gpu-peer` (bench/gpu_bundle_peer.sh here) or `.gpu` (bench/gpu_bundle.sh):
# the codec decoder's lean path (VOXGATE_QWEN3_CODEC_LEAN, the default since 2026-11-28) against the plain path on one random-weight
# checkpoint in bf16 (issue 22):
# 1. bench/qwen3_codec_ops.py: one frame's aten ops by part, and its GPU kernels (profiler), at 1, 8 and
#    64 rows, both paths, and the largest PCM difference between them (bf16: not exact);
# 2. bench/qwen3_step_profile.py, plain then lean, ROUNDS times on one warm machine: each bucket's
#    captured step replayed REPEATS times (step_ms, median), and the step's parts (codec, talker, ...) by
#    GPU operations and summed GPU ms at 1 and 64 rows; then one line per bucket comparing the medians.
# Usage: sh bench/gpu_codec_lean.sh [seed] [model]   (default 7, Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (results folder; default: packed into $OUT/results-TAG.tgz, bench/gpu_common.sh), ROWS (64), ROUNDS (2), REPEATS (50).
set -u
set -- "${1:-7}" "${2:-Qwen3-TTS-12Hz-0.6B-CustomVoice}"  # this bench's default seed: 7
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; setup_bundle
if [ -d .gpu-peer ]; then BUNDLE=.gpu-peer WHEELS=.gpu-peer/voxgate; else BUNDLE=.gpu WHEELS=.gpu/wheels; fi
setup_bundle $BUNDLE $WHEELS || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
CKPT=/tmp/ckpt-$TAG-$SEED
python3 bench/qwen3_codec_ops.py --model "$MODEL" --config-root $BUNDLE/qwen3-tts --device cuda --dtype bfloat16 \
    --fused --rows 1,8,64 --both --output-json "$RES/codec-ops-$TAG.json" > "$RES/codec-ops-$TAG.txt" 2>&1
echo "codec ops exit $?"; tail -16 "$RES/codec-ops-$TAG.txt"
for i in $(seq "${ROUNDS:-2}"); do
    for mode in plain lean; do
        flag=--no-codec-lean; [ $mode = lean ] && flag=--codec-lean
        python3 bench/qwen3_step_profile.py --model-dir "$CKPT" --rows "${ROWS:-64}" --parts 1,64 \
            --repeats "${REPEATS:-50}" --label $mode $flag --output-json "$RES/step-$TAG-$mode-$i.json" \
            > "$RES/step-$TAG-$mode-$i.txt" 2>&1
        echo "== $mode, round $i (exit $?)"; grep '^|' "$RES/step-$TAG-$mode-$i.txt"
    done
done
python3 - "$RES" "$TAG" <<'PY'
import glob, json, statistics, sys
res, tag = sys.argv[1], sys.argv[2]
ms = {}
for path in sorted(glob.glob(f"{res}/step-{tag}-*-*.json")):
    r = json.load(open(path))
    for bucket, v in r["step_ms"].items():
        ms.setdefault(bucket, {}).setdefault(r["label"], []).append(v)
for bucket, by in sorted(ms.items(), key=lambda kv: int(kv[0])):
    d, lean = statistics.median(by.get("default", [0])), statistics.median(by.get("lean", [0]))
    print(f"bucket {bucket}: step {d:.3f} ms default, {lean:.3f} ms lean ({lean - d:+.3f} ms) over {by}")
PY
