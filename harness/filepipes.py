"""A test pipeline that reads a file input and writes a file output, through storage."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from jobs.filerefs import FileRef
from jobs.schemas.base import JobInput
from pipelines.base import Pipeline, Request


class FileSumInput(JobInput):
    file: FileRef
    """The file to hash: a stored key, an http(s) URL or an s3:// URL."""
    extra: FileRef | None = None
    """A second, optional file (only checked)."""
    output_name: str = Field(default="sum.txt", pattern=r"^[a-z0-9_.-]{1,40}$")


@dataclass(frozen=True)
class Summed:
    request: Request[FileSumInput]
    sha256: str
    size: int


class FileSumPipeline(Pipeline[FileSumInput, Summed]):
    """Hashes its input file and stores the hex digest as the job's output file."""

    kind = "filesum"

    def load(self) -> None:
        pass

    def prepare(self, request: Request[FileSumInput]) -> Summed:
        sha, size = hashlib.sha256(), 0
        with request.files.open_input(request.input.file, "file") as stream:
            while chunk := stream.read(1 << 20):
                sha.update(chunk)
                size += len(chunk)
        return Summed(request, sha.hexdigest(), size)

    def run(self, batch: Sequence[Summed]) -> None:
        for summed in batch:
            request = summed.request
            data = summed.sha256.encode()
            output = request.files.put_output(request.input.output_name, data, "text/plain")
            request.succeed({"sha256": summed.sha256, "bytes": summed.size, "file": output})
