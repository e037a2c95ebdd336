"""Image jobs end to end: the API under uvicorn, a Celery worker process running the tiny
Stable Diffusion from disk, real Redis; `/v1/jobs` and the OpenAI-compatible route."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from harness.api_client import Api, new_owner
from harness.models.sd import TINY_SIZE, cached_tiny_sd
from harness.scrape import check_job_counted
from mmq.client import Client
from tuning.deployment import Deployment, flush, serving, wait_until

MAX_SIDE = 256
IMAGE_PIPELINE = """
[pipelines.tiny-sd]
kind = "image"
impl = "pipelines.image:ImagePipeline"
model = {model}
aliases = ["dall-e-2"]
max_batch = 4
max_wait_ms = 400
concurrency = 8

[pipelines.tiny-sd.options]
schedulers = ["pndm", "euler", "euler_a"]
"""
SIZE = {"width": TINY_SIZE, "height": TINY_SIZE}
MAX_UPLOAD_BYTES = 100_000
"""`limits.image_max_bytes` here: an edit's image or mask over it gets 413."""


@pytest.fixture(scope="module")
def image_dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    model = cached_tiny_sd(tmp_path_factory)
    flush(redis_url)
    env = {
        "HF_HUB_OFFLINE": "1",
        "MMQ_LIMITS__IMAGE_MAX_SIDE": str(MAX_SIDE),
        "MMQ_LIMITS__IMAGE_MAX_BYTES": str(MAX_UPLOAD_BYTES),
    }
    dep = Deployment(redis_url, tmp_path_factory.mktemp("image"), env_overrides=env)
    dep.config_path.write_text(
        dep.config_path.read_text() + IMAGE_PIPELINE.format(model=json.dumps(str(model)))
    )
    with serving(dep):
        worker = dep.spawn("worker-tiny-sd", "worker", "--pipeline", "tiny-sd")
        dep.start(reaper=False)
        dep.wait_started([worker])
        yield dep


@pytest.fixture
def api(image_dep: Deployment) -> Api:
    return new_owner(image_dep.redis_url, image_dep.base_url, f"img{time.monotonic_ns()}")


def _run(api: Api, **inp: Any) -> dict[str, Any]:
    job = api.submit("image", **{**SIZE, "steps": 3, **inp})
    return api.wait(job["id"], timeout_s=120)


@contextmanager
def _runner_busy(dep: Deployment, api: Api) -> Iterator[None]:
    """The worker's one runner busy with a job no other request batches with (its own steps
    and scheduler) while the block runs; then that job is canceled. Requests submitted
    inside wait in one group and start as one batch when the runner is free, however slowly
    this host submits them (a batch window alone is a race on a busy host)."""
    client = Client(dep.base_url, api.key)
    side = {"width": MAX_SIDE, "height": MAX_SIDE}  # seconds a step here: time to submit
    blocker = client.submit(
        "image", {"prompt": "a wall", "steps": 100, "scheduler": "pndm", "seed": 0, **side}
    )
    for event in client.events(blocker["id"]):
        if event["type"] == "progress":
            break
    try:
        yield
    finally:
        client.cancel(blocker["id"])
    assert client.wait(blocker["id"], timeout_s=120)["status"] == "canceled"


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def _download(job: dict[str, Any], i: int = 0) -> bytes:
    r = httpx.get(job["output"]["images"][i]["url"], timeout=30)
    assert r.status_code == 200, r.text
    return r.content


def _same(a: bytes, b: bytes) -> bool:
    diff = np.abs(_pixels(a) - _pixels(b))
    return bool(diff.max() <= 1 and diff.mean() < 0.01)


def test_an_image_job_stores_its_images_and_reports_seeds(api: Api) -> None:
    job = _run(api, prompt="a lighthouse", n=2, seed=40)
    assert job["status"] == "succeeded", job
    output = job["output"]
    assert output["seeds"] == [40, 41] and output["format"] == "png"
    assert [image["seed"] for image in output["images"]] == [40, 41]
    for i, image in enumerate(output["images"]):
        data = _download(job, i)  # a signed URL: no API key needed
        assert Image.open(io.BytesIO(data)).size == (TINY_SIZE, TINY_SIZE)
        assert image["content_type"] == "image/png" and image["bytes"] == len(data)
    assert job["timings"]["time_to_first_output_ms"] > 0  # the first progress event


def test_compatible_requests_share_one_call_and_match_their_solo_runs(
    image_dep: Deployment, api: Api
) -> None:
    solo = _run(api, prompt="a red fox", seed=5)
    prompts = ["a red fox", "a grey wolf", "a white hare"]
    with _runner_busy(image_dep, api):
        submitted = [
            api.submit("image", **SIZE, steps=3, prompt=p, seed=5 + i)
            for i, p in enumerate(prompts)
        ]
    jobs = [api.wait(job["id"], timeout_s=120) for job in submitted]
    assert all(job["status"] == "succeeded" for job in jobs), jobs
    assert [job["output"]["batch"]["requests"] for job in jobs] == [3, 3, 3]
    assert solo["output"]["batch"]["requests"] == 1
    assert _same(_download(solo), _download(jobs[0]))


def test_different_batch_keys_never_share_a_call(api: Api) -> None:
    variants = [{"steps": 2}, {"steps": 3}, {"guidance_scale": 2.0}, {"scheduler": "euler"}]
    with ThreadPoolExecutor(4) as pool:
        jobs = list(pool.map(lambda v: _run(api, prompt="a cat", seed=1, **v), variants))
    assert [job["output"]["batch"]["requests"] for job in jobs] == [1, 1, 1, 1]


def test_progress_events_stream_in_order(image_dep: Deployment, api: Api) -> None:
    client = Client(image_dep.base_url, api.key)
    job = client.submit("image", {"prompt": "a kite", "steps": 4, "scheduler": "euler", **SIZE})
    events = list(client.events(job["id"]))
    progress = [e["data"] for e in events if e["type"] == "progress"]
    assert [(p["step"], p["total"]) for p in progress] == [(i, 4) for i in range(1, 5)]
    assert [e["type"] for e in events][-2:] == ["output", "status"]
    assert events[-1]["data"]["status"] == "succeeded"


def test_a_cancel_inside_a_batch_ends_that_job_and_the_other_goes_on(
    image_dep: Deployment, api: Api
) -> None:
    client = Client(image_dep.base_url, api.key)
    slow = {"steps": 100, "scheduler": "euler", **SIZE}
    with _runner_busy(image_dep, api):
        doomed = client.submit("image", {"prompt": "a storm", "seed": 1, **slow})
        other = client.submit("image", {"prompt": "a calm sea", "seed": 2, **slow})
    for event in client.events(doomed["id"]):
        if event["type"] == "progress" and event["data"]["step"] >= 2:
            break
    client.cancel(doomed["id"])
    doomed = client.wait(doomed["id"], timeout_s=120)
    other = client.wait(other["id"], timeout_s=120)
    assert doomed["status"] == "canceled" and other["status"] == "succeeded"
    assert other["output"]["batch"]["requests"] == 2
    assert doomed["finished_at"] < other["finished_at"]
    steps = [e["data"]["step"] for e in client.events(doomed["id"]) if e["type"] == "progress"]
    assert steps[-1] < 100


def test_image_to_image_from_an_upload(api: Api) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (20, 120, 220)).save(buffer, format="PNG")
    r = api.http.post("/v1/files", files={"file": ("start.png", buffer.getvalue(), "image/png")})
    assert r.status_code == 201, r.text
    job = _run(api, prompt="a blue sky", init_image=r.json()["key"], strength=0.6, seed=3)
    assert job["status"] == "succeeded", job
    assert Image.open(io.BytesIO(_download(job))).size == (TINY_SIZE, TINY_SIZE)


@pytest.mark.parametrize(
    ("inp", "param"),
    [
        ({"scheduler": "warp"}, "input.scheduler"),
        ({"width": 72 * 8}, "input.width"),
        ({"height": 60}, "input.height"),
        ({"steps": 0}, "input.steps"),
        ({"n": 5}, "input.n"),
        ({"format": "gif"}, "input.format"),
        ({"guidance_scale": 99}, "input.guidance_scale"),
        ({"init_image": "someone-else/uploads/x.png"}, "input.init_image"),
        ({"prompt": ""}, "input.prompt"),
    ],
)
def test_bad_image_jobs_get_422_naming_the_field(api: Api, inp: dict[str, Any], param: str) -> None:
    body = {"kind": "image", "input": {"prompt": "a", **SIZE, **inp}}
    r = api.http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param


def test_a_scheduler_this_pipeline_does_not_serve_is_refused(api: Api) -> None:
    r = api.http.post("/v1/jobs", json={"kind": "image", "input": {"prompt": "a", **SIZE}})
    assert r.status_code == 202
    body = {"kind": "image", "input": {"prompt": "a", "scheduler": "ddim", **SIZE}}
    r = api.http.post("/v1/jobs", json=body)
    if r.status_code == 422:  # checked at submit where the API knows the pipeline's options
        assert r.json()["error"]["param"] == "input.scheduler"
        return
    job = api.wait(r.json()["id"], timeout_s=120)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "invalid_input" and job["error"]["field"] == "input.scheduler"


# -- OpenAI-compatible route -------------------------------------------------------------


@pytest.fixture
def oai(image_dep: Deployment, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{image_dep.base_url}/v1", api_key=api.key, max_retries=0)


def test_openai_client_gets_base64_images(oai: openai.OpenAI) -> None:
    extra = {"seed": 7, "steps": 3}
    result = oai.images.generate(
        model="dall-e-2", prompt="a tiny robot", n=2, size="64x64",
        response_format="b64_json", extra_body=extra,
    )  # fmt: skip
    assert result.data is not None and len(result.data) == 2
    images = [base64.b64decode(d.b64_json or "") for d in result.data]
    assert all(Image.open(io.BytesIO(i)).size == (64, 64) for i in images)
    again = oai.images.generate(
        model="tiny-sd", prompt="a tiny robot", n=1, size="64x64",
        response_format="b64_json", extra_body=extra,
    )  # fmt: skip
    assert again.data is not None
    assert _same(base64.b64decode(again.data[0].b64_json or ""), images[0])
    assert result.size == "64x64"


def test_openai_client_gets_urls(oai: openai.OpenAI) -> None:
    result = oai.images.generate(
        prompt="a paper boat", size="64x64", extra_body={"steps": 2, "output_format": "jpeg"}
    )
    assert result.data is not None and result.data[0].url
    r = httpx.get(result.data[0].url, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"size": "100x100"}, "size"),
        ({"size": "1024x1024"}, "size"),
        ({"size": "big"}, "size"),
        ({"n": 9}, "n"),
        ({"model": "gpt-image-1"}, "model"),
        ({"response_format": "gif"}, "response_format"),
        ({"extra_body": {"scheduler": "ddim"}}, "scheduler"),
        ({"extra_body": {"steps": 1000}}, "steps"),
        ({"extra_body": {"colour": "red"}}, "colour"),
    ],
)
def test_openai_route_errors_name_the_field(
    oai: openai.OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        oai.images.generate(**{"prompt": "a", "size": "64x64", **kwargs})
    assert info.value.param == param, info.value.body


def test_openai_route_requires_a_key(image_dep: Deployment) -> None:
    anonymous = openai.OpenAI(base_url=f"{image_dep.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.images.generate(prompt="a", size="64x64")


def test_metrics_count_an_image_job(image_dep: Deployment, api: Api) -> None:
    check_job_counted(image_dep, lambda: _run(api, prompt="counted", seed=3), "image", "tiny-sd")


# -- edits: /v1/images/edits -------------------------------------------------------------


def _encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


START = _encoded(Image.new("RGB", (80, 72), (40, 90, 200)))
KEEP_ALL = _encoded(Image.new("RGBA", (80, 72), (0, 0, 0, 255)))
"""OpenAI's mask: opaque pixels are kept."""
REPAINT_ALL = _encoded(Image.new("RGBA", (80, 72), (0, 0, 0, 0)))
"""OpenAI's mask: fully transparent pixels are painted anew."""
EDIT = {"size": "64x64", "response_format": "b64_json"}


def _edit(oai: openai.OpenAI, mask: bytes | None, prompt: str, **extra: Any) -> tuple[str, bytes]:
    """An edit by the official client: its job id and its first image."""
    masked: dict[str, Any] = {"mask": ("mask.png", mask, "image/png")} if mask else {}
    raw = oai.images.with_raw_response.edit(
        image=("start.png", START, "image/png"), prompt=prompt, **masked, **EDIT,
        extra_body={"seed": 6, "steps": 3, "scheduler": "euler", **extra},
    )  # fmt: skip
    result = raw.parse()
    assert result.data is not None and len(result.data) == 1 and result.size == "64x64"
    return raw.headers["X-Job-Id"], base64.b64decode(result.data[0].b64_json or "")


def test_openai_client_inpaints_where_the_mask_is_transparent(oai: openai.OpenAI, api: Api) -> None:
    kept = [_edit(oai, KEEP_ALL, p, strength=1.0)[1] for p in ("a red barn", "the sea at night")]
    assert same_size(kept[0]) and _same(kept[0], kept[1])  # the prompt changed nothing
    painted = [_edit(oai, REPAINT_ALL, p, strength=1.0) for p in ("a red barn", "the sea at night")]
    assert not _same(painted[0][1], painted[1][1])
    job = api.get(painted[0][0])
    assert job["input"]["mask_image"] and job["input"]["init_image"]
    assert job["input"]["strength"] == 1.0 and job["output"]["batch"]["requests"] == 1


def same_size(data: bytes) -> bool:
    return Image.open(io.BytesIO(data)).size == (64, 64)


def test_an_edit_without_a_mask_is_image_to_image_at_the_image_size(
    image_dep: Deployment, api: Api, oai: openai.OpenAI
) -> None:
    raw = oai.images.with_raw_response.edit(
        image=("start.webp", _encoded(Image.new("RGB", (80, 72), (9, 9, 9)), "WEBP")),
        prompt="a dark room", extra_body={"steps": 4, "scheduler": "euler", "strength": 0.5},
    )  # fmt: skip
    result = raw.parse()
    assert result.size == "80x72" and result.data is not None and result.data[0].url
    r = httpx.get(result.data[0].url, timeout=30)
    assert Image.open(io.BytesIO(r.content)).size == (80, 72)
    job = api.get(raw.headers["X-Job-Id"])
    assert job["input"]["mask_image"] is None and job["input"]["strength"] == 0.5
    client = Client(image_dep.base_url, api.key)
    events = list(client.events(job["id"]))
    progress = [(e["data"]["step"], e["data"]["total"]) for e in events if e["type"] == "progress"]
    assert progress == [(1, 2), (2, 2)]  # strength 0.5 of 4 steps, reported as generations are


def test_compatible_edits_share_a_batch_and_other_modes_do_not_join(
    image_dep: Deployment, oai: openai.OpenAI, api: Api
) -> None:
    """Two inpaintings, an image-to-image edit and a generation of the same size and steps
    wait together behind a running job; once it is canceled, the inpaintings run as one
    batch and the other two alone (job records say so)."""
    client = Client(image_dep.base_url, api.key)
    blocker = client.submit(
        "image", {"prompt": "a long wait", "steps": 100, "n": 4, "width": 128, "height": 128}
    )
    next(e for e in client.events(blocker["id"]) if e["type"] == "progress")

    def generate() -> str:
        raw = oai.images.with_raw_response.generate(
            prompt="a kite", **EDIT, extra_body={"seed": 6, "steps": 3, "scheduler": "euler"}
        )
        return raw.headers["X-Job-Id"]

    calls = [
        lambda: _edit(oai, REPAINT_ALL, "a cat")[0],
        lambda: _edit(oai, KEEP_ALL, "a dog")[0],
        lambda: _edit(oai, None, "a cow")[0],
        generate,
    ]
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = [pool.submit(call) for call in calls]

        def all_taken() -> bool:
            jobs = api.http.get("/v1/jobs").json()["data"]
            return sum(job["status"] == "running" for job in jobs) == 1 + len(calls)

        wait_until(all_taken, timeout_s=60)
        assert client.get(blocker["id"])["status"] == "running"
        client.cancel(blocker["id"])
        jobs = [api.get(answer.result(timeout=120)) for answer in answers]
    assert [job["output"]["batch"]["requests"] for job in jobs] == [2, 2, 1, 1]


@pytest.mark.parametrize(
    ("files", "data", "status", "param"),
    [
        ({"mask": KEEP_ALL}, {}, 422, "image"),
        ({"image": b"plain text, no pixels"}, {}, 422, "image"),
        ({"image": _encoded(Image.new("RGB", (8, 8)), "GIF")}, {}, 422, "image"),
        ({"image": START, "mask": _encoded(Image.new("RGBA", (64, 64)))}, {}, 422, "mask"),
        ({"image": START, "mask": b"\x89PNG\r\n\x1a\nnot really"}, {}, 422, "mask"),
        ({"image": b"\x89PNG\r\n\x1a\n" + bytes(MAX_UPLOAD_BYTES)}, {}, 413, "image"),
        ({"image": START, "mask": bytes(MAX_UPLOAD_BYTES + 1)}, {}, 413, "mask"),
        ({"image": START, "markup": START}, {}, 422, "markup"),
        ({"image": START}, {"size": "100x100"}, 422, "size"),
        ({"image": START}, {"n": "9"}, 422, "n"),
        ({"image": START}, {"strength": "0"}, 422, "strength"),
        ({"image": START}, {"background": "transparent"}, 422, "background"),
        ({"image": START}, {"input_fidelity": "high"}, 422, "input_fidelity"),
        ({"image": START}, {"quality": "high"}, 422, "quality"),
        ({"image": START}, {"colour": "red"}, 422, "colour"),
        ({"image": START}, {"model": "gpt-image-1"}, 422, "model"),
        ({"image": START}, {"prompt": ""}, 422, "prompt"),
    ],
)
def test_bad_edits_are_refused_naming_the_field(
    api: Api, files: dict[str, bytes], data: dict[str, str], status: int, param: str
) -> None:
    parts = {name: (f"{name}.png", content, "image/png") for name, content in files.items()}
    r = api.http.post("/v1/images/edits", files=parts, data={"prompt": "a boat", **data})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert api.http.get("/v1/jobs").json()["data"] == []  # nothing was submitted


def test_one_image_per_edit_and_the_client_hears_why(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        oai.images.edit(image=[START, START], prompt="two boats")
    assert info.value.param == "image" and "one image" in str(info.value.body)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        oai.images.edit(image=START, mask=_encoded(Image.new("L", (80, 80))), prompt="a boat")
    assert info.value.param == "mask" and "80x80" in str(info.value.body)
