#!/bin/sh
# On the device machine (carry `.gpu-parity`, `.gpu-peer` or `.gpu`, and the other tree): the batched
# decoder's captured step on this tree against another, alternated on one warm machine (issue 22).
# For each round and each variant in VARIANTS (NAME, NAME:DIR or NAME:DIR:FLAGS; DIR a tree holding
# `voxgate/`, empty for this one; FLAGS comma-separated: options for the script, e.g.
# `plain::--no-codec-lean`, and KEY=VALUE settings for its environment, e.g. `off::VOXGATE_QWEN3_PDL=0`),
# bench/qwen3_step_profile.py (this tree's script, the variant's voxgate) replays every
# bucket's step REPEATS times and breaks the step down by part at PARTS; then a line per bucket with
# each variant's median over the rounds.
# Usage: VARIANTS="old:$PWD/.gpu-old new" sh bench/gpu_step_ab.sh [seed] [model]   (default 7, 0.6B-CustomVoice)
# Environment: RES (default: packed into $OUT/results-TAG.tgz, bench/gpu_common.sh), ROWS (64),
# PARTS (1,64), ROUNDS (2), REPEATS (50), FLAGS (more qwen3_step_profile.py options).
set -u
set -- "${1:-7}" "${2:-Qwen3-TTS-12Hz-0.6B-CustomVoice}"
. bench/gpu_common.sh  # SEED ($1), MODEL ($2), TAG, RES; setup_bundle
for b in .gpu-parity .gpu-peer .gpu; do [ -d $b ] && { BUNDLE=$b; break; }; done
WHEELS=$BUNDLE/wheels; [ $BUNDLE = .gpu-peer ] && WHEELS=.gpu-peer/voxgate
setup_bundle $BUNDLE $WHEELS || exit 1
export PYTHONUNBUFFERED=1
for i in $(seq "${ROUNDS:-2}"); do
    for variant in ${VARIANTS:-new}; do
        name=${variant%%:*} tree= vflags=
        case $variant in *:*) rest=${variant#*:}; tree=${rest%%:*}; case $rest in *:*) vflags=${rest#*:} ;; esac ;; esac
        [ -n "$tree" ] || tree=$PWD
        venv= vopts=  # FLAGS' comma-separated tokens: KEY=VALUE sets the variant's environment, others are options
        for token in $(echo "$vflags" | tr ',' ' '); do
            case $token in [A-Z]*=*) venv="$venv $token" ;; *) vopts="$vopts $token" ;; esac
        done
        env $venv PYTHONPATH=$tree python3 bench/qwen3_step_profile.py --model-dir /tmp/ckpt-$TAG-$SEED --rows "${ROWS:-64}" \
            --parts "${PARTS:-1,64}" --repeats "${REPEATS:-50}" --label "$name" ${FLAGS:-} $vopts \
            --output-json "$RES/step-$TAG-$name-$i.json" > "$RES/step-$TAG-$name-$i.txt" 2>&1
        echo "== $name ($tree), round $i (exit $?)"; grep '^|' "$RES/step-$TAG-$name-$i.txt" | head -40
    done
done
python3 - "$RES" "$TAG" <<'PY'
import glob, json, statistics, sys
res, tag = sys.argv[1], sys.argv[2]
ms = {}
for path in sorted(glob.glob(f"{res}/step-{tag}-*-*.json")):
    r = json.load(open(path))
    for bucket, v in r["step_ms"].items():
        ms.setdefault(int(bucket), {}).setdefault(r["label"], []).append(v)
for bucket, by in sorted(ms.items()):
    print(f"bucket {bucket}: " + ", ".join(f"{k} {statistics.median(v):.3f} ms" for k, v in by.items()) + f"  (all: {by})")
PY
