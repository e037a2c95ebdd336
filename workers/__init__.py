"""One worker process's runtime: the process and its Celery worker (`process`), the
engine that micro-batches a pipeline's requests (`engine`), a job's run under its lease
(`jobrunner`), leases and heartbeats (`leases`), the events it writes (`events`), a job's
files (`jobfiles`), the device readings it publishes (`metrics`) and where its model lives
(`residency`). The Celery app is `broker/`'s, the supervisor that starts workers `host/`'s,
and the daemons that watch them (reaper, scheduler) `cluster/` and `scheduler/`."""
