"""The API process never imports model code: no torch, no model libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.deploy import REPO

MODEL_LIBRARIES = ("torch", "diffusers", "transformers", "faster_whisper", "piper", "TTS", "vllm")


def test_the_api_app_imports_no_model_library(redis_url: str, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from jobs.settings import load_settings\n"
        "from api.app import create_app\n"
        "create_app(load_settings())\n"
        f"print(sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules))"
    )
    env = {**os.environ, "MMQ_REDIS_URL": redis_url, "MMQ_DATA_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
