"""Placement: placement files and the automatic plan on the topologies of test_devices,
memory estimates from real safetensors headers, and the worker processes `mmq up` would
start (argv, CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from host.devices import GIB, Topology, cpu_device
from host.model_memory import estimate
from host.placement import (
    PlacementError,
    PlacementFile,
    apply_overrides,
    concrete_device,
    load_placement,
    plan_placement,
)
from host.up import deployment_specs, host_plan, worker_groups
from jobs.settings import KINDS_THAT_NEED_A_MODEL, PipelineConfig, Settings
from tests.test_devices import topology

CPU_ONLY = Topology([cpu_device()])
TWO_GPUS = topology("two_a100_40gb.json")
H100_MIG = topology("h100_mig_7x1g10gb.json")


def settings(**pipelines: dict[str, Any]) -> Settings:
    """Pipelines named for their kinds; an image or LLM one names a model (else it is off)."""
    return Settings(
        pipelines={
            name: PipelineConfig(
                kind=name,
                impl="harness.pipelines:EchoPipeline",
                **({"model": f"org/{name}"} if name in KINDS_THAT_NEED_A_MODEL else {}),
                **cfg,
            )
            for name, cfg in pipelines.items()
        }
    )


def place(*entries: dict[str, Any]) -> PlacementFile:
    return PlacementFile.model_validate({"place": list(entries)})


def where(plan: Any) -> list[tuple[str, str, int]]:
    return [(a.pipeline, a.device.id, a.instance) for a in plan.assignments]


def test_without_gpu_or_file_every_pipeline_runs_where_configured() -> None:
    s = settings(noop={}, tts={"instances": 2}, image={"enabled": False}, asr={"device": "auto"})
    plan = plan_placement(s, CPU_ONLY)
    assert where(plan) == [
        ("noop", "cpu", 0),
        ("tts", "cpu", 0),
        ("tts", "cpu", 1),
        ("asr", "cpu", 0),
    ]
    specs = deployment_specs(s, None, plan)
    workers = [spec for spec in specs if spec.name.startswith("worker")]
    assert [spec.name for spec in specs[:2]] == ["api", "reaper"]
    assert all(spec.env == {"CUDA_VISIBLE_DEVICES": "", "NOSETPS": "1"} for spec in workers)
    assert workers[2].argv[-6:] == ["--pipeline", "tts", "--instance", "1", "--device", "cpu"]


def test_a_gpu_pipeline_on_a_host_without_gpu_is_refused() -> None:
    with pytest.raises(PlacementError, match=r"asr: gpu:0 is not on this host \(found: no GPU\)"):
        plan_placement(settings(asr={"device": "gpu:0"}), CPU_ONLY)


def test_placement_file_pins_each_gpu_by_uuid_with_its_knobs(tmp_path: Path) -> None:
    path = tmp_path / "place.toml"
    path.write_text(
        '[[place]]\npipeline = "asr"\ndevice = "gpu:*"\nmax_batch = 16\nconcurrency = 32\n\n'
        '[[place]]\npipeline = "tts"\ndevice = "gpu:1"\ninstances = 3\n\n'
        '[[place]]\npipeline = "noop"\ndevice = "cpu"\n'
    )
    s = settings(asr={"max_batch": 4}, tts={}, noop={}, image={})  # image: not placed here
    plan = host_plan(s, path, TWO_GPUS)
    assert where(plan) == [
        ("asr", "gpu:0", 0), ("asr", "gpu:1", 0),
        ("tts", "gpu:1", 0), ("tts", "gpu:1", 1), ("tts", "gpu:1", 2),
        ("noop", "cpu", 0),
    ]  # fmt: skip
    specs = {spec.name: spec for spec in deployment_specs(s, path, plan, services=False)}
    asr1 = specs["worker asr#0 on gpu:1"]
    assert asr1.env == {
        "CUDA_VISIBLE_DEVICES": "GPU-9e4b7d21-33a0-4f6c-b812-5a7c1e0d9f42",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NOSETPS": "1",  # the command line and environment stay as launched
    }
    assert "--max-batch=16" in asr1.argv and "--concurrency=32" in asr1.argv
    assert asr1.argv[-2:] == ["--config", str(path)]
    assert specs["worker noop#0 on cpu"].env == {"CUDA_VISIBLE_DEVICES": "", "NOSETPS": "1"}
    assert "api" not in specs


def test_automatic_placement_spreads_models_by_room_and_refuses_what_cannot_fit() -> None:
    big = {"device": "auto", "memory_gb": 30}
    s = settings(llm=big, image=big, asr={"device": "auto", "memory_gb": 5})
    plan = plan_placement(s, TWO_GPUS)
    devices = {a.pipeline: a.device.id for a in plan.assignments}
    assert devices["llm"] != devices["image"]  # 30 + 30 GiB never share a 40 GB card
    assert plan.warnings == []
    s = settings(llm=big, image=big, video=big)
    with pytest.raises(PlacementError) as refused:
        plan_placement(s, TWO_GPUS)
    message = str(refused.value)
    assert "need 30.0 GiB" in message and "NVIDIA A100-SXM4-40GB" in message
    assert "has 9.6 GiB left: short by 20.4 GiB" in message


def test_an_explicit_placement_over_a_device_memory_names_the_shortfall() -> None:
    s = settings(image={"memory_gb": 12}, asr={"memory_gb": 20})
    placement = place(
        {"pipeline": "image", "device": "gpu:0", "instances": 2},
        {"pipeline": "asr", "device": "gpu:0"},
    )
    with pytest.raises(PlacementError) as refused:
        plan_placement(s, TWO_GPUS, placement)
    assert str(refused.value) == (
        "gpu:0 (NVIDIA A100-SXM4-40GB) has 39.6 GiB free but the workers placed there need "
        "44.0 GiB (image x2 at 12.0 GiB, asr x1 at 20.0 GiB): short by 4.4 GiB"
    )


def test_on_demand_models_take_turns_for_the_room_resident_ones_leave() -> None:
    """Five models on one 40 GB GPU: ASR resident, four on demand whose sum (66 GiB) is
    over the GPU but whose largest fits beside it."""
    on_demand = {"residency": "on_demand"}
    s = settings(
        asr={"memory_gb": 4},
        llm={"memory_gb": 30, **on_demand},
        image={"memory_gb": 12, **on_demand},
        tts={"memory_gb": 4, **on_demand},
        embed={"memory_gb": 20, **on_demand},
    )
    entries = [{"pipeline": name, "device": "gpu:0"} for name in s.pipelines]
    plan = plan_placement(s, TWO_GPUS, place(*entries))
    assert {device for _, device, _ in where(plan)} == {"gpu:0"}
    bigger = settings(asr={"memory_gb": 12}, llm={"memory_gb": 30, **on_demand})
    with pytest.raises(PlacementError) as refused:
        plan_placement(
            bigger, TWO_GPUS, place(*[{"pipeline": n, "device": "gpu:0"} for n in ("asr", "llm")])
        )
    assert "need 42.0 GiB (asr x1 at 12.0 GiB, llm x1 at 30.0 GiB on demand)" in str(refused.value)


def test_on_demand_pipelines_that_share_a_process_get_one_worker_per_device() -> None:
    """Three on-demand models on a GPU share one process (`share_process`); an on-demand
    model that does not, and a resident one, keep a process each."""
    shared = {"residency": "on_demand", "share_process": True, "memory_gb": 4}
    s = settings(
        asr={"memory_gb": 4},
        tts=shared,
        image=shared,
        embed=shared,
        llm={"residency": "on_demand", "memory_gb": 20},
    )
    entries = [{"pipeline": name, "device": "gpu:0"} for name in s.pipelines]
    plan = plan_placement(s, TWO_GPUS, place(*entries))
    workers = {spec.name: spec.argv for spec in deployment_specs(s, None, plan, services=False)}
    assert sorted(workers) == [
        "worker asr#0 on gpu:0", "worker llm#0 on gpu:0", "worker tts+image+embed#0 on gpu:0",
    ]  # fmt: skip
    argv = workers["worker tts+image+embed#0 on gpu:0"]
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--pipeline"] == [
        "tts", "image", "embed",
    ]  # fmt: skip
    two = settings(tts=shared, image=shared)
    knobs = place({"pipeline": "tts", "device": "gpu:0", "concurrency": 2},
                  {"pipeline": "image", "device": "gpu:0"})  # fmt: skip
    with pytest.raises(PlacementError, match="tts, image share a process: set their knobs"):
        worker_groups(two, plan_placement(two, TWO_GPUS, knobs))
    with pytest.raises(ValueError, match="share_process needs residency"):
        PipelineConfig(kind="tts", impl="x:Y", share_process=True)


def test_mig_slices_take_workers_and_the_mig_gpu_does_not() -> None:
    s = settings(tts={"memory_gb": 2}, asr={"memory_gb": 12})
    plan = plan_placement(s, H100_MIG, place({"pipeline": "tts", "device": "mig:*"}))
    assert len(plan.assignments) == 7
    assert {a.device.kind for a in plan.assignments} == {"mig"}
    specs = deployment_specs(s, None, plan, services=False)
    assert {spec.env["CUDA_VISIBLE_DEVICES"] for spec in specs} == {
        d.uuid for d in H100_MIG.devices if d.kind == "mig"
    }
    one = next(d for d in H100_MIG.devices if d.kind == "mig")
    bare = one.uuid.removeprefix("MIG-")
    plan = plan_placement(
        s, H100_MIG, place({"pipeline": "tts", "device": f"mig:{bare}", "instances": 2})
    )
    assert where(plan) == [("tts", one.id, 0), ("tts", one.id, 1)]
    with pytest.raises(PlacementError, match="in MIG mode: place workers on its slices"):
        plan_placement(s, H100_MIG, place({"pipeline": "tts", "device": "gpu:0"}))
    with pytest.raises(PlacementError, match=r"short by 2\.3 GiB"):
        plan_placement(s, H100_MIG, place({"pipeline": "asr", "device": "auto"}))


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"pipeline": "nope", "device": "cpu"}, "not an enabled pipeline of the config"),
        ({"pipeline": "tts", "device": "tpu:0"}, "unknown device 'tpu:0'"),
        ({"pipeline": "tts", "device": "gpu:2"}, r"found: gpu:0, gpu:1\)"),
        ({"pipeline": "tts", "device": "mig:*"}, "names each MIG slice, and this host has none"),
    ],
)
def test_bad_placements_are_refused_with_the_reason(entry: dict[str, Any], why: str) -> None:
    with pytest.raises(PlacementError, match=why):
        plan_placement(settings(tts={}), TWO_GPUS, place(entry))


def test_a_placement_file_with_unknown_keys_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "place.toml"
    path.write_text('[[place]]\npipeline = "tts"\ngpu = 0\n')
    with pytest.raises(PlacementError, match="Extra inputs are not permitted"):
        load_placement(path)
    with pytest.raises(PlacementError, match="cannot read placement file"):
        load_placement(tmp_path / "missing.toml")


def test_memory_from_safetensors_headers_at_the_run_dtype(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "unet").mkdir(parents=True)
    save_file({"w": np.zeros((1000, 1000), np.float32)}, model / "unet" / "a.safetensors")
    save_file({"b": np.zeros((500, 1000), np.float32)}, model / "b.safetensors")
    stored = estimate(PipelineConfig(kind="image", impl="x:y", model=str(model)))
    assert stored.bytes == int(1_500_000 * 4 * 1.2)  # no dtype option: as stored (float32)
    half = estimate(
        PipelineConfig(kind="image", impl="x:y", model=str(model), options={"dtype": "float16"})
    )
    assert half.bytes == int(1_500_000 * 2 * 1.2)
    assert half.source == "0.0015B parameters from safetensors headers x 1.2"
    auto = PipelineConfig(kind="image", impl="x:y", model=str(model), options={"dtype": "auto"})
    assert estimate(auto, on_gpu=True).bytes == half.bytes
    assert estimate(auto, on_gpu=False).bytes == int(1_500_000 * 4 * 1.2)


def test_memory_from_other_weight_files_and_the_explicit_option(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\0" * 1_000_000)  # a CTranslate2 model
    (tmp_path / "vocabulary.json").write_text("{}")
    ct2 = estimate(PipelineConfig(kind="asr", impl="x:y", model=str(tmp_path)))
    assert ct2.bytes == 1_200_000
    told = PipelineConfig(kind="asr", impl="x:y", model=str(tmp_path), memory_gb=3)
    assert estimate(told).bytes == 3 * GIB and estimate(told).source == "memory_gb"
    missing = estimate(PipelineConfig(kind="asr", impl="x:y", model="nobody/not-cached-here"))
    assert not missing.known and "no local files" in missing.source


def test_unknown_memory_is_placed_with_a_warning() -> None:
    plan = plan_placement(settings(asr={"device": "auto"}), TWO_GPUS)
    assert where(plan) == [("asr", "gpu:0", 0)]
    assert plan.warnings == [
        "asr on gpu:0: memory unknown: no model path (not counted; set the pipeline's memory_gb)"
    ]


def test_a_worker_started_by_hand_gets_one_device_and_the_knobs() -> None:
    config = PipelineConfig(kind="asr", impl="x:y", max_batch=4, memory_gb=1, options={"x": 1})
    assert concrete_device("auto", config, TWO_GPUS, "asr") == "gpu:0"
    assert concrete_device("auto", config, CPU_ONLY, "asr") == "cpu"
    assert concrete_device("mig:*", config, H100_MIG, "asr").startswith("mig:MIG-")
    assert concrete_device("gpu:3", config, CPU_ONLY, "asr") == "gpu:3"  # as told
    worker = apply_overrides(config, "gpu:1", max_batch=16, concurrency=None)
    assert (worker.device, worker.max_batch, worker.concurrency) == ("gpu:1", 16, 4)
    assert worker.options == {"x": 1} and worker.memory_gb == 1
