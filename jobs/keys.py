"""Every Redis key and channel that mmq uses, in one place."""

from __future__ import annotations

PREFIX = "mmq"

EVENTS_CHANNEL = f"{PREFIX}:events"
"""Pub/sub channel: one notice per event of any job, for API processes that have a
request following a job's events (SSE, websocket, streamed OpenAI answers)."""

ENDS_CHANNEL = f"{PREFIX}:ends"
"""Pub/sub channel: each job's terminal status notice again, with the job's fields unless
they are large (`lua.NOTICE_JOB_MAX_BYTES`), for requests that wait for the end. An API
process listens here always, and on `EVENTS_CHANNEL` only while it has followers."""

CANCEL_CHANNEL = f"{PREFIX}:cancel"
"""Pub/sub channel: the id of a running job whose owner asked to cancel it."""

RUNNING = f"{PREFIX}:running"
"""Sorted set: running job ids scored by their lease deadline (unix seconds)."""

DEADLINES = f"{PREFIX}:deadlines"
"""Sorted set: ids of jobs with a deadline that is still to be enforced, scored by it
(unix seconds): queued ones (they expire) and running ones that asked to be canceled at
it (`cancel_at_deadline`). The transition script keeps it; the reaper sweeps it."""

WORKERS = f"{PREFIX}:workers"
"""Sorted set: worker names scored by their last heartbeat (unix seconds)."""

API_KEYS = f"{PREFIX}:apikeys"
"""Hash: sha256 of an API key -> JSON {owner, created_at, admin}."""


UPLOADS = f"{PREFIX}:uploads"
"""Sorted set: storage keys of uploads, scored by when the retention sweep looks at them."""

ARTIFACTS = f"{PREFIX}:artifacts"
"""Sorted set: `owner/jobs/job_id` folders of stored job outputs, scored by when the
retention sweep looks at them (it deletes a folder once the job's record has expired)."""


def job(job_id: str) -> str:
    """Hash: one job record."""
    return f"{PREFIX}:job:{job_id}"


def job_events(job_id: str) -> str:
    """Stream: the job's events, replayable by id."""
    return f"{PREFIX}:job:{job_id}:events"


def lease(job_id: str) -> str:
    """String: the token of the worker that runs the job, with a short TTL."""
    return f"{PREFIX}:lease:{job_id}"


def owner_jobs(owner: str) -> str:
    """Sorted set: an owner's job ids scored by creation time."""
    return f"{PREFIX}:owner:{owner}:jobs"


ALL_JOBS = f"{PREFIX}:jobs"
"""Sorted set: every owner's job ids scored by creation time (the admin listing; ids of
expired jobs leave it when a listing meets them, as they leave an owner's index)."""


def queued(kind: str) -> str:
    """Set: the ids of a kind's queued jobs (admission control counts it)."""
    return f"{PREFIX}:queued:{kind}"


def queued_batch(kind: str) -> str:
    """Set: the ids of a kind's queued jobs that are lines of a batch (released by the
    scheduler): kept apart from `queued`, so that a batch never counts against the
    429 bound."""
    return f"{PREFIX}:queued:{kind}:batch"


BATCHES_ACTIVE = f"{PREFIX}:batches:active"
"""Set: ids of the batches that the scheduler works on (not yet ended)."""


def batch(batch_id: str) -> str:
    """Hash: a batch's record (see `jobstore.batch_records.Batch`)."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_lines(batch_id: str) -> str:
    """List: JSON of each valid line still to be released, in file order."""
    return f"{PREFIX}:batch:{batch_id}:lines"


def batch_inflight(batch_id: str) -> str:
    """Hash: job id -> JSON of its line, for each released line whose job has not been
    collected."""
    return f"{PREFIX}:batch:{batch_id}:inflight"


def batch_output(batch_id: str) -> str:
    """List: the output file's lines (JSONL), as collected."""
    return f"{PREFIX}:batch:{batch_id}:output"


def batch_errors(batch_id: str) -> str:
    """List: the error file's lines (JSONL): invalid lines, failed requests."""
    return f"{PREFIX}:batch:{batch_id}:errors"


def owner_batches(owner: str) -> str:
    """Sorted set: an owner's batch ids scored by creation time."""
    return f"{PREFIX}:owner:{owner}:batches"


BATCHES = f"{PREFIX}:batches:all"
"""Sorted set: every owner's batch ids scored by creation time (an admin's list). Like an
owner's index, it may name a batch whose record has expired: readers skip those."""


def file_object(file_id: str) -> str:
    """Hash: an OpenAI file object (`file-…`): its storage key, owner, purpose, name,
    size and creation time."""
    return f"{PREFIX}:file:{file_id}"


def owner_files(owner: str) -> str:
    """Sorted set: an owner's OpenAI file ids scored by creation time."""
    return f"{PREFIX}:owner:{owner}:files"


LIMITS = f"{PREFIX}:limits"
"""Hash: owner -> JSON of the limits `mmq keys limits` set for it (`jobstore.quotas.Limits`),
over the deployment's `quotas` defaults."""

USAGE_PREFIX = f"{PREFIX}:usage:"

OWNERS = f"{PREFIX}:owners"
"""Set: every owner that has submitted a job (whose usage `/metrics` and the overview show)."""


def usage(owner: str) -> str:
    """Hash: what an owner uses now: `queued` (its jobs queued, batch lines apart) and
    `running` (its jobs released to the workers: running, or their message pushed). The
    submit, release and transition scripts keep it (the transition script names it
    from the job's owner and `USAGE_PREFIX`)."""
    return f"{USAGE_PREFIX}{owner}"


def requests_in(owner: str, window: int) -> str:
    """String: the jobs an owner submitted in one quota window (unix seconds //
    `quotas.window_s`), with a TTL of two windows."""
    return f"{PREFIX}:requests:{owner}:{window}"


def device_models(host: str, device: str) -> str:
    """Hash: worker -> JSON of the model it holds on one device of a host (`pipeline`,
    `bytes`, `loaded_at`, `idle_since` (0 while it has work), `resident`): what the
    device's budget counts (`workers.residency`). An entry of a worker whose heartbeat
    stopped counts for nothing and is dropped."""
    return f"{PREFIX}:models:{host}|{device}"


def device_evictions(host: str, device: str) -> str:
    """Hash: worker -> the worker that waits for its room (it unloads if idle)."""
    return f"{PREFIX}:evict:{host}|{device}"


def device_waiting(host: str, device: str) -> str:
    """Hash: worker -> JSON {pipeline, since} of a worker waiting for room on the device
    to load its model: the scheduler stops feeding the device's other on-demand
    models that have had `min_loaded_s`, so that they drain and make room."""
    return f"{PREFIX}:waiting:{host}|{device}"


MODEL_DEVICES = f"{PREFIX}:model-devices"
"""Set: `host|device` of every device whose models are counted (`device_models`)."""


def cost_in(owner: str, kind: str, window: int) -> str:
    """String: what an owner's jobs of `kind` cost in one quota window
    (`jobstore.quotas.COST_UNITS`), with a TTL of two windows."""
    return f"{PREFIX}:cost:{owner}:{kind}:{window}"


HOLD_PREFIX = f"{PREFIX}:hold:"


def hold(pipeline: str, priority: str, owner: str) -> str:
    """List: an owner's held jobs of one pipeline and priority, oldest first, each as JSON
    {job_id, list, envelope}: the task message that the scheduler pushes when it is
    the owner's turn (fair share, `fairness.enabled`)."""
    return f"{HOLD_PREFIX}{pipeline}|{priority}|{owner}"


def holders(pipeline: str, priority: str) -> str:
    """Sorted set: the owners with held jobs of one pipeline and priority, scored by their
    pass (stride scheduling: the lowest goes next)."""
    return f"{PREFIX}:holders:{pipeline}|{priority}"


def passes(pipeline: str, priority: str) -> str:
    """Hash: owner -> its pass at one pipeline and priority; field `""` is the pass of the
    last release (the virtual time an owner that starts holding joins at)."""
    return f"{PREFIX}:passes:{pipeline}|{priority}"


HELD = f"{PREFIX}:held"
"""Hash: `pipeline|priority` -> jobs held there now."""


def room(pipeline: str) -> str:
    """Hash: priority (high, normal, low) -> slots of a pipeline that a submit at that
    priority may still fill at once (messages of lower priorities waiting in the queue do
    not count: a worker takes the higher one first), written by the scheduler every
    step with a short TTL (absent: no scheduler runs, and submits push their
    messages at once)."""
    return f"{PREFIX}:room:{pipeline}"


def idempotency(owner: str, key: str) -> str:
    """String: `job_id|body_hash` of the job an Idempotency-Key created."""
    return f"{PREFIX}:idem:{owner}:{key}"


def worker(name: str) -> str:
    """Hash: what a live worker serves (kind, pipeline, device)."""
    return f"{PREFIX}:worker:{name}"


def pipeline_state(name: str) -> str:
    """Hash: how the last start of a pipeline's worker went, for `/readyz` and `mmq up`:
    `state` (loading | ready | failed), `reason` (why the last start failed: a short first
    line, then the engine log's relevant lines; kept while the next start loads), `worker`,
    `pid`, `at` (unix seconds). A TTL, renewed while loading, so a worker that dies
    without a word leaves no `loading` behind."""
    return f"{PREFIX}:pipeline:{name}:state"


def deliveries(job_id: str) -> str:
    """List: JSON records of every webhook delivery attempt of the job."""
    return f"{PREFIX}:job:{job_id}:deliveries"


def webhook_done(job_id: str) -> str:
    """Set: the ids of the job's events whose webhook delivery has ended (delivered, or
    given up): a later event's delivery waits for the earlier ones (`jobstore.webhook_turns`)."""
    return f"{PREFIX}:job:{job_id}:webhook_done"


def webhook_cursor(job_id: str) -> str:
    """String: an event id up to which every delivery the job's webhook wants has ended."""
    return f"{PREFIX}:job:{job_id}:webhook_cursor"


def upload_jobs(storage_key: str) -> str:
    """Set: ids of the jobs whose input used an upload (it stays while one of them does)."""
    return f"{PREFIX}:upload:{storage_key}:jobs"


def response_cache(owner: str, digest: str) -> str:
    """String: JSON output of a deterministic request, answered again until it expires."""
    return f"{PREFIX}:cache:{owner}:{digest}"


def metric(name: str) -> str:
    """Hash: one metric's samples from every process, field = JSON label values (and
    bucket); counters and histogram buckets grow with HINCRBY (see jobstore/metric_counts.py)."""
    return f"{PREFIX}:metric:{name}"


def recent(minute: int) -> str:
    """Hash: counts of one minute (unix seconds // 60) for the admin overview's "last few
    minutes" (see jobstore/recent_counts.py), with a TTL."""
    return f"{PREFIX}:recent:{minute}"


DEVICES = f"{PREFIX}:devices"
"""Sorted set: `host/device` of each GPU or MIG slice that workers read, scored by time."""


def device(host_device: str) -> str:
    """Hash: the last reading of one GPU or MIG slice (utilisation, memory), with a TTL."""
    return f"{PREFIX}:device:{host_device}"


BACKENDS = f"{PREFIX}:backends"
"""Sorted set: the workers whose pipeline's backend has readings (an LLM engine's own
gauges), scored by time."""


def backend(worker: str) -> str:
    """Hash: the last readings of one worker's backend (`Pipeline.readings`), with its
    host, worker and pipeline, with a TTL."""
    return f"{PREFIX}:backend:{worker}"


# Realtime voice sessions (OpenAI's Realtime API, issue 52): see jobstore/realtime_sessions.py.

REALTIME_LIVE = f"{PREFIX}:realtime:live"
"""Sorted set: the ids of every owner's open realtime sessions, scored by when their
hold runs out (unix seconds, Redis's clock) unless renewed: what `/metrics` counts."""


def realtime_secret(hashed: str) -> str:
    """String: JSON {owner, key, session} of an ephemeral client secret (`ek_…`), named by the
    secret's SHA-256 (never the secret), with a TTL until it expires."""
    return f"{PREFIX}:realtime:secret:{hashed}"


def realtime_secrets_of(key_ref: str) -> str:
    """Sorted set: the hashes of the live client secrets that one API key made (`key_ref`:
    the key's SHA-256, or `owner:<name>` for a caller without a key), scored by when each
    expires (unix seconds, Redis's clock): the cap per key counts it, and a revoked key's
    secrets are deleted through it."""
    return f"{PREFIX}:realtime:secrets:{key_ref}"


REALTIME_LOG_BYTES = f"{PREFIX}:realtime:log_bytes"
"""Hash: the bytes that the realtime event logs hold, by session id, by `owner:<name>`
and in all (`total`), for the caps per session and per key and for `/metrics`."""

REALTIME_LOG_EXPIRY = f"{PREFIX}:realtime:log_expiry"
"""Sorted set: `<session id>:<owner>` of every kept realtime event log, scored by when
it expires (unix seconds, Redis's clock): an expired log's bytes leave
`REALTIME_LOG_BYTES` when a later append or a `/metrics` scrape meets it."""


def owner_realtime(owner: str) -> str:
    """Sorted set: an owner's open realtime session ids, scored by when their hold runs out
    (unix seconds, Redis's clock); its cap of concurrent sessions counts the live ones."""
    return f"{PREFIX}:owner:{owner}:realtime"


def realtime_session(session_id: str) -> str:
    """Hash: a realtime session's `owner` and `created_at`, with the TTL of its events."""
    return f"{PREFIX}:realtime:session:{session_id}"


def realtime_events(session_id: str) -> str:
    """Stream: a realtime session's events (field `data`: the event's JSON), replayable by
    id, capped, with a TTL renewed on every append."""
    return f"{PREFIX}:realtime:session:{session_id}:events"


# Stored responses (OpenAI's Responses API, issue 53): see jobstore/responses.py.


def response(job_id: str) -> str:
    """String: JSON of a stored response's record (its owner, its request and its input
    items: `jobstore.responses.ResponseRecord`), named by the id of the `llm` job that
    answers it, with a TTL of `job_ttl_s` past the longest the job may wait and run."""
    return f"{PREFIX}:response:{job_id}"
