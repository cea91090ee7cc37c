#!/bin/sh
# What a run on the device machine needs and it lacks, into .gpu/ (git-ignored; pass `.gpu` in
# the run's `carry`): voxgate's serving dependencies as wheels for its Python 3.12 (it has torch,
# numpy, safetensors and tokenizers already), and the official Qwen3-TTS configs that
# `make-random-checkpoint` builds checkpoints from, and py-spy
# (`bench/gpu_profile.sh`: where the server's GIL time goes under load). On the device:
#   python3 -m pip install -q --no-index --no-deps .gpu/wheels/*.whl && export PYTHONPATH=$PWD
#   python3 -m voxgate make-random-checkpoint --configs .gpu/qwen3-tts --model ... --out ...
set -eu
cd "$(dirname "$0")/.."
rm -rf .gpu/wheels && mkdir -p .gpu/wheels
python3 -m pip download -q --dest .gpu/wheels --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any \
    fastapi==0.165.0 starlette==1.10.0 anyio==4.16.0 uvicorn==0.54.0 uvloop==0.23.0 \
    pydantic==2.14.4 pydantic-settings==2.16.3 prometheus-client==0.26.0 regex==2026.11.19 \
    soxr==1.0.0 httpx==0.28.1 websockets==17.4 \
    rjieba==0.2.2 pysbd==0.3.4 av==18.1.0 \
    py-spy==0.4.3
# The device's own numpy, uvloop, pytest (pluggy, iniconfig, packaging, pygments) and hypothesis
# serve: the repository and .gpu/ together must stay under a call's 64 MiB (av alone is 36 MB).
rm -f .gpu/wheels/numpy-*.whl .gpu/wheels/pygments-*.whl .gpu/wheels/uvloop-*.whl
rm -rf .gpu/qwen3-tts && cp -r ../shared/qwen3-tts .gpu/qwen3-tts
du -sh .gpu
