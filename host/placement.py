"""Which worker processes run on which device of this host.

A placement file (TOML) lists what runs here; pipelines it does not name run elsewhere
(another host on the same Redis) or nowhere:

    [[place]]
    pipeline = "asr"
    device = "gpu:0"        # cpu, gpu:N, mig:<uuid>, gpu:* (each GPU), mig:* (each
    instances = 1           #   slice), auto (the GPU or slice with the most room)
    max_batch = 16          # optional knobs: override the pipeline's for these workers
    concurrency = 32

Without a file, every enabled pipeline runs `instances` workers on its configured
`device` (`auto` picks as above, or the CPU on a host without GPUs). Either way the
plan is refused when a GPU or slice cannot hold the workers placed on it (their
estimated memory against its free memory), naming the device and the shortfall.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from host.devices import GIB, Device, Topology
from host.model_memory import Estimate, estimate
from jobs.settings import PipelineConfig, Settings


class Knobs(TypedDict, total=False):
    """The engine's knobs a placement sets for its workers, over the pipeline's."""

    concurrency: int
    max_batch: int
    max_wait_ms: float
    runners: int


class PlacementError(Exception):
    """The placement cannot run here: an unknown pipeline or device, or no room."""


class PlaceEntry(BaseModel):
    """One `[[place]]` table of a placement file."""

    model_config = ConfigDict(extra="forbid")

    pipeline: str
    device: str = "auto"
    instances: int | None = Field(default=None, ge=1)
    """Worker processes per device (default: the pipeline's `instances`)."""
    concurrency: int | None = Field(default=None, ge=1)
    max_batch: int | None = Field(default=None, ge=1)
    max_wait_ms: float | None = Field(default=None, ge=0)
    runners: int | None = Field(default=None, ge=1)

    def overrides(self) -> Knobs:
        knobs: Knobs = {}
        if self.concurrency is not None:
            knobs["concurrency"] = self.concurrency
        if self.max_batch is not None:
            knobs["max_batch"] = self.max_batch
        if self.max_wait_ms is not None:
            knobs["max_wait_ms"] = self.max_wait_ms
        if self.runners is not None:
            knobs["runners"] = self.runners
        return knobs


class PlacementFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    place: list[PlaceEntry] = Field(min_length=1)


def load_placement(path: Path) -> PlacementFile:
    try:
        return PlacementFile.model_validate(tomllib.loads(path.read_text()))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PlacementError(f"cannot read placement file {path}: {exc}") from None
    except ValidationError as exc:
        raise PlacementError(f"placement file {path}: {exc}") from None


@dataclass(frozen=True)
class Assignment:
    """One worker process: a pipeline's instance on a device, with its knobs."""

    pipeline: str
    device: Device
    instance: int
    estimate: Estimate
    overrides: Knobs = field(default_factory=Knobs)
    on_demand: bool = False
    """Its model is loaded on demand: the device's on-demand models take turns."""


@dataclass
class Plan:
    assignments: list[Assignment] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def by_device(self) -> dict[str, list[Assignment]]:
        grouped: dict[str, list[Assignment]] = {}
        for a in self.assignments:
            grouped.setdefault(a.device.id, []).append(a)
        return grouped


@dataclass(frozen=True)
class _Request:
    pipeline: str
    config: PipelineConfig
    device: str
    instances: int
    overrides: Knobs


def plan_placement(
    settings: Settings, topology: Topology, placement: PlacementFile | None = None
) -> Plan:
    """The worker processes to start here; raises PlacementError when it cannot run."""
    plan = Plan()
    auto: list[_Request] = []
    for request in _requests(settings, placement):
        if request.device == "auto":
            auto.append(request)
            continue
        for device in resolve(request.device, topology, request.pipeline):
            _assign(plan, request, device)
    used = _used_bytes(plan.assignments)
    for request in sorted(auto, key=lambda r: -_need(r, on_gpu=True)):
        device = _fit(request, topology, used)
        _assign(plan, request, device)
        used[device.id] = used.get(device.id, 0) + _need(request, device.kind != "cpu")
    check_fit(plan, topology)
    return plan


def _requests(settings: Settings, placement: PlacementFile | None) -> Iterable[_Request]:
    if placement is None:
        for name, config in settings.enabled_pipelines.items():
            yield _Request(name, config, config.device, config.instances, {})
        return
    for entry in placement.place:
        placed = settings.enabled_pipelines.get(entry.pipeline)
        if placed is None:
            enabled = ", ".join(settings.enabled_pipelines) or "none"
            raise PlacementError(
                f"the placement names pipeline {entry.pipeline!r}, which is not an enabled "
                f"pipeline of the config (enabled: {enabled})"
            )
        instances = entry.instances or placed.instances
        yield _Request(entry.pipeline, placed, entry.device, instances, entry.overrides())


def resolve(spec: str, topology: Topology, pipeline: str) -> list[Device]:
    """The devices a device setting names (`auto` excepted)."""
    gpus = [d for d in topology.devices if d.kind == "gpu" and d.placeable]
    slices = [d for d in topology.devices if d.kind == "mig"]
    if spec == "cpu":
        return [d for d in topology.devices if d.kind == "cpu"]
    if spec in ("gpu:*", "mig:*"):
        found = gpus if spec == "gpu:*" else slices
        if not found:
            what = "GPU without MIG" if spec == "gpu:*" else "MIG slice"
            raise PlacementError(f"{pipeline}: {spec} names each {what}, and this host has none")
        return found
    kind, _, ident = spec.partition(":")
    if kind == "mig" and ident and not ident.startswith("MIG-"):
        spec = f"mig:MIG-{ident}"
    device = topology.get(spec)
    if device is None:
        if kind not in ("gpu", "mig") or not ident:
            raise PlacementError(
                f"{pipeline}: unknown device {spec!r} (use cpu, gpu:N, mig:<uuid>, gpu:*, "
                "mig:* or auto)"
            )
        here = ", ".join(d.id for d in topology.placeable if d.kind != "cpu") or "no GPU"
        raise PlacementError(f"{pipeline}: {spec} is not on this host (found: {here})")
    if not device.placeable:
        raise PlacementError(
            f"{pipeline}: {spec} ({device.name}) is in MIG mode: place workers on its "
            "slices (mig:<uuid>, or mig:*)"
        )
    return [device]


def _assign(plan: Plan, request: _Request, device: Device) -> None:
    config = request.config
    guess = estimate(config, on_gpu=device.kind != "cpu")
    if not guess.known and device.kind != "cpu":
        plan.warnings.append(
            f"{request.pipeline} on {device.id}: memory {guess.source} (not counted; set the "
            "pipeline's memory_gb)"
        )
    for instance in range(request.instances):
        plan.assignments.append(
            Assignment(
                request.pipeline,
                device,
                instance,
                guess,
                request.overrides.copy(),
                on_demand=config.residency == "on_demand",
            )
        )


def _need(request: _Request, on_gpu: bool) -> int:
    return estimate(request.config, on_gpu).bytes * request.instances


def _used_bytes(assignments: list[Assignment]) -> dict[str, int]:
    used: dict[str, int] = {}
    for a in assignments:
        used[a.device.id] = used.get(a.device.id, 0) + a.estimate.bytes
    return used


def _fit(request: _Request, topology: Topology, used: dict[str, int]) -> Device:
    """`auto`: the GPU or slice with the most room left that holds every instance; the
    CPU on a host without GPUs."""
    candidates = [d for d in topology.placeable if d.kind != "cpu"]
    if not candidates:
        return next(d for d in topology.devices if d.kind == "cpu")
    need = _need(request, on_gpu=True)
    room = sorted(candidates, key=lambda d: d.free_bytes - used.get(d.id, 0), reverse=True)
    best = room[0]
    left = best.free_bytes - used.get(best.id, 0)
    if need > left:
        raise PlacementError(
            f"{request.pipeline}: {request.instances} worker(s) need {need / GIB:.1f} GiB; "
            f"the device with the most room, {best.id} ({best.name}), has "
            f"{left / GIB:.1f} GiB left: short by {(need - left) / GIB:.1f} GiB"
        )
    return best


def device_need(assignments: list[Assignment]) -> int:
    """The memory a device's workers need at once: every resident model, and the largest
    on-demand one (they take turns for the room the resident ones leave)."""
    resident = sum(a.estimate.bytes for a in assignments if not a.on_demand)
    return resident + max((a.estimate.bytes for a in assignments if a.on_demand), default=0)


def check_fit(plan: Plan, topology: Topology) -> None:
    """Refuse a plan that puts more estimated memory on a GPU or slice than it has free."""
    for device_id, assignments in plan.by_device().items():
        device = assignments[0].device
        if device.kind == "cpu":
            continue
        need = device_need(assignments)
        if need <= device.free_bytes:
            continue
        parts: dict[str, list[Assignment]] = {}
        for a in assignments:
            parts.setdefault(a.pipeline, []).append(a)
        detail = ", ".join(
            f"{name} x{len(group)} at {group[0].estimate.gib:.1f} GiB"
            + (" on demand" if group[0].on_demand else "")
            for name, group in parts.items()
        )
        raise PlacementError(
            f"{device_id} ({device.name}) has {device.free_bytes / GIB:.1f} GiB free but the "
            f"workers placed there need {need / GIB:.1f} GiB ({detail}): short by "
            f"{(need - device.free_bytes) / GIB:.1f} GiB"
        )


def apply_overrides(
    config: PipelineConfig, device: str | None, **knobs: float | None
) -> PipelineConfig:
    """The pipeline as one worker runs it: on `device`, with the placement's knobs."""
    update: dict[str, float | str] = {k: v for k, v in knobs.items() if v is not None}
    if device is not None:
        update["device"] = device
    return PipelineConfig.model_validate({**config.model_dump(by_alias=True), **update})


def concrete_device(spec: str, config: PipelineConfig, topology: Topology, name: str) -> str:
    """A worker started by hand with `auto`, `gpu:*` or `mig:*`: the one device it takes."""
    if spec == "auto":
        return _fit(_Request(name, config, spec, 1, {}), topology, {}).id
    if spec in ("gpu:*", "mig:*"):
        return resolve(spec, topology, name)[0].id
    return spec
