#!/bin/sh
# What `voxgate bench tts --peer faster-qwen3-tts-batch` needs on the device machine and it lacks, into
# .gpu-peer/ (git-ignored, ~22 MB; carry `.gpu-peer` alone: .gpu beside it would pass a call's 64 MiB),
# as wheels for the device's Python 3.12 (it has torch, numpy, safetensors, tokenizers 0.23, einops,
# torchaudio, onnxruntime, requests, pyyaml, regex, tqdm):
# - peer/: the batched peer's own stack, installed there into its own `--target` dir (never beside
#   ours): faster-qwen3-tts-batch 0.2.0 on faster-qwen3-tts 0.5.4 and the official qwen-tts 0.1.1, which
#   pins transformers 4.57.3 (that takes tokenizers <= 0.23.0 and huggingface-hub < 1.0) and
#   accelerate 1.12.0. Left out: what qwen-tts imports for its 25 Hz tokenizer, its demo and audio files
#   (librosa, soundfile, sox, gradio): stand-ins (voxgate/bench/import_stubs.py), never called.
# - voxgate/: what `voxgate bench tts` imports beyond the device's packages (pydantic, settings, soxr);
#   no server packages and no PyAV (the engine imports it only for a speaking rate).
# - qwen3-tts/: the official configs `make-random-checkpoint` builds the checkpoint from.
set -eu
cd "$(dirname "$0")/.."
rm -rf .gpu-peer && mkdir -p .gpu-peer/peer .gpu-peer/voxgate
get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any "$@"
}
get --dest .gpu-peer/peer faster-qwen3-tts-batch==0.2.0 faster-qwen3-tts==0.5.4 qwen-tts==0.1.1 \
    transformers==4.57.3 tokenizers==0.22.2 huggingface-hub==0.36.2 accelerate==1.12.0
get --dest .gpu-peer/voxgate pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 \
    python-dotenv==1.2.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 soxr==1.0.0
cp -r ../shared/qwen3-tts .gpu-peer/qwen3-tts
du -sh .gpu-peer
