"""How busy the device is while a bench runs: NVML on a GPU, /proc/stat on the CPU.

A `Sampler` thread reads the device every `interval_s` and keeps every reading; the
bench marks the spans it measures (`with sampler.phase("asr batched"):`) and asks for a
span's summary: the mean and median busy share and the most memory used. On a GPU,
"busy" is NVML's utilization rate (the share of the last sample period in which a kernel
ran) and memory is the whole device's; on the CPU it is the share of all cores not idle,
and memory is the host's RAM in use.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MIB = 1024**2


@dataclass(frozen=True)
class Reading:
    t_s: float
    """Seconds since the sampler started."""
    busy_pct: float
    mem_mib: float


@dataclass(frozen=True)
class Span:
    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Usage:
    """The device over one span."""

    busy_mean_pct: float
    busy_p50_pct: float
    mem_max_mib: float
    samples: int


class Probe(Protocol):
    kind: str
    """`gpu` or `cpu`."""
    name: str

    def read(self) -> tuple[float, float]:
        """(busy %, memory used MiB) now."""
        ...

    def close(self) -> None: ...


def nvml_reason() -> str | None:
    """None where NVML sees a GPU; else why not (no bindings, no driver, no device)."""
    try:
        import pynvml
    except ImportError:
        return "the NVML bindings (nvidia-ml-py) are not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not start ({exc}): no NVIDIA driver here"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML finds no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


class NvmlProbe:
    kind = "gpu"

    def __init__(self, index: int = 0) -> None:
        import pynvml

        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.name = str(pynvml.nvmlDeviceGetName(self._handle))
        self.total_mib = pynvml.nvmlDeviceGetMemoryInfo(self._handle).total / MIB

    def read(self) -> tuple[float, float]:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return float(rates.gpu), memory.used / MIB

    def process_mib(self) -> dict[int, float]:
        """GPU memory of each process that holds a CUDA context on this GPU."""
        found = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        return {int(p.pid): (p.usedGpuMemory or 0) / MIB for p in found}

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class CpuProbe:
    kind = "cpu"

    def __init__(self) -> None:
        self.name = _cpu_name()
        self._last = _cpu_times()

    def read(self) -> tuple[float, float]:
        now = _cpu_times()
        busy = now[0] - self._last[0]
        total = now[1] - self._last[1]
        self._last = now
        return (100.0 * busy / total if total else 0.0), _ram_used_mib()

    def close(self) -> None:
        pass


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores; idle and iowait are not busy."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _ram_used_mib() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return kib / 1024


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "CPU"


class Sampler:
    """Reads `probe` every `interval_s` on a thread, from `start()` to `stop()`."""

    def __init__(self, probe: Probe, interval_s: float = 0.2) -> None:
        self.probe = probe
        self.interval_s = interval_s
        self.readings: list[Reading] = []
        self.spans: list[Span] = []
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def now_s(self) -> float:
        return time.monotonic() - self._t0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.probe.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            busy, mem = self.probe.read()
            self.readings.append(Reading(round(self.now_s(), 3), busy, mem))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark the span of the `with` block as `name`."""
        start = self.now_s()
        try:
            yield
        finally:
            self.spans.append(Span(name, start, self.now_s()))

    def usage(self, name: str) -> Usage | None:
        """The device over every span called `name`; None without readings in them."""
        windows = [(s.start_s, s.end_s) for s in self.spans if s.name == name]
        inside = [r for r in self.readings if any(a <= r.t_s <= b for a, b in windows)]
        if not inside:
            return None
        busy = [r.busy_pct for r in inside]
        return Usage(
            busy_mean_pct=statistics.fmean(busy),
            busy_p50_pct=statistics.median(busy),
            mem_max_mib=max(r.mem_mib for r in inside),
            samples=len(inside),
        )


def make_probe(device: str) -> Probe:
    """NVML's first GPU for `cuda`, the host's CPU otherwise."""
    return NvmlProbe() if device == "cuda" else CpuProbe()
