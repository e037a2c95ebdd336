"""Image bytes: the output formats, start images and masks, and the small previews of
progress events."""

from __future__ import annotations

import base64
import io

import torch
from PIL import Image, UnidentifiedImageError

from jobs.errors import InputError, TooLarge

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


def read_image(data: bytes, field: str, max_pixels: int) -> Image.Image:
    """An image's pixels, decoded (any format Pillow reads); InputError naming `field`,
    and TooLarge before decoding one of more than `max_pixels` (limits.image_max_pixels:
    Pillow only warns below its own bomb limit, which is ten times larger)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise TooLarge(
                    field,
                    f"is {width}x{height}, {width * height} pixels, over {max_pixels} "
                    "(limits.image_max_pixels)",
                )
            image.load()
            return image.copy()
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise InputError(field, f"is not an image that can be read ({exc})") from None


def start_image(image: Image.Image, width: int, height: int) -> Image.Image:
    rgb = image.convert("RGB")
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.LANCZOS)
    return rgb


def mask_image(image: Image.Image, of: tuple[int, int], width: int, height: int) -> Image.Image:
    """An inpainting mask for diffusers (L: white is painted anew, black is kept) at the
    request's size. A mask with an alpha channel is OpenAI's: its fully transparent
    pixels are painted anew. `of`: the size of the image it masks, which it must have."""
    if image.size != of:
        raise InputError(
            "input.mask_image",
            f"is {image.size[0]}x{image.size[1]}, not the size of the image it masks "
            f"({of[0]}x{of[1]})",
        )
    if image.mode in {"RGBA", "LA", "PA"} or "transparency" in image.info:
        alpha = image.convert("RGBA").getchannel("A")
        mask = alpha.point(lambda a: 255 if a == 0 else 0)
    else:
        mask = image.convert("L")
    if mask.size != (width, height):
        mask = mask.resize((width, height), Image.Resampling.NEAREST)
    return mask


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
