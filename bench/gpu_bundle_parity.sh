#!/bin/sh
# What `voxgate bench parity` and tests/gpu/ (test_parity_bf16.py, test_graphs.py) need on the device machine and it
# lacks, into .gpu-parity/ (git-ignored; pass `.gpu-parity` alone in the run's `carry`: with .gpu
# beside it a call would pass its 64 MiB): the official Qwen3-TTS (qwen-tts-hf, no deps), the
# transformers stack it imports, pytest and what tests/conftest.py imports, as wheels for the device's
# Python 3.12 (it has torch, numpy, safetensors and tokenizers), and the official configs. Left out:
# av, uvloop, py-spy (serving only) and what qwen_tts imports for its 25 Hz tokenizer, its demo and
# audio files (librosa, soundfile, onnxruntime, sox, torchaudio): the bench stubs those
# (voxgate/bench/parity_runs.py), the 12 Hz path never calls them.
set -eu
cd "$(dirname "$0")/.."
rm -rf .gpu-parity && mkdir -p .gpu-parity/wheels
python3 -m pip download -q --no-deps --dest .gpu-parity/wheels --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any \
    qwen-tts-hf==0.1.1.post1 transformers==5.15.1 accelerate==1.12.0 einops==0.8.2 \
    huggingface-hub==1.33.0 hf-xet==1.8.0 pyyaml==6.0.4 typer==0.29.2 click==8.5.1 filelock==4.3.1 \
    fsspec==2026.9.0 tqdm==4.70.1 typing-extensions==4.16.0 psutil==7.2.2 regex==2026.11.19 rich==15.0.0 \
    shellingham==1.5.4 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 annotated-doc==0.0.7 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    pydantic-settings==2.16.3 python-dotenv==1.2.4 \
    jinja2==3.1.6 markupsafe==3.0.4 packaging==26.4 \
    httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 idna==3.20 certifi==2026.10.19.post1 \
    pytest==9.2.0 pytest-timeout==2.4.0 pluggy==1.7.0 iniconfig==2.3.1 hypothesis==6.170.17 \
    sortedcontainers==2.4.0 tokenizers==0.22.2 soxr==1.0.0  # transformers 5.15.1 takes tokenizers 0.22.0-0.23.0 (the device has 0.23.2); AutoProcessor imports soxr
cp -r ../shared/qwen3-tts .gpu-parity/qwen3-tts
du -sh .gpu-parity
