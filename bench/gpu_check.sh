#!/usr/bin/env bash
# A short check of a GPU host, as one command once every part of the wheelhouse is there
# (`bash bench/gpu_remote.sh --install-only` per part; the last part may instead come with
# this call, whose first `--run` installs it): bench.llm_ceiling with the host's cores split into
# API processes and relay workers (PAIRS), then `bench.gpu --quick` on image, TTS and LLM
# (ASR needs CUDA 12's cuBLAS, which a CUDA 13 image lacks). About 7 minutes on an H100
# host with 16 cores; results go to $OUT (the device tool's) or bench/results.
#
#   GPU_S=330 bash bench/gpu_check.sh          # GPU_S: bench.gpu's time limit, seconds
#   PAIRS="1 1,2 2,4 4" LOADS=16x128@20,256x128@20,64x8@20 bash bench/gpu_check.sh
#   ONLY=ceiling|gpu bash bench/gpu_check.sh   # one half (two calls of a device tool)
set -u
OUT="${OUT:-bench/results}"
PAIRS="${PAIRS:-1 1,2 1,1 2,2 2}"
LOADS="${LOADS:-16x128@20,256x128@20,64x8@20}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "cores: $(nproc)"
ONLY="${ONLY:-}"  # empty: both halves
if [ "$ONLY" != gpu ]; then
    IFS=, read -ra pairs <<< "$PAIRS"
    for c in "${pairs[@]}"; do
        set -- $c
        echo "== llm_ceiling api_workers=$1 worker_instances=$2"
        timeout "${LC_S:-150}" bash bench/gpu_remote.sh --run bench.llm_ceiling -- \
            --loads "$LOADS" --rounds 2 --api-workers "$1" \
            --worker-instances "$2" --out "$OUT/lc-a$1-w$2.json" 2>&1 \
            | grep -E "mmq:|direct:|fit over|by process|Error|error|missing" | cut -c1-200
    done
fi
if [ "$ONLY" != ceiling ]; then
    echo "== bench.gpu"
    timeout "${GPU_S:-300}" bash bench/gpu_remote.sh -- --quick --sections image,tts,llm \
        --set image_requests=32 --set image_steps=20 --set tts_instances=1,2,4 --set tts_jobs=32 \
        --set tts_concurrency=8 --set llm_requests=32 --set llm_concurrency=32 \
        --set llm_max_tokens=32 --set llm_prompt_words=100 2>&1 | tail -60
    echo "rc=${PIPESTATUS[0]}"
fi
