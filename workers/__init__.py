"""Worker processes: the Celery app, the engine, leases, the reaper and the launcher."""
