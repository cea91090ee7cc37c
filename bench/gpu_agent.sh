#!/bin/sh
# On the device machine (issue 20 item 4): the voice agent with qwen3 on CUDA (random-weight 0.6B
# CustomVoice, bf16, CUDA graphs), the embedded LLM (SmolLM2-135M, llama.cpp on the CPU cores),
# whisper tiny.en (CUDA if CTranslate2 can decode there, else the CPU cores, int8: the log says
# which), Smart Turn v3.2 and Silero VAD (ONNX Runtime / their own runtime, CPU), over real WebRTC
# calls from the bench's bot on the same machine: `voxgate bench agent` with barge-ins (EoT -> first
# audio, cancel -> silence) and `--questions multi` (answered once, EoT -> first audio by stage).
#
# Here first: sh bench/gpu_bundle_agent.sh (fills .gpu-agent1 .. .gpu-agentN, one call each). Then
# on ONE machine, calls back to back (it goes back 30 s after a call; what the calls carried
# is kept in $CARRY, the server runs on between calls in its own session):
#   carry [".gpu-agent1"]:      sh bench/gpu_agent.sh stash      ... and so on up to N-1, then
#   carry [".gpu-agentN"]:      sh bench/gpu_agent.sh basic      (joins and installs the parts, builds
#                               the checkpoint, starts the server, warm-up call, the basic bench)
#   no carry:                   sh bench/gpu_agent.sh multi      (the multi-sentence set, ~6 min)
#   no carry:                   sh bench/gpu_agent.sh followup   (a question, then more after a pause: 8, ~2 min;
#                               a bundle made before 9c696e8 lacks its recordings: here `voxgate bench agent
#                               --record-questions .gpu-agent-questions` (9 MB), then carry [".gpu-agent-questions"]
#                               and QDIR=.gpu-agent-questions)
# The agent's page in a headless Chromium (Debian's, with its libraries, from bench/gpu_bundle_page.sh here:
# .gpu-page1 .. .gpu-pageM), after the agent's stash calls (the server starts if basic has not run):
#   carry [".gpu-page1"]:       sh bench/gpu_agent.sh stash      ... and so on up to M-1, then
#   carry [".gpu-pageM"]:       sh bench/gpu_agent.sh page       (`voxgate bench page`: one call from the page,
#                               its microphone asking the browser test's question; JSON with the checks, a
#                               screenshot; exits 1 unless every check held)
# Each bench mode leaves $RES/agent-<mode>-<NAME>.tgz (JSON, tables, the server log, the call traces).
# Environment: RES (default $OUT), CARRY (/tmp/carry), NAME (results label, default "default"),
# EXTRA (more server settings, KEY=VALUE without VOXGATE_, e.g. "AGENT_MIN_GAP_MS=400": a server
# running with other settings is restarted), TURNS (10) and BARGE (1: talk over every reply) for
# basic, LIMIT (0: all 44) for multi, STT_DEVICE (auto), STT_THREADS (4), TURN_THREADS (2),
# ENGINE (qwen3; tone or piper for a dry run where no GPU is), PY (python3), INSTALL (1: pip-install
# the carried wheels into $PY's environment), CALL_S (570: a bench still running this long after the
# call began is stopped, so its logs still come back within the call's 600 s), CHROMIUM (page: the
# browser, default the bundle's chromium.sh; a dry run's wrapper).
# Replies are capped at 24 LLM tokens (AGENT_MAX_TOKENS; EXTRA may change it): random weights never
# say EOS, so each segment speaks its length guard (max(64, 8 x tokens) frames of 80 ms, >= 5 s) and
# the basic set waits for every reply to play out; first audio does not depend on the cap.
set -u
MODE=${1:?usage: sh bench/gpu_agent.sh stash|basic|multi|followup|page|stop}
SEED=11
MODEL=Qwen3-TTS-12Hz-0.6B-CustomVoice
RES=${RES:-$OUT}
CARRY=${CARRY:-/tmp/carry}
AGENT=${AGENT_DIR:-/tmp/agent}  # the joined bundle
PAGE=${PAGE_DIR:-/tmp/page}  # the joined page bundle
RUN=${RUN_DIR:-/tmp/agent-run}  # server log, traces, results: kept across calls
PY=${PY:-python3}
ENGINE=${ENGINE:-qwen3}
NAME=${NAME:-default}
PORT=${PORT:-8765}
URL=http://127.0.0.1:$PORT
T0=$(date +%s)
export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$RES" "$CARRY" "$RUN/traces"

stash() {  # keep what this call carried where later calls find it
    for d in .gpu-agent[0-9]* .gpu-page[0-9]*; do [ -d "$d" ] && cp -r "$d" "$CARRY/"; done
    ls "$CARRY"/.gpu-*/*.t?z.* 2>/dev/null | sed 's/.*\/\([a-z]*\)\.t.z\./\1 part /' | tr '\n' ' '; echo
}

joined() {  # KIND FILE: the parts of $CARRY/.gpu-KIND*/KIND.t?z.NN joined into FILE, checked whole
    first=$(ls "$CARRY"/.gpu-$1*/$1.sha256 2>/dev/null | head -1)
    [ -n "$first" ] || { echo "no $1 bundle part on this machine (a fresh one?): the stash calls first"; return 1; }
    set -- "$1" "$2" $(cat "$first")
    i=0
    rm -f "$2"
    while [ $i -lt "$4" ]; do
        part=$(ls "$CARRY"/.gpu-$1*/$1.t?z.$(printf %02d $i) 2>/dev/null | head -1)
        [ -n "$part" ] || { echo "$1 part $i of $4 missing: carry its .gpu-$1 folder (stash) first"; return 1; }
        cat "$part" >> "$2"
        i=$((i + 1))
    done
    [ "$(sha256sum "$2" | cut -d' ' -f1)" = "$3" ] || { echo "joined $1 bundle: sha256 differs"; return 1; }
}

unpack() {  # join the parts, check them whole, unpack and install (once a machine)
    [ -f "$AGENT/.installed" ] && return 0
    joined agent /tmp/agent.tgz || return 1
    rm -rf "$AGENT" && mkdir -p "$AGENT" && tar -xzf /tmp/agent.tgz -C "$AGENT" --strip-components=1 || return 1
    rm /tmp/agent.tgz
    if [ "${INSTALL:-1}" = 1 ]; then
        $PY -m pip install -q --no-index --no-deps --no-compile "$AGENT"/wheels/*.whl > "$RUN/pip.txt" 2>&1 \
            || { tail -5 "$RUN/pip.txt"; return 1; }
    fi
    touch "$AGENT/.installed"
}

unpack_page() {  # the page bundle, joined and unpacked (xz: Python's, the image may have no xz)
    [ -f "$PAGE/.unpacked" ] && return 0
    joined page /tmp/page.txz || return 1
    rm -rf "$PAGE" "$PAGE.tmp" && mkdir -p "$PAGE.tmp" || return 1
    $PY -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" /tmp/page.txz \
        "$PAGE.tmp" && mv "$PAGE.tmp/page" "$PAGE" && rm -rf "$PAGE.tmp" /tmp/page.txz || return 1
    touch "$PAGE/.unpacked"
}

drive_page() {  # the agent's page in the bundle's Chromium against the running server (voxgate bench page)
    left=$((T0 + ${CALL_S:-570} - $(date +%s) - 15))
    site=$PWD  # the carried Playwright and greenlet (Python 3.12), unless INSTALL=0 (a dry run's own)
    [ "${INSTALL:-1}" = 1 ] && site=$PWD:$PAGE/site
    # node-lib: libatomic for Playwright's Node.js; chromium.sh puts the rest of the libraries on its own path.
    HOME=${HOME:-/tmp} LD_LIBRARY_PATH="$PAGE/node-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH=$site \
        timeout "$left" $PY -m voxgate bench page --url $URL --chromium "${CHROMIUM:-$PAGE/chromium.sh}" \
        --mic-wav "$PAGE/question.wav" --screenshot "$RUN/page-$NAME.png" --output-json "$RUN/page-$NAME.json" \
        > "$RUN/page-$NAME.txt" 2>&1
    rc=$?
    cp "$RUN/page-$NAME.json" "$RUN/page-$NAME.png" "$RES/" 2>/dev/null  # beside the tar: read at once
    echo "== page ($NAME): exit $rc"
    tail -15 "$RUN/page-$NAME.txt"
    return $rc
}

machine() {
    { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"
      echo "cores $(nproc)"
      $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -1
      $PY -c "import ctranslate2 as c; print('ctranslate2', c.__version__, 'cuda devices', c.get_cuda_device_count())"
      $PY -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
      echo "cuBLAS libraries: $(ldconfig -p | grep -o 'libcublas\.so\.[0-9]*' | sort -u | tr '\n' ' ')"
      $PY -c "import glob, torch, os; print('torch ships', sorted({os.path.basename(p) for p in glob.glob(os.path.dirname(torch.__file__) + '/../nvidia/*/lib/libcublas.so*')}))" 2>&1 | tail -1
    } > "$RUN/machine.txt" 2>&1
    # WebRTC offers host candidates only, never 127.0.0.1 (aioice): a machine with no other address
    # gets one on its loopback device, which the bot and the server then meet on.
    ice="import aioice.ice as i; print(len(i.get_host_addresses(True, False)))"
    if [ "$($PY -c "$ice")" = 0 ]; then
        ip addr add 10.255.0.1/32 dev lo 2>> "$RUN/machine.txt"
        echo "no address for ICE: 10.255.0.1 added on lo; addresses now $($PY -c "$ice")" >> "$RUN/machine.txt"
    fi
    # Whisper on CUDA, in a process of its own first (a CTranslate2 build that cannot run here could
    # take the server down): auto falls back to the CPU, where the log says so.
    device=${STT_DEVICE:-auto}
    if [ "$device" != cpu ]; then
        probe="from voxgate.agent.stt import *; import numpy; w = WhisperTranscriber(WhisperConfig(device='cuda'))"
        probe="$probe; print('whisper decodes on CUDA:', w.transcribe(numpy.zeros(16000, 'float32'), 16000))"
        timeout 180 $PY -c "$probe" >> "$RUN/machine.txt" 2>&1 \
            || { echo "whisper cannot decode on CUDA here: STT on the CPU cores" >> "$RUN/machine.txt"; device=cpu; }
    fi
    echo "$device" > "$RUN/stt_device"
    cat "$RUN/machine.txt"
}

settings() {  # the server's settings, one KEY=VALUE a word
    echo "ENGINE=$ENGINE LLM_EMBEDDED=true LLM_MODEL_PATH=$(ls "$AGENT"/models/*.gguf) AGENT_TRACE_DIR=$RUN/traces" \
        "AGENT_WHISPER_DEVICE=$(cat "$RUN/stt_device" 2>/dev/null || echo auto) AGENT_WHISPER_THREADS=${STT_THREADS:-4}" \
        "AGENT_TURN_MODEL_PATH=$(ls "$AGENT"/models/*.onnx) AGENT_TURN_THREADS=${TURN_THREADS:-2} ADMIN_KEYS=bench-admin" \
        "AGENT_MAX_TOKENS=24"
    if [ "$ENGINE" = qwen3 ]; then
        echo "QWEN3_MODEL_DIR=/tmp/ckpt-agent-$SEED QWEN3_DEVICE=cuda QWEN3_DTYPE=bfloat16 QWEN3_MAX_STREAMS=8"
    fi
    echo "${EXTRA:-}"
}

wait_up() {  # PID: until /healthz answers, or the server has exited
    for i in $(seq 400); do
        curl -sf $URL/healthz > /dev/null && return 0
        kill -0 "$1" 2>/dev/null || { echo "server exited"; tail -30 "$RUN/serve.log"; return 1; }
        sleep 1
    done
    echo "server not up after 400 s"; return 1
}

server() {  # the server with settings(), started (in its own session: it outlives this call) unless running so
    want=$(settings | tr '\n' ' ')
    if [ -f "$RUN/server.pid" ] && kill -0 "$(cat "$RUN/server.pid")" 2>/dev/null; then
        [ "$(cat "$RUN/server.settings")" = "$want" ] && return 0
        kill "$(cat "$RUN/server.pid")"; sleep 3
    fi
    if [ "$ENGINE" = qwen3 ] && [ ! -d /tmp/ckpt-agent-$SEED ]; then
        $PY -m voxgate make-random-checkpoint --configs "$AGENT/qwen3-tts" --model $MODEL \
            --out /tmp/ckpt-agent-$SEED --seed $SEED > "$RUN/checkpoint.txt" 2>&1 || { cat "$RUN/checkpoint.txt"; return 1; }
    fi
    echo "$want" > "$RUN/server.settings"
    t0=$(date +%s)
    # In a session of its own, so it outlives this call (the device ends a call's other processes).
    env $(for kv in $want; do printf 'VOXGATE_%s ' "$kv"; done) $PY - "$RUN/serve.log" $PY -m voxgate serve \
        --port $PORT > "$RUN/server.pid" <<'PY'
import subprocess, sys
log = open(sys.argv[1], "ab")
print(subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True).pid)
PY
    wait_up "$(cat "$RUN/server.pid")" || return 1
    echo "server ready in $(( $(date +%s) - t0 )) s ($want)"
    # A call first, untimed: whisper and the turn model load on the first call, the LLM warms.
    bench warmup --turns 1 --barge-every 0 > /dev/null
}

bench() {  # LABEL ARGS...: voxgate bench agent against the running server
    label=$1; shift
    left=$((T0 + ${CALL_S:-570} - $(date +%s) - 15))  # what is left of the call, less packing the results
    timeout "$left" $PY -m voxgate bench agent --url $URL --trace-dir "$RUN/traces" \
        --questions-dir "$AGENT/questions" --output-json "$RUN/agent-$label-$NAME.json" "$@" \
        > "$RUN/agent-$label-$NAME.txt" 2>&1
    echo "== $label ($NAME): exit $?"
    grep -v "^  turn\|^  [0-9]*/" "$RUN/agent-$label-$NAME.txt" | tail -25
}

results() {  # MODE: the run folder as one file back
    grep -E "whisper .* on |turn model|embedded LLM|CUDA unusable|Traceback|ERROR" "$RUN/serve.log" | sort -u | head -20
    tar -czf "$RES/agent-$1-$NAME.tgz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
}

case $MODE in
    stash) stash ;;
    basic)
        stash; unpack || exit 1; machine; server || { results basic; exit 1; }
        bench basic --turns "${TURNS:-10}" --barge-every "${BARGE:-1}"
        results basic ;;
    multi)
        stash; unpack || exit 1; server || { results multi; exit 1; }
        bench multi --questions multi --limit "${LIMIT:-0}"
        results multi ;;
    followup)
        stash; unpack || exit 1; server || { results followup; exit 1; }
        bench followup --questions followup --questions-dir "${QDIR:-$AGENT/questions}"
        results followup ;;
    page)
        stash; unpack || exit 1; unpack_page || exit 1; [ -f "$RUN/stt_device" ] || machine
        server || { results page; exit 1; }
        drive_page; rc=$?
        results page; exit $rc ;;
    stop) [ -f "$RUN/server.pid" ] && kill "$(cat "$RUN/server.pid")"; rm -f "$RUN/server.pid" ;;
    *) echo "unknown mode $MODE: stash|basic|multi|followup|page|stop"; exit 2 ;;
esac
