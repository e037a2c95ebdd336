"""Builds the configured storage backend: `make_storage(settings)`."""

from __future__ import annotations

from pathlib import Path

from jobs.settings import Settings
from storage.base import Storage
from storage.signing import Signer, load_or_create_secret

SECRET_FILE = "signing.key"


def storage_root(settings: Settings) -> Path:
    """Where the local backend keeps its objects (and the generated signing key)."""
    return settings.data_dir / "storage"


def make_signer(settings: Settings) -> Signer:
    secret = settings.storage.signing_secret
    if secret is not None:
        return Signer(secret.get_secret_value().encode())
    return Signer(load_or_create_secret(storage_root(settings) / SECRET_FILE))


def make_storage(settings: Settings) -> Storage:
    """The backend that `storage.backend` names. Nothing is checked here: call `check()`
    where a process must not start without working storage (the API does)."""
    if settings.storage.backend == "s3":
        from storage.s3 import S3Storage

        return S3Storage(settings.storage.s3)
    from storage.local import LocalStorage

    return LocalStorage(storage_root(settings), make_signer(settings), settings.public_url)
