"""Test models built once and kept across test runs, in `build/test-models/` of the repository
(`make clean` removes it), each under a name and a hash of what builds it: the model
builders' sources (`harness/models/`, this module) and the versions of the libraries that
write the files. A change to either builds it again under a new hash. A file lock keeps two
sessions (or two xdist workers) from building the same one at once."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from collections.abc import Callable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / "build" / "test-models"
LIBRARIES = ("torch", "transformers", "diffusers", "tokenizers", "safetensors", "peft")
"""What writes a tiny model's files: a new version of one may write them differently."""


@cache
def builders_hash() -> str:
    """A hash of the model builders' sources and the versions of the libraries they use."""
    digest = hashlib.sha256()
    for source in [*sorted((REPO / "harness" / "models").glob("*.py")), Path(__file__)]:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    for library in LIBRARIES:
        try:
            digest.update(f"{library}={version(library)}".encode())
        except PackageNotFoundError:
            digest.update(f"{library}=none".encode())
    return digest.hexdigest()[:16]


def built_once(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    marker: str,
    build: Callable[[Path], object],
) -> Path:
    """The `name` directory, built by `build(path)` unless its `marker` file is already
    there, kept across runs (`CACHE`). `tmp_path_factory` is kept for the callers' sake: the
    model no longer lives in the session's temporary directory."""
    del tmp_path_factory
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{name}-{builders_hash()}"
    if (path / marker).exists():
        return path
    with (CACHE / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (path / marker).exists():
            # Built aside and renamed whole: a build cut short is never taken for a model.
            partial = path.with_name(f"{path.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(path, ignore_errors=True)
            build(partial)
            partial.rename(path)
    return path
