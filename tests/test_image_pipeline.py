"""The image pipeline in process, on a tiny random-weight Stable Diffusion loaded from disk.

Requests are the engine's own `WorkItem`s with real job files (local storage, real
Redis); batches are handed to `Engine.run_batch` directly (prepare, then run, on this
thread) so that their makeup is exact.
"""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
from PIL import Image
from pydantic import ValidationError

from harness.models.sd import TINY_SIZE, cached_tiny_sd, offline_hub
from jobs.errors import InputError
from jobs.models import EventType
from jobs.schemas.image import ImageInput, ImageOptions
from jobs.settings import PipelineConfig, Settings
from jobstore.retention_index import RetentionIndex
from pipelines.image import ImagePipeline
from storage.base import Storage, job_key
from storage.factory import make_storage
from workers.engine import Engine, WorkItem
from workers.jobfiles import JobFiles

OWNER = "alice"
SIZE = {"width": TINY_SIZE, "height": TINY_SIZE}


class Harness:
    """Builds requests as the worker does and runs batches on one loaded pipeline."""

    def __init__(self, pipeline: ImagePipeline, settings: Settings, client: redis.Redis) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.storage: Storage = make_storage(settings)
        self.index = RetentionIndex(client)
        self.events: dict[str, list[tuple[EventType, dict[str, Any]]]] = {}
        self.hooks: dict[str, Callable[[EventType, dict[str, Any]], None]] = {}
        self._count = 0

    def item(self, **inp: Any) -> WorkItem:
        self._count += 1
        job_id = f"job_{self._count}"
        request = ImageInput.model_validate({**SIZE, "steps": 4, **inp})
        self.events[job_id] = []
        files = JobFiles(self.settings, self.storage, self.index, owner=OWNER, job_id=job_id)
        return WorkItem(
            job_id, request, self._sink, self.pipeline.batch_key(request), job_files=files
        )

    def _sink(self, job_id: str, etype: EventType, data: dict[str, Any], output: bool) -> None:
        self.events[job_id].append((etype, data))
        if job_id in self.hooks:
            self.hooks[job_id](etype, data)

    def run(self, *items: WorkItem) -> list[WorkItem]:
        return run_on(self.pipeline, *items)

    def solo(self, **inp: Any) -> WorkItem:
        return self.run(self.item(**inp))[0]

    def steps(self, item: WorkItem) -> list[int]:
        return [d["step"] for t, d in self.events[item.job_id] if t is EventType.PROGRESS]

    def pixels(self, item: WorkItem) -> list[np.ndarray]:
        assert item.outcome is not None and item.outcome.status == "succeeded", item.outcome
        output = item.outcome.output or {}
        arrays = []
        for image in output["images"]:
            with self.storage.open(image["key"]) as stream:
                arrays.append(np.asarray(Image.open(io.BytesIO(stream.read())), dtype=np.int16))
        return arrays

    def upload(self, name: str, data: bytes) -> str:
        key = f"{OWNER}/uploads/{name}"
        self.storage.put(key, data, "application/octet-stream")
        return key


def run_on(pipeline: ImagePipeline, *items: WorkItem) -> list[WorkItem]:
    """Run `items` as one batch, as an engine's runner does."""
    Engine(pipeline, name="image").run_batch(list(items))
    return list(items)


def same_image(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to rounding: float results within ~1e-6 may land on both sides of a level."""
    diff = np.abs(a - b)
    return bool(diff.max() <= 1 and diff.mean() < 0.01)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with offline_hub():
        yield cached_tiny_sd(tmp_path_factory)


def make_pipeline(model_dir: Path, **options: Any) -> ImagePipeline:
    config = PipelineConfig(
        kind="image",
        impl="pipelines.image:ImagePipeline",
        model=str(model_dir),
        options={"warmup": False, **options},
    )
    pipeline = ImagePipeline(config, Settings())
    pipeline.load()
    return pipeline


@pytest.fixture(scope="module")
def harness(
    model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    settings = Settings(redis_url=redis_url, data_dir=tmp_path_factory.mktemp("image-data"))
    pipeline = make_pipeline(model_dir, schedulers=["pndm", "euler", "euler_a", "dpm++_2m", "heun"])
    pipeline.warmup()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield Harness(pipeline, settings, client)
    pipeline.unload()


@pytest.fixture
def unet_batches(harness: Harness) -> Iterator[list[int]]:
    """The batch size of each UNet forward pass (a real forward pre-hook)."""
    sizes: list[int] = []
    unet = harness.pipeline.loaded.text2img.unet
    handle = unet.register_forward_pre_hook(lambda _m, args: sizes.append(int(args[0].shape[0])))
    yield sizes
    handle.remove()


def test_batched_images_equal_their_solo_runs(harness: Harness, unet_batches: list[int]) -> None:
    requests = [
        {"prompt": "a red fox", "seed": 11},
        {"prompt": "a lighthouse at dusk", "seed": 22, "n": 2},
        {"prompt": "a bowl of soup", "seed": 33, "negative_prompt": "blurry"},
    ]
    solo = [harness.solo(**r) for r in requests]
    unet_batches.clear()
    batch = harness.run(*(harness.item(**r) for r in requests))
    assert set(unet_batches) == {2 * 4}  # 4 images, doubled by classifier-free guidance
    for alone, together in zip(solo, batch, strict=True):
        assert alone.outcome is not None and together.outcome is not None
        assert (together.outcome.output or {})["seeds"] == (alone.outcome.output or {})["seeds"]
        assert together.outcome.timings["first_step_ms"] > 0
        pairs = zip(harness.pixels(alone), harness.pixels(together), strict=True)
        assert all(same_image(a, b) for a, b in pairs)
    output = batch[1].outcome.output if batch[1].outcome else None
    assert output is not None
    assert output["seeds"] == [22, 23] and output["batch"] == {"requests": 3, "images": 4}
    assert [image["seed"] for image in output["images"]] == [22, 23]
    image = output["images"][0]
    assert image["content_type"] == "image/png" and image["key"] == job_key(
        OWNER, batch[1].job_id, "image-0.png"
    )
    assert "b64_json" not in image


def test_a_missing_seed_is_picked_and_reported(harness: Harness) -> None:
    first = harness.solo(prompt="a kite")
    assert first.outcome is not None and first.outcome.output is not None
    seed = first.outcome.output["seeds"][0]
    again = harness.solo(prompt="a kite", seed=seed)
    other = harness.solo(prompt="a kite", seed=(seed + 1) % 2**63)
    assert same_image(harness.pixels(first)[0], harness.pixels(again)[0])
    assert not same_image(harness.pixels(first)[0], harness.pixels(other)[0])


def test_progress_events_come_once_per_step_in_order(harness: Harness) -> None:
    item = harness.solo(prompt="a tree", steps=5, scheduler="euler_a")
    assert harness.steps(item) == [1, 2, 3, 4, 5]
    progress = [d for t, d in harness.events[item.job_id] if t is EventType.PROGRESS]
    assert {d["total"] for d in progress} == {5}
    pndm = harness.solo(prompt="a tree", steps=5)  # the model's own: PLMS repeats one step
    assert harness.steps(pndm) == [1, 2, 3, 4, 5, 6]
    assert all("preview" not in d for d in progress)
    heun = harness.solo(prompt="a tree", steps=3, scheduler="heun")
    assert harness.steps(heun) == [1, 2, 3, 4, 5]  # a 2nd-order scheduler: 2 x 3 - 1 passes


def test_previews_every_n_steps(model_dir: Path, harness: Harness) -> None:
    pipeline = make_pipeline(model_dir, preview_every_steps=2, preview_max_side=32)
    item = harness.item(prompt="a boat", steps=5, scheduler="euler")
    run_on(pipeline, item)
    progress = [d for t, d in harness.events[item.job_id] if t is EventType.PROGRESS]
    with_preview = [d["step"] for d in progress if "preview" in d]
    assert with_preview == [2, 4, 5]
    uri = progress[1]["preview"]
    assert uri.startswith("data:image/jpeg;base64,")
    pixels = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert max(pixels.size) <= 32


def cancel_at(harness: Harness, item: WorkItem, step: int) -> None:
    """Ask to cancel `item` as its progress event of `step` is written (mid-run)."""

    def hook(etype: EventType, data: dict[str, Any]) -> None:
        if etype is EventType.PROGRESS and data["step"] == step:
            item.cancel_event.set()

    harness.hooks[item.job_id] = hook


def test_cancel_alone_interrupts_the_call(harness: Harness, unet_batches: list[int]) -> None:
    item = harness.item(prompt="a long walk", steps=8)
    cancel_at(harness, item, 3)
    harness.run(item)
    assert item.outcome is not None and item.outcome.status == "canceled"
    assert harness.steps(item) == [1, 2, 3]
    assert len(unet_batches) == 4  # the 4th step ran, the call stopped after it
    assert not harness.storage.exists(job_key(OWNER, item.job_id, "image-0.png"))


@pytest.mark.parametrize("scheduler", [None, "euler_a", "dpm++_2m", "heun"])
def test_cancel_inside_a_batch_drops_one_request_and_the_rest_go_on(
    harness: Harness, unet_batches: list[int], scheduler: str | None
) -> None:
    inputs = [
        {"prompt": "a red fox", "seed": 5, "steps": 6, "scheduler": scheduler},
        {"prompt": "a blue bird", "seed": 6, "steps": 6, "scheduler": scheduler, "n": 2},
        {"prompt": "a green frog", "seed": 7, "steps": 6, "scheduler": scheduler},
    ]
    solo = [harness.solo(**inputs[0]), harness.solo(**inputs[2])]
    first, dropped, last = (harness.item(**i) for i in inputs)
    cancel_at(harness, dropped, 2)
    seen_while_running: list[bool] = []

    def watch(etype: EventType, data: dict[str, Any]) -> None:
        if etype is EventType.PROGRESS and data["step"] == 3:
            seen_while_running.append(dropped.done)

    harness.hooks[first.job_id] = watch
    unet_batches.clear()
    harness.run(first, dropped, last)
    assert dropped.outcome is not None and dropped.outcome.status == "canceled"
    assert seen_while_running == [True]  # ended canceled before the others' next step
    assert harness.steps(dropped) == [1, 2]
    assert set(unet_batches) == {8}  # its rows ran on to the end (4 images, x2 for guidance)
    assert not harness.storage.exists(job_key(OWNER, dropped.job_id, "image-0.png"))
    for alone, together in zip(solo, [first, last], strict=True):
        assert harness.steps(together)[-1] == harness.steps(alone)[-1]
        assert same_image(harness.pixels(alone)[0], harness.pixels(together)[0])


def test_each_bad_request_fails_alone(harness: Harness, model_dir: Path) -> None:
    narrow = make_pipeline(model_dir, schedulers=["pndm"])
    good = harness.item(prompt="fine", seed=1)
    bad_scheduler = harness.item(prompt="fine", scheduler="euler_a")
    run_on(narrow, good, bad_scheduler)
    assert good.outcome is not None and good.outcome.status == "succeeded"
    error = bad_scheduler.outcome.error if bad_scheduler.outcome else None
    assert isinstance(error, InputError) and error.field == "input.scheduler"

    not_an_image = harness.upload("notes.png", b"this is not a picture")
    missing = f"{OWNER}/uploads/nothing-here.png"
    items = harness.run(
        harness.item(prompt="x", init_image=not_an_image),
        harness.item(prompt="x", init_image=missing),
        harness.item(prompt="x", seed=3),
    )
    for item in items[:2]:
        assert item.outcome is not None and item.outcome.status == "failed"
        assert isinstance(item.outcome.error, InputError)
        assert item.outcome.error.field == "input.init_image"
    assert items[2].outcome is not None and items[2].outcome.status == "succeeded"


def test_image_to_image_batches_and_matches_solo(harness: Harness) -> None:
    start = Image.new("RGB", (96, 80), (200, 40, 40))
    buffer = io.BytesIO()
    start.save(buffer, format="PNG")
    key = harness.upload("start.png", buffer.getvalue())
    inputs = [
        {"prompt": "a red square", "init_image": key, "seed": 1, "strength": 0.5, "steps": 6},
        {"prompt": "a red circle", "init_image": key, "seed": 2, "strength": 0.5, "steps": 6},
    ]
    inputs = [{**i, "scheduler": "euler"} for i in inputs]
    solo = [harness.solo(**i) for i in inputs]
    batch = harness.run(*(harness.item(**i) for i in inputs))
    assert harness.steps(batch[0]) == [1, 2, 3]  # strength 0.5 runs half the steps
    for alone, together in zip(solo, batch, strict=True):
        assert same_image(harness.pixels(alone)[0], harness.pixels(together)[0])
    assert harness.pixels(batch[0])[0].shape == (TINY_SIZE, TINY_SIZE, 3)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _inpaint_inputs(harness: Harness) -> tuple[str, dict[str, str]]:
    """A start image's key, and the keys of masks that keep or repaint all of it, in
    diffusers' way (white repaints) and OpenAI's (transparent repaints)."""
    start = harness.upload("inpaint-start.png", _png(Image.new("RGB", (80, 80), (30, 160, 90))))
    masks = {
        "keep": Image.new("L", (80, 80), 0),
        "repaint": Image.new("L", (80, 80), 255),
        "keep_opaque": Image.new("RGBA", (80, 80), (0, 0, 0, 255)),
        "repaint_transparent": Image.new("RGBA", (80, 80), (0, 0, 0, 0)),
    }
    return start, {name: harness.upload(f"mask-{name}.png", _png(m)) for name, m in masks.items()}


def test_inpainting_batches_and_matches_solo(harness: Harness, unet_batches: list[int]) -> None:
    start, masks = _inpaint_inputs(harness)
    half = Image.new("L", (80, 80), 0)
    half.paste(255, (0, 0, 40, 80))
    inputs = [
        {"prompt": "a meadow", "seed": 4, "mask_image": masks["repaint"]},
        {"prompt": "a pond", "seed": 5, "mask_image": harness.upload("half.png", _png(half))},
    ]
    inputs = [{**i, "init_image": start, "steps": 4, "scheduler": "euler"} for i in inputs]
    solo = [harness.solo(**i) for i in inputs]
    unet_batches.clear()
    batch = harness.run(*(harness.item(**i) for i in inputs))
    assert set(unet_batches) == {2 * 2}  # one call: 2 images, doubled by guidance
    assert harness.steps(batch[0]) == [1, 2, 3]  # strength 0.8 of 4 steps
    for alone, together in zip(solo, batch, strict=True):
        assert same_image(harness.pixels(alone)[0], harness.pixels(together)[0])
        output = together.outcome.output if together.outcome else None
        assert output is not None and output["batch"] == {"requests": 2, "images": 2}
    assert harness.pixels(batch[0])[0].shape == (TINY_SIZE, TINY_SIZE, 3)


def test_a_mask_says_what_is_kept(harness: Harness) -> None:
    """Kept pixels come from the start image whatever the prompt (the random VAE's
    round trip, seeded); repainted ones follow the prompt. A mask with alpha is OpenAI's:
    opaque keeps, transparent repaints."""
    start, masks = _inpaint_inputs(harness)

    def made(mask: str, prompt: str) -> np.ndarray:
        edit = {"init_image": start, "mask_image": masks[mask], "strength": 1.0, "seed": 8}
        return harness.pixels(harness.solo(prompt=prompt, **edit))[0]

    for keep in ("keep", "keep_opaque"):
        assert same_image(made(keep, "a red barn"), made(keep, "the open sea at night"))
    for repaint in ("repaint", "repaint_transparent"):
        assert not same_image(made(repaint, "a red barn"), made(repaint, "the open sea at night"))
    assert same_image(made("keep", "a"), made("keep_opaque", "b"))
    assert same_image(made("repaint", "a red barn"), made("repaint_transparent", "a red barn"))


def test_bad_masks_fail_alone_naming_the_mask(harness: Harness, model_dir: Path) -> None:
    start, masks = _inpaint_inputs(harness)
    small = harness.upload("small-mask.png", _png(Image.new("L", (40, 80), 255)))
    not_an_image = harness.upload("mask.txt", b"no pixels here")
    good = harness.item(prompt="x", init_image=start, mask_image=masks["repaint"], seed=1)
    items = harness.run(
        harness.item(prompt="x", init_image=start, mask_image=small),
        harness.item(prompt="x", init_image=start, mask_image=not_an_image),
        good,
    )
    for item, reason in zip(items[:2], ("not the size of the image", "not an image"), strict=True):
        assert item.outcome is not None and item.outcome.status == "failed"
        assert isinstance(item.outcome.error, InputError)
        assert item.outcome.error.field == "input.mask_image"
        assert reason in item.outcome.error.reason
    assert good.outcome is not None and good.outcome.status == "succeeded"
    without = make_pipeline(model_dir, inpaint=False)
    assert without.loaded.inpaint is None and without.loaded.img2img is not None
    refused = harness.item(prompt="x", init_image=start, mask_image=masks["repaint"])
    run_on(without, refused)
    error = refused.outcome.error if refused.outcome else None
    assert isinstance(error, InputError) and error.field == "input.mask_image"
    with pytest.raises(ValidationError, match="a mask needs init_image"):
        ImageInput(prompt="a", mask_image="alice/uploads/m.png")


def test_formats_and_base64(harness: Harness) -> None:
    for fmt, magic in (("jpeg", b"\xff\xd8"), ("webp", b"RIFF")):
        item = harness.solo(prompt="a cup", format=fmt, response_format="b64_json")
        output = item.outcome.output if item.outcome else None
        assert output is not None
        image = output["images"][0]
        data = base64.b64decode(image["b64_json"])
        assert data.startswith(magic) and image["content_type"] == f"image/{fmt}"
        with harness.storage.open(image["key"]) as stream:
            assert stream.read() == data


def test_batch_keys_keep_incompatible_requests_apart(harness: Harness) -> None:
    key = harness.pipeline.batch_key
    base = ImageInput(prompt="a", **SIZE)
    same = ImageInput(prompt="b", negative_prompt="c", seed=4, n=2, format="jpeg", **SIZE)
    assert key(base) == key(same)
    for change in (
        {"width": 128},
        {"steps": 5},
        {"guidance_scale": 3.0},
        {"scheduler": "euler_a"},
        {"init_image": "alice/uploads/a.png"},
    ):
        assert key(base) != key(base.model_copy(update=change)), change
    start = {"init_image": "alice/uploads/a.png"}
    edit = ImageInput(prompt="a", **start, **SIZE)
    inpaint = ImageInput(prompt="a", mask_image="alice/uploads/m.png", **start, **SIZE)
    other = ImageInput(prompt="b", init_image="alice/uploads/b.png", seed=2, **SIZE)
    assert key(edit) == key(other) and key(edit) != key(inpaint) != key(base)
    assert key(inpaint) == key(inpaint.model_copy(update={"mask_image": "alice/uploads/n.png"}))
    for change in ({"strength": 0.5}, {"width": 128}):
        assert key(inpaint) != key(inpaint.model_copy(update=change)), change


def test_schema_and_options_refuse_bad_values() -> None:
    with pytest.raises(ValidationError, match="unknown scheduler"):
        ImageInput(prompt="a", scheduler="warp-drive")
    with pytest.raises(ValidationError, match="multiple of 8"):
        ImageInput(prompt="a", width=100)
    with pytest.raises(ValidationError, match="unknown schedulers"):
        ImageOptions(schedulers=["euler", "nope"])
    with pytest.raises(ValidationError):
        ImageOptions.model_validate({"speed": "ludicrous"})
    with pytest.raises(ValidationError):
        ImageOptions.model_validate({"dtype": "int8"})
    config = PipelineConfig(kind="image", impl="x:y", options={"schedulers": ["ddim"]})
    with pytest.raises(InputError, match="not served here"):
        ImageInput(prompt="a", scheduler="euler").check_pipeline(config)


def test_one_pipeline_serves_runner_threads_with_their_own_schedulers(
    harness: Harness,
) -> None:
    items = [harness.item(prompt="a", seed=9, scheduler=s) for s in ("euler_a", "dpm++_2m")]
    threads = [threading.Thread(target=harness.run, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    alone = [harness.solo(prompt="a", seed=9, scheduler=s) for s in ("euler_a", "dpm++_2m")]
    for together, solo in zip(items, alone, strict=True):
        assert same_image(harness.pixels(together)[0], harness.pixels(solo)[0])


def test_per_thread_views_keep_the_model_dtype(model_dir: Path, harness: Harness) -> None:
    pipeline = make_pipeline(model_dir, dtype="bfloat16")
    item = harness.item(prompt="a pear", steps=2, scheduler="euler")
    run_on(pipeline, item)
    assert item.outcome is not None and item.outcome.status == "succeeded", item.outcome
    loaded = pipeline.loaded
    assert loaded.dtype == torch.bfloat16 and loaded.img2img is not None
    for module in (loaded.text2img.unet, loaded.text2img.vae, loaded.img2img.text_encoder):
        assert module.dtype == torch.bfloat16
