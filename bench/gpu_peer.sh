#!/bin/sh
# On the device machine (after bench/gpu_bundle_peer.sh here; carry `.gpu-peer` only): voxgate's batched
# runner and the batched open peer, faster-qwen3-tts-batch 0.2.0, side by side on one random-weight
# checkpoint (issue 22): `voxgate bench tts --peer faster-qwen3-tts-batch` (as `python3 -m
# voxgate.bench.tts`), ours first (its engine freed after), then the peer in its own process on its own
# stack (installed here into /tmp/peer-site with --target). One JSON with both sets of rows and their
# ratios, and a table. The bench about 6-8 minutes on an H100 with the defaults (estimated, not yet run).
# Then (STEPS) bench/qwen3_step_profile.py on the same checkpoint: our step's GPU operations and time
# per part (talker, code predictor, sampler, codec) at 1 and 64 rows, as JSON and a table.
# Usage: sh bench/gpu_peer.sh [seed] [model]   (default 7, Qwen3-TTS-12Hz-0.6B-CustomVoice)
# Environment: RES (results folder; default: packed into $OUT/results-TAG.tgz, bench/gpu_common.sh), FRAMES (per stream, default 120 = 9.6 s of audio),
# STREAMS (stream counts, default 1,4,16,64), RUNS (single-stream runs, and timed batches of the peer
# per stream count; default 3), STEPS ("bench profile": both; one of them alone, e.g. to split the two
# over two calls on one warm machine).
set -u
set -- "${1:-7}" "${2:-Qwen3-TTS-12Hz-0.6B-CustomVoice}"  # this bench's default seed: 7
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; setup_bundle
# Without the CLI (it imports every command's modules, and the bundle carries only the bench's needs).
setup_bundle .gpu-peer .gpu-peer/voxgate || exit 1
rm -rf /tmp/peer-site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-site .gpu-peer/peer/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
CKPT=/tmp/ckpt-$TAG-$SEED
STEPS=${STEPS:-bench profile}
case "$STEPS" in *bench*)
    python3 -m voxgate.bench.tts --model-dir $CKPT --device cuda --dtype bfloat16 --frames ${FRAMES:-120} \
        --packet-frames 1 --runs ${RUNS:-3} --concurrency ${STREAMS:-1,4,16,64} \
        --peer faster-qwen3-tts-batch --peer-site /tmp/peer-site \
        --output-json "$RES/tts-peer-batch-$TAG.json" > "$RES/tts-peer-batch-$TAG.txt" 2>&1
    echo "bench exit $?"; tail -22 "$RES/tts-peer-batch-$TAG.txt" ;;
esac
case "$STEPS" in *profile*)
    python3 bench/qwen3_step_profile.py --model-dir $CKPT --rows 64 --parts 1,64 \
        --output-json "$RES/step-profile-$TAG.json" > "$RES/step-profile-$TAG.txt" 2>&1
    echo "profile exit $?"; grep '^|' "$RES/step-profile-$TAG.txt" ;;
esac
