"""docker/: the compose file, its config and placement files, the images and the Grafana
dashboard, checked as files (no Docker daemon here; `docker compose config` runs where
the compose plugin is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.metrics import Snapshot, families
from host.devices import Topology, cpu_device
from host.placement import load_placement, plan_placement
from jobs.schemas.llm import LlmOptions
from jobs.schemas.tts import TtsOptions
from jobs.settings import Settings, load_settings
from tests.support.deploy import REPO
from tests.test_devices import topology

DOCKER = REPO / "docker"


def compose() -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def gpu_ids(service: dict[str, Any]) -> list[str]:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert [d["driver"] for d in devices] == ["nvidia"] and devices[0]["capabilities"] == ["gpu"]
    return [str(i) for d in devices for i in d["device_ids"]]


def test_compose_has_each_part_of_a_gpu_deployment() -> None:
    services = compose()["services"]
    assert "--appendonly" in services["redis"]["command"]
    assert (
        services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1]
        == "yes"
    )
    assert services["api"]["command"] == ["api"] and services["reaper"]["command"] == ["reaper"]
    assert services["api"]["environment"]["MMQ_AUTH__REQUIRED"] == "true"
    workers = {name: s for name, s in services.items() if name.startswith("worker-gpu")}
    assert len(workers) >= 2
    ids = [gpu_ids(s) for s in workers.values()]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids)  # one each
    for service in workers.values():
        assert service["command"][:2] == ["workers", "--placement"]
        assert service["environment"]["MMQ_REDIS_URL"] == "redis://redis:6379/0"
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert services["vllm"]["profiles"] == ["llm"] and gpu_ids(services["vllm"])
    assert services["worker-llm"]["command"][:3] == ["worker", "--pipeline", "llm"]
    assert services["flower"]["profiles"] == ["flower"]
    build = services["api"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()


def test_every_file_compose_mounts_exists() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}"


def test_the_compose_config_and_placements_plan_on_a_gpu_and_the_cpu() -> None:
    settings = load_settings(DOCKER / "mmq.toml")
    TtsOptions.model_validate(settings.pipelines["tts"].options)
    LlmOptions.model_validate(settings.pipelines["llm"].options)
    one_gpu = topology("two_a100_40gb.json")  # what a worker-gpuN container sees: one GPU
    one_gpu = Topology([d for d in one_gpu.devices if d.id != "gpu:1"])
    plan = plan_placement(settings, one_gpu, load_placement(DOCKER / "placement-gpu.toml"))
    assert [(a.pipeline, a.device.id) for a in plan.assignments] == [("asr", "gpu:0")]
    assert plan.warnings == []
    plan = plan_placement(
        settings, Topology([cpu_device()]), load_placement(DOCKER / "placement-cpu.toml")
    )
    assert [(a.pipeline, a.device.id) for a in plan.assignments] == [("tts", "cpu")] * 2


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_install_torch_first_then_mmq_and_the_tts_script(name: str) -> None:
    text = (DOCKER / name).read_text()
    torch = text.index('pip install "torch==')
    mmq = text.index('pip install -e ".[asr,tts,image')
    assert torch < mmq < text.index("bash scripts/install_tts.sh")
    assert 'ENTRYPOINT ["mmq"]' in text
    assert ("whl/cpu" in text) == (name == "Dockerfile.cpu")


def exported_names() -> set[str]:
    names = set()
    for family in families(Snapshot(), Settings()):
        names.add(family.name)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        names.update(family.name + s for s in suffixes.get(family.type, []))
    return names


def test_the_dashboard_uses_only_exported_metrics() -> None:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "mmq.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for expr in exprs for m in re.findall(r"\bmmq_[a-z_]+", expr)}
    assert used and used <= exported_names(), used - exported_names()
    for metric in ("mmq_gpu_utilization_ratio", "mmq_job_time_per_output_token_seconds_bucket"):
        assert metric in used
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["api:8000"]


def compose_argv() -> list[str] | None:
    """`docker compose` (v2), else the old `docker-compose` (v1), else None."""
    docker = shutil.which("docker")
    if docker:
        v2 = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if v2.returncode == 0:
            return [docker, "compose"]
    v1 = shutil.which("docker-compose")
    return [v1] if v1 else None


COMPOSE = compose_argv()


@pytest.mark.skipif(
    COMPOSE is None,
    reason="needs Docker Compose (`docker compose` or `docker-compose`), which CI hosts "
    "lack; the other tests here check the same file's services, devices and profiles",
)
def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    argv = COMPOSE
    assert argv is not None
    path = DOCKER / "compose.yaml"
    if len(argv) == 1:  # v1 predates the top-level `name`; check the rest
        lines = path.read_text().splitlines(keepends=True)
        path = tmp_path / "compose.yaml"
        path.write_text("".join(line for line in lines if not line.startswith("name:")))
    env = {**os.environ, "MMQ_SIGNING_SECRET": "x" * 32}
    profiles = ["--profile", "llm", "--profile", "flower", "--profile", "monitoring"]
    checked = subprocess.run(
        [*argv, "-f", str(path), "--project-directory", str(DOCKER), *profiles, "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
