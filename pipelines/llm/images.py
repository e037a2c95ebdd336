"""Image parts, as the engine takes them: every image a request names by file key, s3://
or http(s) URL is read (fetched behind the network guard) and sent inline, as a data URL,
so the engine never reaches out itself and a bad image fails as the request's fault.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import BinaryIO, NotRequired, TypedDict

from jobs.errors import InputError, TooLarge
from jobs.schemas.chat import DATA_URL

OpenInput = Callable[[str, str], BinaryIO]
"""Opens a job input's file reference, naming its field: `JobFiles.open_input`."""

MAGIC: list[tuple[bytes, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
]


class ImageUrl(TypedDict):
    url: str
    detail: NotRequired[str]


class Part(TypedDict, total=False):
    """A part of a message's content: `text`, or an `image_url`."""

    type: str
    text: str
    image_url: ImageUrl


class Message(TypedDict, total=False):
    """A chat message as the engine takes it (OpenAI's; the fields this module reads)."""

    role: str
    content: str | list[Part] | None


def inline_images(messages: list[Message], open_input: OpenInput, max_bytes: int) -> list[Message]:
    """`messages` (an engine request's) with each image part's file key or URL replaced by
    the image's data URL; new messages and parts where one changes, the rest as they are
    (the stored request is left alone). An `InputError` names the part's field when the
    file is missing, too large or not a png, jpeg, gif or webp image."""
    inlined: list[Message] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            where = f"input.messages.{i}.content"
            parts = [
                _inlined(part, f"{where}.{j}.image_url.url", open_input, max_bytes)
                for j, part in enumerate(content)
            ]
            message = {**message, "content": parts}
        inlined.append(message)
    return inlined


def _inlined(part: Part, field: str, open_input: OpenInput, max_bytes: int) -> Part:
    image = part.get("image_url") if part.get("type") == "image_url" else None
    if image is None or DATA_URL.match(image["url"]):
        return part
    with open_input(image["url"], field) as stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise TooLarge(field, f"the image is over the limit of {max_bytes} bytes")
    url = f"data:{_type_of(data, field)};base64,{base64.b64encode(data).decode()}"
    return {**part, "image_url": {**image, "url": url}}


def _type_of(data: bytes, field: str) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    for magic, media_type in MAGIC:
        if data.startswith(magic):
            return media_type
    raise InputError(field, "the file is not a png, jpeg, gif or webp image")
