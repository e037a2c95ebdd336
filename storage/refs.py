"""What a file reference in a job input names, and whether its owner may use it.

Three forms: a stored key of the job's owner (`OWNER/uploads/ID/NAME`, or an output of
one of their jobs); an `s3://BUCKET/PREFIX/KEY` URL on the configured bucket, under the
configured prefix and in the owner's folder (it is the same stored key); or an
`http(s)://` URL, fetched through the SSRF guard. Anything else is an `InputError`
naming the field. Another owner's key reads as a missing one: nothing tells whether it
exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from jobs.errors import InputError
from jobs.settings import Settings
from storage.base import normalise_prefix, owner_of, validate_key


@dataclass(frozen=True)
class InputRef:
    kind: Literal["key", "url"]
    value: str
    """The stored key, or the http(s) URL."""


def parse_ref(ref: str, field: str, owner: str, settings: Settings) -> InputRef:
    """The reference `ref` that the input field `field` of `owner`'s job holds."""
    if ref.startswith(("http://", "https://")):
        return InputRef("url", ref)
    if ref.startswith("s3://"):
        return InputRef("key", key_from_s3_url(ref, field, owner, settings))
    if "://" in ref:
        raise InputError(field, "must be a stored file key, an http(s):// URL or an s3:// URL")
    return InputRef("key", owned_key(ref, field, owner))


def owned_key(key: str, field: str, owner: str) -> str:
    """`key`, if it is a valid key in `owner`'s folder; an `InputError` otherwise."""
    validate_key(key, field)
    if owner_of(key) != owner:
        raise InputError(field, f"no stored file {key!r}")
    return key


def key_from_s3_url(url: str, field: str, owner: str, settings: Settings) -> str:
    """The stored key that `s3://BUCKET/PREFIX/KEY` names."""
    if settings.storage.backend != "s3":
        raise InputError(field, "s3:// URLs need the s3 storage backend")
    s3 = settings.storage.s3
    parts = urlsplit(url)
    if parts.netloc != s3.bucket:
        raise InputError(field, f"s3:// URLs must name the bucket {s3.bucket!r}")
    name = parts.path.removeprefix("/")
    prefix = normalise_prefix(s3.prefix)
    if not name.startswith(prefix) or parts.query or parts.fragment:
        raise InputError(field, f"s3:// URLs must be under s3://{s3.bucket}/{prefix}")
    return owned_key(name[len(prefix) :], field, owner)
