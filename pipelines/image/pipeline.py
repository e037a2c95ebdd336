"""The image pipeline: diffusers text-to-image, image-to-image and inpainting behind the
engine.

Requests with the same batch key (mode, size, steps, guidance, scheduler, strength) run
as one call (`batch.BatchCall`); the engine forms the batches. `prepare` checks each
request against the model, picks its seeds and reads its start image and mask. Each finished
request stores its images and answers their signed URLs and seeds (and base64 on
request). Timing: `first_step_ms`, from the start of the call to its first step's end.
"""

from __future__ import annotations

import base64
import copy
import logging
import secrets
import threading
from collections.abc import Hashable, Sequence

from PIL import Image

from jobs.errors import InputError
from jobs.outputs import BatchSizes, ImageFile, ImageOutput
from jobs.schemas.image import ImageInput, ImageOptions
from jobs.settings import PipelineConfig, Settings
from pipelines.base import Canceled, Pipeline, Request
from pipelines.image.batch import BatchCall, Generated, Preview, Share
from pipelines.image.load import Diffuser, Loaded, load_model, native_side
from pipelines.image.output import (
    CONTENT_TYPES,
    EXTENSIONS,
    encode,
    mask_image,
    read_image,
    start_image,
)

log = logging.getLogger(__name__)

SEED_SPACE = 2**63


class ImagePipeline(Pipeline[ImageInput, Share]):
    kind = "image"

    def __init__(self, config: PipelineConfig, settings: Settings) -> None:
        super().__init__(config, settings)
        self.opts = config.options_as(ImageOptions)
        self._loaded: Loaded | None = None
        self._views = threading.local()
        """Per runner thread: its own pipeline objects (scheduler, tokenizers, interrupt
        flag) over the shared modules, so `runners > 1` never shares them between calls."""

    @property
    def loaded(self) -> Loaded:
        if self._loaded is None:
            raise RuntimeError("the image pipeline is not loaded")
        return self._loaded

    def load(self) -> None:
        self._loaded = load_model(self.config, self.opts, self.settings.limits.image_max_side)
        log.info(
            "image model %s loaded: %s on %s (%s), image-to-image: %s, inpainting: %s",
            self.config.model,
            type(self.loaded.text2img).__name__,
            self.loaded.device,
            self.loaded.dtype,
            self.loaded.img2img is not None,
            self.loaded.inpaint is not None,
        )

    def warmup(self) -> None:
        if self.opts.warmup:
            side = native_side(self.loaded.text2img)
            self.loaded.text2img(prompt="warmup", num_inference_steps=1, width=side, height=side)

    def unload(self) -> None:
        self._loaded = None

    def batch_key(self, request: ImageInput) -> Hashable | None:
        strength = None if request.mode == "txt2img" else request.strength
        return (
            request.mode,
            strength,
            request.width,
            request.height,
            request.steps,
            request.guidance_scale,
            request.scheduler or self.opts.default_scheduler,
        )

    def prepare(self, request: Request[ImageInput]) -> Share:
        """The request's seeds and start image; InputError where the model cannot serve it."""
        inp = request.input
        try:
            inp.check_pipeline(self.config)
        except InputError as exc:
            raise InputError(f"input.{exc.field}", exc.reason) from None
        base = inp.seed if inp.seed is not None else secrets.randbelow(SEED_SPACE)
        seeds = [(base + i) % SEED_SPACE for i in range(inp.n)]
        return Share(request, seeds, *self._start_images(request))

    def run(self, batch: Sequence[Share]) -> None:
        shares = list(batch)
        call = BatchCall(self._view(shares[0]), shares, self._preview())
        try:
            generated = call.run()
        except Canceled:
            return
        sizes: BatchSizes = {"requests": len(shares), "images": sum(len(s.seeds) for s in shares)}
        for share, result in generated.items():
            self._finish(share, result, sizes)

    # -- before the call ---------------------------------------------------------------

    def _start_images(
        self, request: Request[ImageInput]
    ) -> tuple[Image.Image | None, Image.Image | None]:
        """The start image and the mask, at the request's size (None where not given)."""
        inp = request.input
        if inp.init_image is None:
            return None, None
        if self._pipe_of(inp) is None:
            field, what = (
                ("input.mask_image", "an inpainting")
                if inp.mode == "inpaint"
                else ("input.init_image", "an image-to-image")
            )
            family = type(self.loaded.text2img).__name__
            raise InputError(field, f"this model ({family}) has no {what} pipeline")
        max_pixels = self.settings.limits.image_max_pixels
        start = self._read(request, inp.init_image, "input.init_image", max_pixels)
        if inp.mask_image is None:
            return start_image(start, inp.width, inp.height), None
        mask = self._read(request, inp.mask_image, "input.mask_image", max_pixels)
        return (
            start_image(start, inp.width, inp.height),
            mask_image(mask, start.size, inp.width, inp.height),
        )

    @staticmethod
    def _read(request: Request[ImageInput], key: str, field: str, max_pixels: int) -> Image.Image:
        with request.files.open_input(key, field) as stream:
            data = stream.read()
        return read_image(data, field, max_pixels)

    def _pipe_of(self, inp: ImageInput) -> Diffuser | None:
        """The loaded pipeline of the request's mode; None where the family has none."""
        pipes = {
            "txt2img": self.loaded.text2img,
            "img2img": self.loaded.img2img,
            "inpaint": self.loaded.inpaint,
        }
        return pipes[inp.mode]

    def _view(self, share: Share) -> Diffuser:
        """This thread's pipeline for the share's mode, with a fresh scheduler."""
        name = share.input.mode
        view = getattr(self._views, name, None)
        if view is None:
            base = self._pipe_of(share.input)
            if base is None:  # prepare refused it
                raise RuntimeError(f"no {name} pipeline loaded")
            # from_pipe casts the shared modules to `dtype` (float32 unless told). Each
            # view has its own tokenizers: a fast tokenizer's padding and truncation are
            # state of the Rust object, set on every call, so two threads sharing one
            # can pad one prompt to the other's length.
            tokenizers = {
                name: copy.deepcopy(component)
                for name, component in base.components.items()
                if name.startswith("tokenizer") and component is not None
            }
            view = type(base).from_pipe(base, dtype=self.loaded.dtype, **tokenizers)
            view.set_progress_bar_config(disable=True)
            setattr(self._views, name, view)
        view.scheduler = self.loaded.scheduler(share.input.scheduler or self.opts.default_scheduler)
        return view

    def _preview(self) -> Preview:
        return Preview(self.opts.preview_every_steps, self.opts.preview_max_side)

    # -- after the call ----------------------------------------------------------------

    def _finish(self, share: Share, result: Generated, sizes: BatchSizes) -> None:
        request = share.request
        if request.drop_if_canceled():
            return
        inp = share.input
        images = [
            self._store(request, inp, i, image, seed, nsfw)
            for i, (image, seed, nsfw) in enumerate(
                zip(result.images, share.seeds, result.nsfw, strict=True)
            )
        ]
        output: ImageOutput = {
            "images": images,
            "seeds": share.seeds,
            "width": inp.width,
            "height": inp.height,
            "steps": inp.steps,
            "guidance_scale": inp.guidance_scale,
            "scheduler": inp.scheduler or self.opts.default_scheduler,
            "format": inp.format,
            "batch": sizes,
        }
        request.succeed(output)

    def _store(
        self,
        request: Request[ImageInput],
        inp: ImageInput,
        i: int,
        image: Image.Image,
        seed: int,
        nsfw: bool,
    ) -> ImageFile:
        data = encode(image, inp.format)
        name = f"image-{i}.{EXTENSIONS[inp.format]}"
        stored = request.files.put_output(name, data, CONTENT_TYPES[inp.format])
        found: ImageFile = {
            "key": stored["key"],
            "url": stored["url"],
            "bytes": stored["bytes"],
            "content_type": stored["content_type"],
            "sha256": stored["sha256"],
            "seed": seed,
            "nsfw": nsfw,
        }
        if inp.response_format == "b64_json":
            found["b64_json"] = base64.b64encode(data).decode()
        return found
