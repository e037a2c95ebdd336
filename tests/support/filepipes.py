"""A test pipeline that reads a file input and writes a file output, through storage."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import Field

from jobs.errors import InputError
from jobs.filerefs import FileRef
from jobs.schemas.base import JobInput
from pipelines.base import Pipeline, Request


class FileSumInput(JobInput):
    file: FileRef
    """The file to hash: a stored key, an http(s) URL or an s3:// URL."""
    extra: FileRef | None = None
    """A second, optional file (only checked)."""
    output_name: str = Field(default="sum.txt", pattern=r"^[a-z0-9_.-]{1,40}$")


class FileSumPipeline(Pipeline):
    """Hashes its input file and stores the hex digest as the job's output file."""

    kind = "filesum"
    input_model = FileSumInput

    def load(self) -> None:
        pass

    def run(self, batch: Sequence[Request]) -> None:
        for request in batch:
            try:
                request.succeed(self._one(request))
            except InputError as exc:
                request.fail(exc)

    def _one(self, request: Request) -> dict[str, object]:
        assert isinstance(request.input, FileSumInput)
        files = request.files
        sha, size = hashlib.sha256(), 0
        with files.open_input(request.input.file, "file") as stream:
            while chunk := stream.read(1 << 20):
                sha.update(chunk)
                size += len(chunk)
        digest = sha.hexdigest()
        output = files.put_output(request.input.output_name, digest.encode(), "text/plain")
        return {"sha256": digest, "bytes": size, "file": output}
