"""docker/: the compose files, their config and placement files, the images and the Grafana
dashboard, checked as files (`docker compose config` runs where Compose is installed).
Building and running the CPU image is `python -m bench.docker`; the test that runs it
here is opt-in (MMQ_DOCKER_TESTS=1): it takes minutes and a Docker daemon."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.prometheus import Snapshot, families
from bench.docker_tools import steps_run
from host.devices import Topology, cpu_device
from host.placement import load_placement, plan_placement
from jobs.schemas.llm_options import LlmOptions
from jobs.schemas.tts import TtsOptions
from jobs.settings import Settings, load_settings
from tests.test_devices import topology
from tuning.deployment import REPO

DOCKER = REPO / "docker"


COMPOSE_FILES = ["compose.yaml", "compose.cpu.yaml", "compose.valkey.yaml"]
PUBLIC_URL = "${MMQ_PUBLIC_URL:-http://localhost:8000}"
NETWORK_STEPS = {"uv", "torch", "deps", "torchaudio"}


def compose(name: str = "compose.yaml") -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / name).read_text())
    assert isinstance(data, dict)
    return data


def mmq_services(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the mmq image (its entrypoint is `mmq`)."""
    return {
        name: s
        for name, s in data["services"].items()
        if str(s.get("image", "")).startswith("${MMQ_IMAGE:-mmq:")
    }


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
    assert services["scheduler"]["command"] == ["scheduler"]
    assert services["api"]["environment"]["MMQ_AUTH__REQUIRED"] == "true"
    workers = {name: s for name, s in services.items() if name.startswith("worker-gpu")}
    assert len(workers) >= 2
    ids = [gpu_ids(s) for s in workers.values()]
    assert all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids)  # one each
    for service in workers.values():
        assert service["command"][:2] == ["workers", "--placement"]
        assert service["environment"]["MMQ_REDIS_URL"] == "redis://redis:6379/0"
        assert service["image"] == "${MMQ_IMAGE:-mmq:cuda}"
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert services["vllm"]["profiles"] == ["llm"] and gpu_ids(services["vllm"])
    assert services["worker-llm"]["command"][:3] == ["worker", "--pipeline", "llm"]
    assert services["flower"]["profiles"] == ["flower"]
    build = services["api"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).is_file()
    assert build["dockerfile"] == "docker/Dockerfile.cuda"


def test_the_cpu_compose_runs_redis_the_api_the_reaper_the_scheduler_and_a_cpu_worker() -> None:
    data = compose("compose.cpu.yaml")
    services = data["services"]
    assert set(services) == {"redis", "api", "reaper", "scheduler", "worker"}
    assert set(mmq_services(data)) == {"api", "reaper", "scheduler", "worker"}
    assert services["redis"]["image"] == "${MMQ_REDIS_IMAGE:-redis:7.4}"
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert services["api"]["command"] == ["api"] and services["reaper"]["command"] == ["reaper"]
    assert services["worker"]["command"] == ["workers"]  # every enabled pipeline, on the CPU
    assert services["api"]["ports"] == ["${MMQ_PORT:-8000}:8000"]
    assert services["api"]["environment"]["MMQ_API__HOST"] == "0.0.0.0"
    for name, service in mmq_services(data).items():
        assert "deploy" not in service, name  # no GPU
        assert service["image"] == "${MMQ_IMAGE:-mmq:cpu}"
        assert service["build"]["dockerfile"] == "docker/Dockerfile.cpu"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        env = service["environment"]
        assert env["MMQ_REDIS_URL"] == "redis://redis:6379/0"
        assert env["MMQ_AUTH__REQUIRED"] == "true"
        assert env["MMQ_STORAGE__LOCAL_SHARED"] == "true"  # `mmq workers` refuses without it
        assert "data:/data" in service["volumes"]
    # What the worker starts: the image's config (the repository's mmq.toml) on the CPU.
    settings = load_settings(REPO / "mmq.toml")
    plan = plan_placement(settings, Topology([cpu_device()]), None)
    planned = {(a.pipeline, a.device.id) for a in plan.assignments}
    assert {("noop", "cpu"), ("tts", "cpu")} <= planned
    assert {device for _, device in planned} == {"cpu"}


@pytest.mark.parametrize("name", ["compose.yaml", "compose.cpu.yaml"])
def test_every_mmq_process_signs_urls_with_the_public_url(name: str) -> None:
    """Workers sign the URLs of their outputs: the public URL is in the environment that
    every mmq service shares, not the API's alone."""
    data = compose(name)
    services = mmq_services(data)
    assert {"api", "reaper", "scheduler"} <= set(services)
    assert any(n.startswith("worker") for n in services)
    for service_name, service in services.items():
        env = service["environment"]
        assert env["MMQ_API__PUBLIC_URL"] == PUBLIC_URL, service_name
    assert data["x-mmq"]["environment"]["MMQ_API__PUBLIC_URL"] == PUBLIC_URL


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_files_work_with_compose_v1(name: str) -> None:
    """Compose v1 (Debian's docker-compose 1.29) refuses a top-level `name`: the commands of
    docs/deployment/docker.md name the project with `-p mmq`."""
    data = compose(name)
    assert "name" not in data and "version" not in data
    assert set(data) <= {"services", "volumes", "x-mmq", "x-gpu-worker"}


def test_the_valkey_override_runs_redis_from_the_mmq_image() -> None:
    redis = compose("compose.valkey.yaml")["services"]["redis"]
    assert redis["image"] == "${MMQ_IMAGE:-mmq:cpu}"
    assert redis["entrypoint"] == ["valkey-server"]
    command = redis["command"]
    assert command[command.index("--dir") + 1] == "/data"  # the `redis` volume
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--protected-mode") + 1] == "no"  # other containers connect
    assert "redis-cli" not in str(redis["healthcheck"]["test"])  # not in the mmq image
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        assert "/opt/mmq/bin/valkey-server" in dockerfile(name).text


def test_every_file_compose_mounts_exists() -> None:
    for name in COMPOSE_FILES:
        for service_name, service in compose(name)["services"].items():
            for volume in service.get("volumes", []):
                source = volume.split(":", 1)[0]
                if source.startswith("."):
                    assert (DOCKER / source).exists(), f"{name}: {service_name} mounts {source}"


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


class Dockerfile:
    """A Dockerfile as instructions (continuation lines joined, comments dropped)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.instructions: list[tuple[str, str]] = []
        pending = ""
        for line in text.splitlines():
            if line.lstrip().startswith("#") or not line.strip():
                continue
            pending += line.rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                keyword, _, rest = pending.strip().partition(" ")
                self.instructions.append((keyword, rest))
                pending = ""

    def index(self, keyword: str, contains: str) -> int:
        found = [
            i for i, (k, rest) in enumerate(self.instructions) if k == keyword and contains in rest
        ]
        assert len(found) == 1, (keyword, contains, found)
        return found[0]

    def args(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for keyword, rest in self.instructions:
            if keyword == "ARG":
                name, eq, value = rest.partition("=")
                out[name] = value.strip('"') if eq else None
        return out

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for keyword, rest in self.instructions:
            if keyword == "ENV":
                out.update(dict(pair.split("=", 1) for pair in rest.split()))
        return out


def dockerfile(name: str) -> Dockerfile:
    return Dockerfile((DOCKER / name).read_text())


def install_steps() -> set[str]:
    """The steps `scripts/install.sh` knows (its `case` of step names)."""
    text = (REPO / "scripts" / "install.sh").read_text()
    found = re.search(r"^\s*([\w|]+)\) \"step_\$step\"", text, re.M)
    assert found, "scripts/install.sh: no case of steps"
    return set(found.group(1).split("|"))


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_install_the_lock_in_layers_before_the_code(name: str) -> None:
    """torch, then the lock, then `COPY . .` and mmq alone: a code change reruns only the
    last layer. Every step the images run is one scripts/install.sh has."""
    image = dockerfile(name)
    assert not re.search(r"^#\s*syntax\s*=", image.text, re.M | re.I)  # no frontend to fetch
    order = [
        image.index("COPY", "scripts/install.sh scripts/install.sh"),
        image.index("COPY", "requirements/uv.txt requirements/uv.txt"),
        image.index("RUN", "install.sh /opt/mmq uv torch"),
        image.index("COPY", "requirements/ requirements/"),
        image.index("RUN", "install.sh /opt/mmq deps torchaudio"),
        image.index("COPY", ". ."),
        image.index("RUN", "install.sh /opt/mmq project check"),
    ]
    assert order == sorted(order)
    copies = [rest for keyword, rest in image.instructions[: order[5]] if keyword == "COPY"]
    assert copies == [
        "scripts/install.sh scripts/install.sh",
        "requirements/uv.txt requirements/uv.txt",
        "requirements/ requirements/",
    ]
    for source in ("scripts/install.sh", "requirements/uv.txt", "requirements/runtime.txt"):
        assert (REPO / source).is_file()
    known = install_steps()
    for keyword, rest in image.instructions:
        if keyword == "RUN" and "install.sh" in rest:
            steps = set(re.search(r"install\.sh /opt/mmq ([\w ]+)", rest).group(1).split())
            assert steps <= known, steps - known
            if steps & NETWORK_STEPS:  # the CA, where one is given, for each download
                assert rest.startswith("--mount=type=secret,id=ca,required=false ")
                assert "if [ -f /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca" in rest
            else:
                assert "--mount" not in rest
    assert "install_tts.sh" not in image.text
    assert image.instructions[-2:] == [
        ("ENTRYPOINT", '["mmq"]'),
        ("CMD", '["up"]' if name == "Dockerfile.cpu" else '["workers"]'),
    ]


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_take_build_arguments_for_a_mirror_a_proxy_and_the_torch_index(name: str) -> None:
    args = dockerfile(name).args()
    cpu = name == "Dockerfile.cpu"
    assert args["BASE_IMAGE"] == (
        "python:3.12-slim" if cpu else "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
    )
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/" + ("cpu" if cpu else "cu128")
    assert args["TORCH_VERSION"]
    for name_ in ("PIP_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_FIND_LINKS"):
        assert args[name_] is None  # unset unless given: pip reads an empty one as a value
    if not cpu:
        assert args["TORCH_ALSO"] == "torchaudio==${TORCH_VERSION}"
    # the FROM uses the argument
    assert ("FROM", "${BASE_IMAGE}") in dockerfile(name).instructions


@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_images_serve_a_reachable_api_and_own_data_as_uid_1000(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = dockerfile(name)
    assert re.findall(r"--uid (\d+)", image.text) == ["1000"]
    assert ("USER", "mmq") in image.instructions
    env = image.env()
    assert env["MMQ_API__HOST"] == "0.0.0.0" and env["MMQ_AUTH__REQUIRED"] == "true"
    assert env["MMQ_API__PUBLIC_URL"] == "http://localhost:8000"
    assert env["MMQ_DATA_DIR"] == "/data" and env["UV_COMPILE_BYTECODE"] == "1"
    # The settings a container starts with are valid (0.0.0.0 needs auth.required).
    for key, value in env.items():
        if key.startswith("MMQ_") and key != "MMQ_DATA_DIR":
            monkeypatch.setenv(key, value)
    settings = load_settings(REPO / "mmq.toml")
    assert settings.api.host == "0.0.0.0" and settings.auth.required
    assert settings.public_url == "http://localhost:8000"


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".venv", ".git", "data", "build", ".whl", "test-results", "bench/results"} <= ignored


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
    "lack; the other tests here check the same files' services, devices and profiles",
)
@pytest.mark.parametrize(
    "files",
    [["compose.yaml"], ["compose.cpu.yaml"], ["compose.cpu.yaml", "compose.valkey.yaml"]],
)
def test_docker_compose_config_accepts_the_files(files: list[str]) -> None:
    argv = COMPOSE
    assert argv is not None
    env = {**os.environ, "MMQ_SIGNING_SECRET": "x" * 32}
    profiles = ["--profile", "llm", "--profile", "flower", "--profile", "monitoring"]
    paths = [arg for name in files for arg in ("-f", str(DOCKER / name))]
    checked = subprocess.run(
        [*argv, "-p", "mmq", *paths, "--project-directory", str(DOCKER), *profiles, "config", "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr


def test_bench_docker_says_when_no_docker_daemon_answers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.docker", "--json", str(tmp_path / "docker.json")],
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "bench.docker cannot run here:" in done.stderr
    assert not (tmp_path / "docker.json").exists()


def test_bench_docker_reads_which_build_steps_ran() -> None:
    log = """#4 [ 1/4] FROM docker.io/library/mmq-base:bookworm
#4 DONE 0.0s
#5 [ 2/4] RUN bash scripts/install.sh /opt/mmq deps torchaudio
#5 CACHED
#6 [ 3/4] COPY . .
#6 DONE 0.1s
#7 [ 4/4] RUN bash scripts/install.sh /opt/mmq project check     && python -m compileall
#7 DONE 3.8s
"""
    assert steps_run(log) == "ran COPY . ., install.sh project check; 1 of 3 cached"
    assert steps_run(log.replace("#5 CACHED", "#5 DONE 9s")) == "all 3 steps after FROM ran"


@pytest.mark.skipif(
    os.environ.get("MMQ_DOCKER_TESTS") != "1",
    reason="builds the CPU image and runs it (docker run, compose): minutes, a Docker daemon "
    "(which changes the host's firewall) and a registry or stand-ins; set MMQ_DOCKER_TESTS=1, "
    "and MMQ_DOCKER_ARGS for bench.docker's options (`python -m bench.docker` is the same)",
)
def test_the_cpu_image_builds_and_serves_jobs_as_the_readme_says(tmp_path: Path) -> None:
    out = tmp_path / "docker.json"
    options = shlex.split(os.environ.get("MMQ_DOCKER_ARGS", ""))
    done = subprocess.run(
        [sys.executable, "-m", "bench.docker", "--json", str(out), *options],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode == 2:  # this host cannot run the proof (bench.docker's CannotRun)
        why = (done.stderr.strip().splitlines() or ["no reason printed"])[-1]
        pytest.fail(
            f"MMQ_DOCKER_TESTS=1 asked for the image proof, and this host cannot run it: {why}"
        )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"]
    names = [step["name"] for step in report["steps"]]
    for name in ("build", "rebuild after a one-line code change", "compose: tts job"):
        assert name in names
