#!/bin/sh
# Ray Serve for a device run (bench/gpu_ray.sh), beside bench/gpu_bundle.sh's .gpu/: ray[serve]
# and its dependencies as wheels for Python 3.12, less what .gpu/ or the device already has. One
# device call carries at most 64 MiB (the repository, ~11 MB, included) and ray's wheel alone is
# 79 MB, so the ~115 MB of wheels go into three git-ignored folders of ~38 MB, .gpu-ray1/ to
# .gpu-ray3/ (ray's wheel split in three; `cat` joins it on the device), each carried by its own
# call on the same warm machine into /tmp/carry, then .gpu with the run (see bench/gpu_ray.sh).
set -eu
cd "$(dirname "$0")/.."
RAY=$(sed -n 's/.*"ray\[serve\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
tmp=$(mktemp -d)
python3 -m pip download -q --dest "$tmp" --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any "ray[serve]==$RAY"
for have in .gpu/wheels/*.whl; do rm -f "$tmp/$(basename "$have")"; done
rm -f "$tmp"/numpy-*.whl  # the device's numpy serves
rm -rf .gpu-ray1 .gpu-ray2 .gpu-ray3 && mkdir -p .gpu-ray1 .gpu-ray2 .gpu-ray3
split -n 3 "$tmp"/ray-$RAY-*.whl "$tmp"/ray.part.
basename "$tmp"/ray-$RAY-*.whl > .gpu-ray1/ray.name
mv "$tmp"/ray.part.aa .gpu-ray1/ && mv "$tmp"/ray.part.ab .gpu-ray2/ && mv "$tmp"/ray.part.ac .gpu-ray3/
rm "$tmp"/ray-$RAY-*.whl
# The other wheels, largest first, into the lightest folder (each stays near ~38 MB).
for wheel in $(ls -S "$tmp"/*.whl); do
    lightest=$(du -sb .gpu-ray1 .gpu-ray2 .gpu-ray3 | sort -n | head -1 | cut -f2)
    mv "$wheel" "$lightest"/
done
rm -rf "$tmp"
du -sh .gpu-ray1 .gpu-ray2 .gpu-ray3
