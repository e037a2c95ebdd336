"""The devices of this host, found through NVML: each GPU, each MIG slice, and the CPU.

A GPU with MIG mode on runs CUDA work only inside its slices, so it is listed but never
a place for a worker; each slice is (`mig:<uuid>`). Without NVML (no driver, no GPU,
or `nvidia-ml-py` missing) the host has the CPU alone. A worker is pinned to a device by
`CUDA_VISIBLE_DEVICES` set to the device's UUID (empty for the CPU), which stays right
whatever order CUDA numbers the GPUs in.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

DeviceKind = Literal["cpu", "gpu", "mig"]
GIB = 1024**3


@dataclass(frozen=True)
class Device:
    """One device of a host, as NVML (or the OS, for the CPU) reports it."""

    id: str
    """What placement and a worker's `device` setting call it: `cpu`, `gpu:N`, `mig:UUID`."""
    kind: DeviceKind
    name: str
    uuid: str = ""
    index: int | None = None
    """NVML index of the GPU (of the parent GPU, for a MIG slice)."""
    total_bytes: int = 0
    free_bytes: int = 0
    mig_enabled: bool = False
    """For a GPU: MIG mode is on (only its slices take workers)."""
    parent: str = ""
    """For a MIG slice: the id of its GPU."""

    @property
    def placeable(self) -> bool:
        """A worker may run here (a GPU in MIG mode runs work only in its slices)."""
        return not (self.kind == "gpu" and self.mig_enabled)

    @property
    def visible_devices(self) -> str:
        """The `CUDA_VISIBLE_DEVICES` of a worker pinned here: empty hides every GPU."""
        return "" if self.kind == "cpu" else self.uuid

    # JSON that `mmq devices --json` printed, maybe on another host or version: the
    # fields this one does not know are left out.
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Device:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Usage:
    """One reading of a GPU or MIG slice, for metrics."""

    device: str
    uuid: str
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float | None
    """Busy fraction (0..1) over NVML's last sample period; None on a MIG slice (NVML
    does not report it there)."""


@dataclass
class Topology:
    """What discovery found: the devices, and why there is no GPU when there is none."""

    devices: list[Device] = field(default_factory=list)
    driver: str = ""
    note: str = ""

    @property
    def gpus(self) -> list[Device]:
        return [d for d in self.devices if d.kind == "gpu"]

    @property
    def placeable(self) -> list[Device]:
        return [d for d in self.devices if d.placeable]

    def get(self, device_id: str) -> Device | None:
        return next((d for d in self.devices if d.id == device_id), None)

    def to_json(self) -> str:
        payload = {"driver": self.driver, "note": self.note, "devices": self.dict_devices()}
        return json.dumps(payload, indent=2)

    def dict_devices(self) -> list[dict[str, str | int | bool | None]]:
        return [asdict(d) for d in self.devices]

    @classmethod
    def from_json(cls, text: str) -> Topology:
        """A topology as `mmq devices --json` printed it (on this host or another)."""
        data = json.loads(text)
        devices = [Device.from_dict(d) for d in data["devices"]]
        if not any(d.kind == "cpu" for d in devices):
            devices.append(cpu_device())
        return cls(devices, str(data.get("driver", "")), str(data.get("note", "")))


def cpu_device() -> Device:
    total = _sysconf_bytes("SC_PHYS_PAGES")
    free = _sysconf_bytes("SC_AVPHYS_PAGES")
    return Device(id="cpu", kind="cpu", name=_cpu_name(), total_bytes=total, free_bytes=free)


def gpu_device(
    index: int, uuid: str, name: str, total: int, free: int, mig_enabled: bool
) -> Device:
    return Device(
        id=f"gpu:{index}",
        kind="gpu",
        name=name,
        uuid=uuid,
        index=index,
        total_bytes=total,
        free_bytes=free,
        mig_enabled=mig_enabled,
    )


def mig_device(parent: Device, uuid: str, name: str, total: int, free: int) -> Device:
    return Device(
        id=f"mig:{uuid}",
        kind="mig",
        name=name,
        uuid=uuid,
        index=parent.index,
        total_bytes=total,
        free_bytes=free,
        parent=parent.id,
    )


def discover() -> Topology:
    """The GPUs and MIG slices that NVML sees, and the CPU; the CPU alone without NVML."""
    try:
        import pynvml
    except ImportError:
        return Topology([cpu_device()], note="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Topology([cpu_device()], note=f"no NVIDIA driver or GPU: {exc}")
    try:
        driver = str(pynvml.nvmlSystemGetDriverVersion())
        devices = list(_nvml_devices(pynvml))
    finally:
        pynvml.nvmlShutdown()
    return Topology([*devices, cpu_device()], driver=driver)


def _nvml_devices(nvml: Any) -> Iterable[Device]:
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        gpu = gpu_device(
            index,
            str(nvml.nvmlDeviceGetUUID(handle)),
            str(nvml.nvmlDeviceGetName(handle)),
            int(memory.total),
            int(memory.free),
            _mig_on(nvml, handle),
        )
        yield gpu
        if gpu.mig_enabled:
            yield from _mig_slices(nvml, handle, gpu)


def _mig_on(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # not a MIG-capable GPU
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _mig_slices(nvml: Any, handle: Any, gpu: Device) -> Iterable[Device]:
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:  # an empty slot
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(mig)
        uuid = str(nvml.nvmlDeviceGetUUID(mig))
        yield mig_device(
            gpu, uuid, str(nvml.nvmlDeviceGetName(mig)), int(memory.total), int(memory.free)
        )


def read_usage(device: str) -> Usage | None:
    """A reading of one GPU (`gpu:N`) or MIG slice (`mig:UUID`); None where NVML is
    missing or the device is not found."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return _usage(pynvml, device)
    except pynvml.NVMLError as exc:
        log.warning("cannot read %s through NVML: %s", device, exc)
        return None
    finally:
        pynvml.nvmlShutdown()


def _usage(nvml: Any, device: str) -> Usage | None:
    kind, _, ident = device.partition(":")
    if kind == "gpu" and ident.isdigit():
        handle = nvml.nvmlDeviceGetHandleByIndex(int(ident))
    elif kind == "mig" and ident:
        handle = nvml.nvmlDeviceGetHandleByUUID(ident)
    else:
        return None
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization: float | None = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
    except nvml.NVMLError:  # MIG slices do not report it
        utilization = None
    return Usage(
        device=device,
        uuid=str(nvml.nvmlDeviceGetUUID(handle)),
        name=str(nvml.nvmlDeviceGetName(handle)),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization=utilization,
    )


def _sysconf_bytes(name: str) -> int:
    try:
        return int(os.sysconf(name) * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
