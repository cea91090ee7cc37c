#!/bin/sh
# On the device machine (after bench/gpu_bundle_parity.sh here; carry `.gpu-parity` only): issue 22's
# proof of the bf16 production path. Per model: a random-weight checkpoint from the real config
# (seeded), then `voxgate bench parity` (the official fp32 teacher, the official bf16 yardstick and
# voxgate's batched decoder with its graphs, fused sampler and kernels, teacher-forced on the same
# codes; a bucket of 64 for batch invariance); then tests/gpu/test_parity_bf16.py.
# Usage: sh bench/gpu_parity.sh [seed] [model ...]   (default 7, Qwen3-TTS-12Hz-0.6B-CustomVoice;
# one 1.7B model per call: its checkpoint and runs take minutes of the 10 a call has)
# Environment: RES (results folder, default $OUT), FRAMES (per prompt, default 100), BUCKET (default 64),
# TESTS=0 (skip the pytest run), LEAN=0 (voxgate's codec on its plain path, not the lean one the server
# runs by default, VOXGATE_QWEN3_CODEC_LEAN; its results are named parity-TAG-plain).
set -u
SEED=${1:-7}
[ $# -gt 0 ] && shift
MODELS=${*:-Qwen3-TTS-12Hz-0.6B-CustomVoice}
RES=${RES:-$OUT}
mkdir -p "$RES"
python3 -m pip install -q --no-index --no-deps .gpu-parity/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$RES/machine.txt"
for MODEL in $MODELS; do
    TAG=$(echo $MODEL | sed 's/Qwen3-TTS-12Hz-//')$([ "${LEAN:-1}" = 0 ] && echo -plain)
    python3 -m voxgate.bench.parity --model $MODEL --configs .gpu-parity/qwen3-tts --seed $SEED \
        --frames ${FRAMES:-100} --bucket ${BUCKET:-64} $([ "${LEAN:-1}" = 0 ] && echo --no-codec-lean) \
        --output-json "$RES/parity-$TAG.json" > "$RES/parity-$TAG.txt" 2>&1
    echo "$MODEL: exit $?"; tail -14 "$RES/parity-$TAG.txt"
done
if [ "${TESTS:-1}" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_parity_bf16.py > "$RES/pytest-parity.txt" 2>&1
    tail -5 "$RES/pytest-parity.txt"
fi
