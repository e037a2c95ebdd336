"""The S3 backend: AWS, MinIO or any S3 API, through boto3.

Credentials come from boto3's usual chain (environment, profile, instance role). Objects
up to `multipart_threshold_bytes` go up in one PUT; larger ones as a multipart upload of
`multipart_chunk_bytes` parts, read from the stream one part at a time (so memory stays
near one part) and aborted on any failure, leaving nothing behind. Downloads stream the
response body; download URLs are presigned GETs.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from jobs.errors import NotFound, Unavailable
from jobs.settings import S3Settings
from storage.base import (
    Data,
    Digest,
    Storage,
    StorageConfigError,
    StoredObject,
    check_content_type,
    iter_data,
    normalise_prefix,
    validate_key,
)

_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def make_client(config: S3Settings, endpoint_url: str | None) -> Any:
    boto_config = Config(
        signature_version="s3v4",
        s3={"addressing_style": config.addressing_style},
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=10,
        read_timeout=60,
    )
    session = boto3.session.Session()
    return session.client(
        "s3", endpoint_url=endpoint_url, region_name=config.region, config=boto_config
    )


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Storage(Storage):
    def __init__(self, config: S3Settings, client: Any = None, presigner: Any = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.prefix = normalise_prefix(config.prefix)
        self.client = client or make_client(config, config.endpoint_url)
        public = config.public_endpoint_url
        self.presigner = presigner or (make_client(config, public) if public else self.client)

    @property
    def where(self) -> str:
        return self.config.endpoint_url or f"AWS ({self.config.region or 'default region'})"

    def object_name(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def check(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except NoCredentialsError as exc:
            raise StorageConfigError(
                "storage: no S3 credentials found: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with an instance role"
            ) from exc
        except ClientError as exc:
            raise StorageConfigError(self._bucket_problem(exc)) from exc
        except BotoCoreError as exc:
            raise StorageConfigError(f"storage: cannot reach S3 at {self.where}: {exc}") from exc

    def _bucket_problem(self, exc: ClientError) -> str:
        code = error_code(exc)
        bucket = f"storage: bucket {self.bucket!r} at {self.where}"
        if code in _MISSING:
            return f"{bucket} does not exist; create it or set MMQ_STORAGE__S3__BUCKET"
        if code in {"403", "AccessDenied", "Forbidden"}:
            return (
                f"{bucket}: access denied for these credentials (need s3:ListBucket, "
                "s3:GetObject, s3:PutObject, s3:DeleteObject)"
            )
        if code in {"301", "PermanentRedirect"}:
            return f"{bucket} is in another region; set MMQ_STORAGE__S3__REGION"
        return f"{bucket}: {code or 'error'}: {exc}"

    def put(
        self, key: str, data: Data, content_type: str, *, max_bytes: int | None = None
    ) -> StoredObject:
        name = self.object_name(key)
        content_type = check_content_type(content_type)
        digest = Digest(max_bytes)
        chunks = iter_data(data)
        head = bytearray()
        for chunk in chunks:
            head += digest.add(chunk)
            if len(head) > self.config.multipart_threshold_bytes:
                self._multipart(name, content_type, head, chunks, digest)
                break
        else:
            with self._errors(key, "put"):
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=bytes(head),
                    ContentType=content_type,
                    Metadata={"sha256": digest.sha256},
                )
        return StoredObject(key, digest.size_bytes, content_type, digest.sha256)

    def _multipart(
        self, name: str, content_type: str, head: bytearray, chunks: Iterator[bytes], d: Digest
    ) -> None:
        with self._errors(name, "multipart upload"):
            upload = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=name, ContentType=content_type
            )
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, body in enumerate(_parts(head, chunks, d, self._part_bytes), start=1):
                with self._errors(name, "multipart upload"):
                    answer = self.client.upload_part(
                        Bucket=self.bucket,
                        Key=name,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body,
                    )
                parts.append({"ETag": answer["ETag"], "PartNumber": number})
            with self._errors(name, "multipart upload"):
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=name,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
        except BaseException:
            with contextlib.suppress(BotoCoreError, ClientError):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=name, UploadId=upload_id)
            raise

    @property
    def _part_bytes(self) -> int:
        return self.config.multipart_chunk_bytes

    def open(self, key: str) -> BinaryIO:
        with self._errors(key, "get"):
            answer = self.client.get_object(Bucket=self.bucket, Key=self.object_name(key))
        return io.BufferedReader(_Body(answer["Body"]), buffer_size=256 * 1024)

    def stat(self, key: str) -> StoredObject:
        with self._errors(key, "head"):
            head = self.client.head_object(Bucket=self.bucket, Key=self.object_name(key))
        modified = head.get("LastModified")
        return StoredObject(
            key,
            int(head["ContentLength"]),
            str(head.get("ContentType") or "application/octet-stream"),
            head.get("Metadata", {}).get("sha256"),
            modified.timestamp() if modified is not None else None,
        )

    def delete(self, key: str) -> bool:
        existed = self.exists(key)
        with self._errors(key, "delete"):
            self.client.delete_object(Bucket=self.bucket, Key=self.object_name(key))
        return existed

    def delete_prefix(self, prefix: str) -> int:
        folder = self.object_name(prefix.rstrip("/")) + "/"
        count = 0
        with self._errors(prefix, "delete"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=folder
            )
            for page in pages:
                names = [{"Key": item["Key"]} for item in page.get("Contents", [])]
                if names:
                    self.client.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": names, "Quiet": True}
                    )
                    count += len(names)
        return count

    def signed_url(self, key: str, ttl_s: int) -> str:
        params = {"Bucket": self.bucket, "Key": self.object_name(key)}
        return str(
            self.presigner.generate_presigned_url("get_object", Params=params, ExpiresIn=ttl_s)
        )

    @contextlib.contextmanager
    def _errors(self, key: str, action: str) -> Iterator[None]:
        try:
            yield
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                raise NotFound(f"no file {key!r}") from None
            raise Unavailable(f"storage: S3 {action} of {key!r} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise Unavailable(f"storage: S3 {action} of {key!r} failed: {exc}") from exc


def _parts(
    buffer: bytearray, chunks: Iterator[bytes], digest: Digest, part_bytes: int
) -> Iterator[bytes]:
    """Parts of exactly `part_bytes` (the last one shorter): what was read, then the rest."""
    while True:
        while len(buffer) >= part_bytes:
            part = bytes(buffer[:part_bytes])
            del buffer[:part_bytes]
            yield part
        chunk = next(chunks, None)
        if chunk is None:
            break
        buffer += digest.add(chunk)
    if buffer:
        yield bytes(buffer)


class _Body(io.RawIOBase):
    """botocore's StreamingBody as a raw binary stream."""

    def __init__(self, body: Any) -> None:
        self._body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._body.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()
        super().close()
