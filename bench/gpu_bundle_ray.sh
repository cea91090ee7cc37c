#!/bin/sh
# Ray Serve for a device run (bench/gpu_ray.sh), beside bench/gpu_bundle.sh's .gpu/: ray[serve]
# and its dependencies as wheels for Python 3.12, less what .gpu/ or the device already has. One
# device call carries at most 64 MiB (the repository included) and ray's wheel alone is 79 MB, so
# the wheels go into two git-ignored folders of ~55 MB, .gpu-ray1/ and .gpu-ray2/ (ray's wheel
# split in two; `cat` joins it on the device), each carried by its own call on the same warm
# machine: .gpu, then .gpu-ray1, then .gpu-ray2 with the run (see bench/gpu_ray.sh).
set -eu
cd "$(dirname "$0")/.."
RAY=$(sed -n 's/.*"ray\[serve\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
tmp=$(mktemp -d)
python3 -m pip download -q --dest "$tmp" --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any "ray[serve]==$RAY"
for have in .gpu/wheels/*.whl; do rm -f "$tmp/$(basename "$have")"; done
rm -f "$tmp"/numpy-*.whl  # the device's numpy serves
rm -rf .gpu-ray1 .gpu-ray2 && mkdir -p .gpu-ray1 .gpu-ray2
split -b 40M "$tmp"/ray-$RAY-*.whl "$tmp"/ray.part.
basename "$tmp"/ray-$RAY-*.whl > .gpu-ray1/ray.name
mv "$tmp"/ray.part.aa .gpu-ray1/ && mv "$tmp"/ray.part.ab .gpu-ray2/ && rm "$tmp"/ray-$RAY-*.whl
# The other wheels, largest first, into the lighter folder (each stays under ~56 MB).
for wheel in $(ls -S "$tmp"/*.whl); do
    if [ "$(du -sb .gpu-ray1 | cut -f1)" -le "$(du -sb .gpu-ray2 | cut -f1)" ]; then mv "$wheel" .gpu-ray1/
    else mv "$wheel" .gpu-ray2/; fi
done
rm -rf "$tmp"
du -sh .gpu-ray1 .gpu-ray2
