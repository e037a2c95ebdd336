"""The format and pixel size of an uploaded image, read from its header (PNG, JPEG, WebP).

The API process holds no image library (the workers decode the pixels), but an upload
that is no image, or a mask of another size than its image, is refused at submit by
these few bytes: a 422 before a job exists. Only the header is trusted here; a body that
breaks after it fails its job, naming the field, when the worker decodes it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

from jobs.errors import InputError

Format = Literal["png", "jpeg", "webp"]
CONTENT_TYPES: dict[Format, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_FRAMES = frozenset(
    {*range(0xC0, 0xC4), *range(0xC5, 0xC8), *range(0xC9, 0xCC), *range(0xCD, 0xD0)}
)
"""Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC): their segment holds the size."""
JPEG_BARE = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})
"""Markers without a length (TEM, SOI, RST0-7)."""


@dataclass(frozen=True)
class ImageHeader:
    format: Format
    width: int
    height: int

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


def read_header(data: bytes, field: str) -> ImageHeader:
    """The format and size of the image `data`; InputError naming `field` for anything
    that is not a PNG, JPEG or WebP image with a readable header."""
    try:
        header = _read(data)
    except (struct.error, IndexError, ValueError):
        header = None
    if header is None:
        raise InputError(field, "is not a PNG, JPEG or WebP image (its header cannot be read)")
    if header.width < 1 or header.height < 1:
        raise InputError(field, f"has no pixels ({header.width}x{header.height})")
    return header


def _read(data: bytes) -> ImageHeader | None:
    if data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return ImageHeader("png", width, height)
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    return None


def _jpeg(data: bytes) -> ImageHeader | None:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
        elif marker in JPEG_BARE:
            at += 2
        elif marker in JPEG_FRAMES:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return ImageHeader("jpeg", width, height)
        else:
            (length,) = struct.unpack(">H", data[at + 2 : at + 4])
            at += 2 + length
    return None


def _webp(data: bytes) -> ImageHeader | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":  # lossy: a key frame's size
        width, height = struct.unpack("<HH", data[26:30])
        return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and data[20] == 0x2F:  # lossless: 14 bits each, minus one
        (bits,) = struct.unpack("<I", data[21:25])
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":  # extended: the canvas, 24 bits each, minus one
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return ImageHeader("webp", width, height)
    return None
