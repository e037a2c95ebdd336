"""Image bytes: the output formats, start images, and the small previews of progress events."""

from __future__ import annotations

import base64
import io

import torch
from PIL import Image, UnidentifiedImageError

from jobs.errors import InputError

CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
EXTENSIONS = {"png": "png", "jpeg": "jpg", "webp": "webp"}
JPEG_QUALITY = 90
PREVIEW_QUALITY = 70

# Latent channels -> RGB of SD 1.x/2.x VAEs: a linear map good enough for a thumbnail
# (no VAE decode, so a preview costs microseconds).
SD_LATENT_RGB = torch.tensor(
    [
        [0.3512, 0.2297, 0.3227],
        [0.3250, 0.4974, 0.2350],
        [-0.2829, 0.1762, 0.2721],
        [-0.2120, -0.2616, -0.7177],
    ]
)


def encode(image: Image.Image, fmt: str) -> bytes:
    """`image` as png, jpeg or webp bytes."""
    buffer = io.BytesIO()
    if fmt == "png":
        image.save(buffer, format="PNG")
    elif fmt == "jpeg":
        image.convert("RGB").save(buffer, format="JPEG", quality=JPEG_QUALITY)
    elif fmt == "webp":
        image.save(buffer, format="WEBP", quality=JPEG_QUALITY)
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    return buffer.getvalue()


def read_start_image(data: bytes, width: int, height: int, field: str) -> Image.Image:
    """A start image for image-to-image, as RGB at the request's size."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise InputError(field, f"is not an image that can be read ({exc})") from None
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    return rgb


def latent_preview(latent: torch.Tensor, max_side: int) -> str | None:
    """A small JPEG data URI of one latent (C, h, w); None for latents of another shape."""
    if latent.ndim != 3 or latent.shape[0] != SD_LATENT_RGB.shape[0]:
        return None
    rgb = torch.einsum("chw,cr->hwr", latent.float().cpu(), SD_LATENT_RGB)
    pixels = ((rgb + 1.0) * 127.5).clamp(0, 255).to(torch.uint8).numpy()
    image = Image.fromarray(pixels)
    image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=PREVIEW_QUALITY)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
