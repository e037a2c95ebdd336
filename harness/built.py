"""Test models built once per test session, in its base temporary directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    marker: str,
    build: Callable[[Path], object],
) -> Path:
    """The session's `name` directory, built by `build(path)` unless its `marker` file
    is already there."""
    path = tmp_path_factory.getbasetemp() / name
    if not (path / marker).exists():
        build(path)
    return path
