"""The Kubernetes manifests (deploy/k8s): each overlay rendered with `kubectl kustomize`,
every object checked against the Kubernetes schemas (kubernetes-validate, strict: an
unknown field fails too), KEDA's ScaledObjects against the fields of KEDA's CRD that they
use (KEDA's schema is not among kubernetes-validate's), and the properties a deployment
rests on: a ScaledObject per worker on its pipeline's signal, GPU workers asking for their
GPU or MIG slice, the probes, the grace on SIGTERM, the disruption budgets.

Each worker's settings are read as mmq reads them: the rendered mmq.toml and environment
through `load_settings`. No cluster runs here: what a cluster would refuse beyond the
schemas (a missing Secret, the device plugin's resources) is not seen.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from jobs.settings import Settings, load_settings, on_gpu
from tests.k8s_keda import check_scaled_object

ROOT = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUBECTL = shutil.which("kubectl")
# The oldest Kubernetes still common on managed clusters, and the newest the schemas know.
KUBE_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
GPU_RESOURCE = {"cpu": None, "gpu": "nvidia.com/gpu", "gpu-mig": "nvidia.com/mig-1g.10gb"}
GPU_DEVICE = {"gpu": "gpu:0", "gpu-mig": "mig:*"}
KUSTOMIZATIONS = {name: ROOT / "overlays" / name for name in GPU_RESOURCE}
KUSTOMIZATIONS["example"] = ROOT / "example"
"""The overlays, and the docs' example of a cluster's own (on the gpu overlay)."""
KIND = {**{name: name for name in GPU_RESOURCE}, "example": "gpu"}
HAND_MADE_SECRETS = {"mmq-secrets", "mmq-redis"}
"""Made with `kubectl create secret` (docs/deployment/kubernetes.md), never rendered."""

needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed: the overlays cannot be rendered"
)

Obj = dict[str, Any]


def render(path: Path) -> list[Obj]:
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize {path}: {done.stderr}"
    return [o for o in yaml.safe_load_all(done.stdout) if o]


@pytest.fixture(
    scope="module",
    params=[pytest.param(name, marks=needs_kubectl) for name in sorted(KUSTOMIZATIONS)],
)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    name: str = request.param
    return name, render(KUSTOMIZATIONS[name])


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workers(objs: list[Obj]) -> list[Obj]:
    return [
        d
        for d in of_kind(objs, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]


def container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deployment["metadata"]["name"]
    result: Obj = containers[0]
    return result


def pipeline_of(deployment: Obj) -> str:
    args = container(deployment)["args"]
    assert args[:2] == ["worker", "--pipeline"] and len(args) == 3, args
    name: str = args[2]
    assert deployment["metadata"]["labels"]["mmq.dev/pipeline"] == name
    return name


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items()) and bool(wanted)


def configmap_by_prefix(objs: list[Obj], prefix: str) -> Obj:
    """A generated ConfigMap (kustomize adds a hash to its name)."""
    found = [o for o in of_kind(objs, "ConfigMap") if o["metadata"]["name"].startswith(prefix)]
    assert len(found) == 1, prefix
    return found[0]


def environment(objs: list[Obj], ctr: Obj) -> dict[str, str]:
    """What a container's environment holds that the manifests say: its ConfigMaps'
    entries, then its own `env` values."""
    env: dict[str, str] = {}
    for source in ctr.get("envFrom", []):
        if "configMapRef" in source:
            env.update(named(objs, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in ctr.get("env", []) if "value" in e})
    return env


def settings_of(
    objs: list[Obj], deployment: Obj, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The settings the pod's mmq process reads: the mounted mmq.toml, its environment."""
    config = tmp / f"{deployment['metadata']['name']}.toml"
    config.write_text(configmap_by_prefix(objs, "mmq-config")["data"]["mmq.toml"])
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("MMQ_")]:
            m.delenv(name)
        for name, value in environment(objs, container(deployment)).items():
            m.setenv(name, value)
        m.setenv("MMQ_CONFIG_FILE", str(config))
        return load_settings(config)


# Every object valid -------------------------------------------------------------------


VALID: set[str] = set()
"""Objects found valid already (the overlays share most of theirs)."""


def validate(obj: Obj) -> None:
    """Raise unless `obj` is valid: a core object against the Kubernetes schemas of
    each version in KUBE_VERSIONS (strict), a ScaledObject against KEDA's fields."""
    text = json.dumps(obj, sort_keys=True)
    if text in VALID:
        return
    if obj["apiVersion"].startswith("keda.sh/"):
        check_scaled_object(obj)
    else:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    VALID.add(text)


def test_every_object_of_every_overlay_is_valid(overlay: tuple[str, list[Obj]]) -> None:
    name, objs = overlay
    assert objs, name
    for obj in objs:
        validate(obj)


@needs_kubectl
def test_the_base_alone_is_valid() -> None:
    for obj in render(ROOT / "base"):
        validate(obj)


def resource_files() -> list[Path]:
    """The files of plain objects that the kustomizations list (not patches)."""
    files = []
    for kustomization in ROOT.rglob("kustomization.yaml"):
        listed = yaml.safe_load(kustomization.read_text()).get("resources", [])
        files += [kustomization.parent / r for r in listed if r.endswith(".yaml")]
    return sorted(files)


@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_manifest_file_is_valid_without_kubectl(path: Path) -> None:
    # What a machine without kubectl still checks: the objects as written (no overlay,
    # no namespace, the images' names unset).
    for obj in yaml.safe_load_all(path.read_text()):
        if obj:
            validate(obj)


def test_a_broken_object_is_refused() -> None:
    """The checks above can fail: an unknown field, a wrong type, a KEDA trigger with a
    number where the CRD wants a string."""
    deployment = yaml.safe_load((ROOT / "base" / "reaper.yaml").read_text())
    validate(deployment)
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(jsonschema.ValidationError):
        validate(typo)
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate(wrong)
    docs = list(yaml.safe_load_all((ROOT / "base" / "worker-tts.yaml").read_text()))
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    validate(scaled)
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


# What a deployment rests on -------------------------------------------------------------


def test_each_worker_deployment_scales_on_its_pipelines_signal(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objs = overlay
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s for s in of_kind(objs, "ScaledObject")}
    prometheus = named(objs, "ConfigMap", "mmq-autoscale")["data"]["prometheusUrl"]
    found = workers(objs)
    assert found
    for deployment in found:
        name, pipeline = deployment["metadata"]["name"], pipeline_of(deployment)
        assert name in scaled, f"{name} has no ScaledObject"
        # KEDA owns the replica count: a `replicas` here would reset it on each apply.
        assert "replicas" not in deployment["spec"], name
        (trigger,) = scaled.pop(name)["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] == "AverageValue"
        meta = trigger["metadata"]
        assert meta["query"] == f'max(mmq_pipeline_desired_workers{{pipeline="{pipeline}"}})'
        assert meta["threshold"] == "1"  # replicas = the desired workers
        assert meta["serverAddress"] == prometheus  # components/autoscale's replacement
    assert not scaled, f"ScaledObjects of no worker: {sorted(scaled)}"


def test_every_enabled_pipeline_has_one_worker_deployment(
    overlay: tuple[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objs = overlay
    api = named(objs, "Deployment", "mmq-api")
    enabled = set(settings_of(objs, api, tmp_path, monkeypatch).enabled_pipelines)
    served = [pipeline_of(d) for d in workers(objs)]
    assert sorted(served) == sorted(enabled)


def test_workers_ask_for_their_device(
    overlay: tuple[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, objs = overlay
    resource = GPU_RESOURCE[KIND[name]]
    gpu_workers = 0
    for deployment in workers(objs):
        ctr = container(deployment)
        config = settings_of(objs, deployment, tmp_path, monkeypatch).pipelines[
            pipeline_of(deployment)
        ]
        limits = ctr["resources"].get("limits", {})
        nvidia = {k: v for k, v in limits.items() if k.startswith("nvidia.com/")}
        if on_gpu(config.device):
            gpu_workers += 1
            assert resource is not None, f"{name}: a GPU worker on a CPU overlay"
            assert nvidia == {resource: 1}, deployment["metadata"]["name"]
            assert config.device == GPU_DEVICE[KIND[name]]
            assert image_name(ctr) == "mmq-cuda"
            # The device plugin pins the pod: nothing in the pod may narrow it further.
            assert "CUDA_VISIBLE_DEVICES" not in environment(objs, ctr)
        else:
            assert config.device == "cpu"
            assert nvidia == {}, deployment["metadata"]["name"]
            assert environment(objs, ctr)["CUDA_VISIBLE_DEVICES"] == ""
            assert image_name(ctr) == "mmq-cpu"
    assert (gpu_workers > 0) == (resource is not None)
    others = [o for o in of_kind(objs, "Deployment") if o not in workers(objs)]
    for deployment in others:
        assert ctr_has_no_gpu(deployment), deployment["metadata"]["name"]


def image_name(ctr: Obj) -> str:
    """The image's last path part (Dockerfile.cpu's or .cuda's), once `images:` set its
    tag."""
    path, _, tag = ctr["image"].rpartition(":")
    assert tag and "/" not in tag, ctr["image"]
    return path.rsplit("/", 1)[-1]


def ctr_has_no_gpu(deployment: Obj) -> bool:
    limits = container(deployment).get("resources", {}).get("limits", {})
    return not any(k.startswith("nvidia.com/") for k in limits)


def test_on_demand_pipelines_scale_to_zero(
    overlay: tuple[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objs = overlay
    scaled = {s["spec"]["scaleTargetRef"]["name"]: s["spec"] for s in of_kind(objs, "ScaledObject")}
    for deployment in workers(objs):
        pipeline = pipeline_of(deployment)
        config = settings_of(objs, deployment, tmp_path, monkeypatch).pipelines[pipeline]
        spec = scaled[deployment["metadata"]["name"]]
        on_demand = config.residency == "on_demand"
        assert (spec["minReplicaCount"] == 0) == on_demand, pipeline
        assert spec["maxReplicaCount"] >= 1


def test_api_probes_and_service(
    overlay: tuple[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objs = overlay
    api = named(objs, "Deployment", "mmq-api")
    ctr = container(api)
    # Workers scale to zero: a kind without one must not take the API out of its Service.
    assert settings_of(objs, api, tmp_path, monkeypatch).autoscale.ready_without_workers
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ctr["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert ctr[probe]["httpGet"]["port"] in ports
    env = environment(objs, ctr)
    assert env["MMQ_API__HOST"] == "0.0.0.0"
    assert int(env["MMQ_API__PORT"]) == ports["http"]
    service = named(objs, "Service", "mmq-api")
    labels = api["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, labels)
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_workers_end_within_their_grace(
    overlay: tuple[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet's SIGKILL comes after terminationGracePeriodSeconds: the worker's own
    grace (jobs run on, then the rest is handed back) must end well before it."""
    _, objs = overlay
    for deployment in workers(objs):
        settings = settings_of(objs, deployment, tmp_path, monkeypatch)
        period = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        # Room for the hand-back and the exit after the grace.
        assert period >= settings.worker.shutdown_grace_s + 10, deployment["metadata"]["name"]


def test_disruption_budgets_cover_the_api_workers_and_redis(
    overlay: tuple[str, list[Obj]],
) -> None:
    _, objs = overlay
    budgets = of_kind(objs, "PodDisruptionBudget")
    guarded = [*of_kind(objs, "Deployment"), *of_kind(objs, "StatefulSet")]
    for owner in guarded:
        component = owner["metadata"]["labels"]["app.kubernetes.io/component"]
        if component not in ("api", "worker", "redis"):
            continue
        labels = owner["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        assert len(covering) == 1, owner["metadata"]["name"]
        spec = covering[0]["spec"]
        # A worker Deployment may be at one pod, or none: maxUnavailable lets a drain go on.
        assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == 1
        if component == "api":
            assert owner["spec"]["replicas"] > spec["minAvailable"]
    assert of_kind(objs, "StatefulSet"), "the overlays run Redis with Sentinel"


def test_what_the_pods_refer_to_is_there(overlay: tuple[str, list[Obj]]) -> None:
    _, objs = overlay
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for owner in [*of_kind(objs, "Deployment"), *of_kind(objs, "StatefulSet")]:
        pod = owner["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in names
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in names
        for ctr in pod["containers"]:
            for source in ctr.get("envFrom", []):
                if "configMapRef" in source:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in HAND_MADE_SECRETS
            for e in ctr.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in HAND_MADE_SECRETS
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"mmq"}


def test_every_mmq_variable_is_a_setting(overlay: tuple[str, list[Obj]]) -> None:
    """mmq ignores an MMQ_ variable it does not know: a typo would pass silently."""
    _, objs = overlay
    for configmap in of_kind(objs, "ConfigMap"):
        for name in configmap.get("data", {}):
            if name.startswith("MMQ_"):
                assert is_setting(name), name
    for deployment in of_kind(objs, "Deployment"):
        for e in container(deployment).get("env", []):
            if e["name"].startswith("MMQ_"):
                assert is_setting(e["name"]), e["name"]


def is_setting(variable: str) -> bool:
    """Whether MMQ_A__B__C names a field of the settings (a dict's keys are free), or is
    MMQ_CONFIG_FILE (read before them, by `config_file_path`)."""
    if variable == "MMQ_CONFIG_FILE":
        return True
    return _leads_to_field(Settings, variable.removeprefix("MMQ_").lower().split("__"))


def _leads_to_field(annotation: Any, parts: list[str]) -> bool:
    if not parts:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(parts[0])
        return field is not None and _leads_to_field(field.annotation, parts[1:])
    if get_origin(annotation) is dict:  # any key, then what its values are
        return _leads_to_field(get_args(annotation)[1], parts[1:])
    if get_origin(annotation) in (Union, UnionType):
        return any(_leads_to_field(arg, parts) for arg in get_args(annotation))
    return annotation is Any  # free-form (a pipeline's options); a leaf has no parts left
