"""One job's files, as its pipeline sees them: inputs by reference, outputs by name.

```python
files = JobFiles(settings, storage, index, owner=job.owner, job_id=job.id)
with files.input_path(request.input.audio, "audio") as path:
    text = transcribe(path)
request.succeed({"text": text, "audio": files.put_output("speech.wav", wav, "audio/wav")})
```

Outputs land under `OWNER/jobs/JOB_ID/` and go when the job's record expires.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from jobs.outputs import StoredFile
from jobs.settings import Settings
from jobstore.retention_index import RetentionIndex
from storage.base import Data, Storage, job_folder, job_key
from storage.fetch import InputFetcher


class JobFiles:
    def __init__(
        self,
        settings: Settings,
        storage: Storage,
        index: RetentionIndex,
        *,
        owner: str,
        job_id: str,
        fetcher: InputFetcher | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.index = index
        self.owner = owner
        self.job_id = job_id
        self.fetcher = fetcher or InputFetcher(settings, storage)
        self.cancel = cancel
        """The job's cancel: a download of its input stops when it is set."""

    @contextlib.contextmanager
    def input_path(self, ref: str, field: str) -> Iterator[Path]:
        """A local path of the file that input field `field` references, while the block runs."""
        fetcher = self.fetcher
        with fetcher.local_path(ref, owner=self.owner, field=field, cancel=self.cancel) as path:
            yield path

    def open_input(self, ref: str, field: str) -> BinaryIO:
        """A stream of the file that input field `field` references. Close it."""
        return self.fetcher.open(ref, owner=self.owner, field=field, cancel=self.cancel)

    def put_output(self, name: str, data: Data, content_type: str) -> StoredFile:
        """Store output `name` of the job; returns what its output should show of it."""
        key = job_key(self.owner, self.job_id, name)
        self.index.note_artifacts(job_folder(self.owner, self.job_id))
        info = self.storage.put(key, data, content_type)
        return {
            "key": key,
            "url": self.storage.signed_url(key, self.settings.storage.url_ttl_s),
            "bytes": info.size_bytes,
            "content_type": info.content_type,
            "sha256": info.sha256,
        }
