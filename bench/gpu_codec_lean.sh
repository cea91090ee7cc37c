#!/bin/sh
# On the device machine, carrying `.gpu-peer` (bench/gpu_bundle_peer.sh here) or `.gpu` (bench/gpu_bundle.sh):
# the codec decoder's lean path (VOXGATE_QWEN3_CODEC_LEAN, the default since 2026-11-28) against the plain path on one random-weight
# checkpoint in bf16 (issue 22):
# 1. bench/qwen3_codec_ops.py: one frame's aten ops by part, and its GPU kernels (profiler), at 1, 8 and
#    64 rows, both paths, and the largest PCM difference between them (bf16: not exact);
# 2. bench/gpu_step_ab.sh with the variants plain and lean, ROUNDS times on one warm machine: each
#    bucket's captured step replayed REPEATS times (step_ms, median), and the step's parts (codec, talker,
#    ...) by GPU operations and summed GPU ms at 1 and 64 rows; then one line per bucket with both medians.
# Usage: sh bench/gpu_codec_lean.sh [seed] [model]   (default 7, Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (results folder; default: packed into $OUT/results-TAG.tgz, bench/gpu_common.sh), ROWS (64), ROUNDS (2), REPEATS (50).
set -u
set -- "${1:-7}" "${2:-Qwen3-TTS-12Hz-0.6B-CustomVoice}"  # this bench's default seed: 7
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; setup_bundle
if [ -d .gpu-peer ]; then BUNDLE=.gpu-peer WHEELS=.gpu-peer/voxgate; else BUNDLE=.gpu WHEELS=.gpu/wheels; fi
setup_bundle $BUNDLE $WHEELS || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 bench/qwen3_codec_ops.py --model "$MODEL" --config-root $BUNDLE/qwen3-tts --device cuda --dtype bfloat16 \
    --fused --rows 1,8,64 --both --output-json "$RES/codec-ops-$TAG.json" > "$RES/codec-ops-$TAG.txt" 2>&1
echo "codec ops exit $?"; tail -16 "$RES/codec-ops-$TAG.txt"
RES=$RES PARTS=1,64 VARIANTS="plain::--no-codec-lean lean::--codec-lean" sh bench/gpu_step_ab.sh "$SEED" "$MODEL"
