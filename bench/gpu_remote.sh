#!/usr/bin/env bash
# Install mmq's wheelhouse on a GPU host that reaches no registry, then run bench.gpu there.
#
#   bash bench/gpu_remote.sh [--wheels DIR] [--site DIR] [--run MODULE | --install-only]
#                            [-- ARGS...]
#
# Run it from the repository root on the GPU host, with the parts that
# `python -m bench.wheelhouse --out .whl` made beside it (DIR, default .whl: part-N/
# folders and manifest.json). The host's own Python (python3, or $PYTHON) keeps its CUDA
# torch: every part found is installed with `pip --no-index --no-deps --target
# SITE/part-N` (SITE default /tmp/mmq-site; a folder per part, so that no part's install
# replaces another's files). Once every part of the manifest is in, it runs
# `python -m bench.gpu ARGS` (or `--run MODULE`, e.g. bench.llm_ceiling) with the parts and
# the repo on PYTHONPATH; the report goes to $OUT where set (else bench/results). Until
# then it says which parts are still missing and exits 3. Once all are in, a second call
# installs nothing and runs at once. `--install-only` installs what it carries and stops:
# a call that carries the last part for a later `--run` must not start `bench.gpu` (a full
# run, minutes of device time) on the way.
#
# A host that has the whole wheelhouse: one call. This workplace's device tool carries at
# most 64 MiB a call, so one call per part, back to back (a warm machine keeps SITE for
# 30 s; a fresh one starts bare, then begin again at part-1):
#   run  command="bash bench/gpu_remote.sh --install-only"  carry=[".whl/manifest.json", ".whl/part-1"]
#   ...
#   run  command="bash bench/gpu_remote.sh -- --quick"  carry=[".whl/manifest.json", ".whl/part-N"]
set -euo pipefail

WHEELS=.whl
SITE=/tmp/mmq-site
PY="${PYTHON:-python3}"
MODULE=bench.gpu
INSTALL_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels) WHEELS="$2"; shift 2 ;;
        --site) SITE="$2"; shift 2 ;;
        --run) MODULE="$2"; shift 2 ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --) shift; break ;;
        *) echo "gpu_remote.sh: unknown argument $1 (the module's go after --)" >&2; exit 2 ;;
    esac
done

if [ ! -f "$WHEELS/manifest.json" ]; then
    echo "gpu_remote.sh: no $WHEELS/manifest.json: build it with python -m bench.wheelhouse" >&2
    exit 2
fi
mkdir -p "$SITE"

for part in "$WHEELS"/part-*/; do
    [ -d "$part" ] || continue
    name="$(basename "$part")"
    if [ -f "$SITE/$name/.installed" ]; then
        echo "gpu_remote.sh: $name already installed in $SITE"
        continue
    fi
    echo "gpu_remote.sh: installing $name ($(du -sh "$part" | cut -f1))"
    rm -rf "${SITE:?}/$name"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$SITE/$name" "$part"*.whl
    touch "$SITE/$name/.installed"
done

missing="$("$PY" -c '
import json, pathlib, sys
parts = json.load(open(sys.argv[1]))["parts"]
site = pathlib.Path(sys.argv[2])
print(" ".join(p for p in parts if not (site / p / ".installed").exists()))
' "$WHEELS/manifest.json" "$SITE")"
if [ -n "$missing" ]; then
    echo "gpu_remote.sh: still missing: $missing (carry them next; the bench runs once all are in)"
    exit 3
fi
if [ "$INSTALL_ONLY" = 1 ]; then
    echo "gpu_remote.sh: every part is installed in $SITE"
    exit 0
fi

for dir in "$SITE"/part-*; do
    PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
    PATH="$dir/bin:$PATH"
done
export PYTHONPATH="$PWD:$PYTHONPATH" PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
"$PY" -c "import torch, transformers, celery, faster_whisper, diffusers, TTS; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| transformers', transformers.__version__)"
exec "$PY" -m "$MODULE" "$@"
