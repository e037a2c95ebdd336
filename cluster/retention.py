"""Retention: stored files go when nothing needs them any more.

- An upload no job used goes `storage.upload_ttl_s` after it was made. One that a job
  used stays while the record of any job that used it does.
- A job's outputs (its folder `OWNER/jobs/JOB_ID/`) go once the job's record has expired
  (`job_ttl_s` after the job ended).

Redis remembers what to look at (`jobstore.retention_index.RetentionIndex`): the uploads and the
jobs' output folders, each scored by when the sweep should next look. An entry is written
before its file, so a crash leaves at worst an entry without a file, never a file that
nothing will delete. When the sweep finds
a job record still alive, it looks again once that record's TTL has run out; several
sweepers may run at once (every step is idempotent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from common import redis_client
from jobs.errors import MmqError, Unavailable
from jobs.settings import Settings
from jobstore.retention_index import Index, RetentionIndex
from storage.base import Storage

log = logging.getLogger(__name__)

BATCH = 200
"""Entries handled per Redis round trip."""
MAX_BATCHES = 50
"""Batches per sweep and kind; what is left waits for the next sweep."""


@dataclass
class SweepReport:
    uploads_deleted: int = 0
    artifact_folders_deleted: int = 0
    files_deleted: int = 0


class RetentionSweeper:
    def __init__(self, client: redis.Redis, storage: Storage, settings: Settings) -> None:
        self.index = RetentionIndex(client)
        self.storage = storage
        self.settings = settings
        self.recheck_s = float(min(settings.job_ttl_s, 3600))
        """How long to wait before looking again at a job that has not ended yet."""

    def sweep(self, now: float | None = None) -> SweepReport:
        now = time.time() if now is None else now
        report = SweepReport()
        report.uploads_deleted, files = self._sweep(
            "uploads", now, self._upload_life_s, self._delete_upload
        )
        report.artifact_folders_deleted, more = self._sweep(
            "artifacts", now, self._folder_life_s, self._delete_folder
        )
        report.files_deleted = files + more
        if report.uploads_deleted or report.artifact_folders_deleted:
            log.info("retention: %s", report)
        return report

    def _sweep(
        self,
        index: Index,
        now: float,
        life_s: Callable[[str], float | None],
        delete: Callable[[str], int],
    ) -> tuple[int, int]:
        """Delete the due entries of `index` whose jobs are gone; (entries, files) deleted."""
        entries = files = 0
        for _ in range(MAX_BATCHES):
            due = self.index.due(index, now, BATCH)
            for member in due:
                remaining_s = life_s(member)
                if remaining_s is not None:
                    self.index.look_again(index, member, now + remaining_s, existing=True)
                    continue
                try:
                    files += delete(member)
                except Unavailable as exc:
                    log.warning("retention: cannot delete %r yet: %s", member, exc)
                    later = now + self.settings.storage.sweep_interval_s
                    self.index.look_again(index, member, later)
                    continue
                except MmqError as exc:
                    log.warning("retention: dropping bad entry %r: %s", member, exc)
                entries += 1
                self.index.drop(index, member)
            if len(due) < BATCH:
                break
        return entries, files

    def _upload_life_s(self, key: str) -> float | None:
        return self._longest_life_s(self.index.upload_users(key))

    def _folder_life_s(self, folder: str) -> float | None:
        return self._longest_life_s([folder.rsplit("/", 1)[-1]])

    def _delete_upload(self, key: str) -> int:
        deleted = self.storage.delete(key)
        self.index.forget_upload(key)
        return int(deleted)

    def _delete_folder(self, folder: str) -> int:
        return self.storage.delete_prefix(folder)

    def _longest_life_s(self, job_ids: list[str]) -> float | None:
        """Seconds until the last of these job records expires; None if all are gone."""
        if not job_ids:
            return None
        lives = [
            self.recheck_s if ttl_ms == -1 else ttl_ms / 1000 + 1
            for ttl_ms in self.index.record_lives_ms(job_ids)
            if ttl_ms != -2
        ]
        return max(lives) if lives else None

    def run_forever(self, stop: threading.Event) -> None:
        """Sweep every `storage.sweep_interval_s` until `stop` is set."""
        while not stop.wait(self.settings.storage.sweep_interval_s):
            try:
                self.sweep()
            except Exception:
                log.exception("retention sweep failed; trying again next time")


def start_sweeper(settings: Settings, stop: threading.Event) -> threading.Thread:
    """Run the retention sweep in a daemon thread until `stop` is set."""
    from storage.factory import make_storage

    client = redis_client.connect(settings.redis_url or "")
    sweeper = RetentionSweeper(client, make_storage(settings), settings)
    thread = threading.Thread(
        target=sweeper.run_forever, args=(stop,), name="retention", daemon=True
    )
    thread.start()
    return thread
