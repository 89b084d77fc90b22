"""The one settings object for API, worker and CLI (environment prefix TIDE_).

Every part of the state lives under `TIDE_DATA_DIR` unless pointed elsewhere, so one volume
holds a whole deployment. API and worker must see the same database, uploads and artifacts.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from extension.plan.models import SCORE_CACHE_MAX_BYTES, ModelSources
from extension.plan.options import BY_NAME, DEFAULTS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_", env_file=".env", extra="ignore")

    # where things live
    data_dir: Path = Field(Path("data"), description="Root for all state unless a part is pointed elsewhere")
    cache_dir: Path | None = Field(None, description="Converted built-in models (default DATA_DIR/cache)")
    models_dir: Path | None = Field(None, description="Folder of saved HF models offered by name (default DATA_DIR/models)")
    score_cache_max_bytes: int = Field(
        SCORE_CACHE_MAX_BYTES, ge=0,
        description="Most bytes the base model's cached evaluation scores (CACHE_DIR/scores) may take; the entries used "
        "longest ago are removed past it (0 keeps none)",
    )
    allow_hub: bool = Field(False, description="Accept Hugging Face hub ids as base_model (needs internet)")
    hf_token: str | None = Field(None, description="Token for gated hub models when allow_hub is on")
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the job database, e.g. postgresql+psycopg://user:pw@db/tide "
        "(default: SQLite file DATA_DIR/tide.db)",
    )
    uploads_dir: Path | None = Field(None, description="Uploaded corpora (default DATA_DIR/uploads); shared by API and worker")
    artifacts_dir: Path | None = Field(
        None, description="Published models, one folder per job (default DATA_DIR/artifacts); shared by API and worker"
    )
    work_dir: Path | None = Field(
        None, description="Per-job working folders with training checkpoints for resume (default DATA_DIR/work); worker only"
    )

    # queue
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL of the Celery broker")
    queue: str = Field("gpu", description="Celery queue that GPU jobs are sent to and the worker consumes")
    model_queues: dict[str, str] = Field(
        default_factory=dict,
        description='Jobs of these base models go to these queues instead of TIDE_QUEUE, as JSON, e.g. {"my-7b": "gpu-80g"}: '
        "routes big models to the hosts whose workers consume that queue (their TIDE_QUEUE)",
    )

    # request limits
    max_terms: int = Field(1000, ge=1, description="Most terms one POST /extend may list")
    max_term_chars: int = Field(
        DEFAULTS["max_term_chars"], ge=1, le=BY_NAME["max_term_chars"].maximum, description="Longest term, in characters"
    )
    max_upload_bytes: int = Field(512 * 1024 * 1024, ge=1, description="Largest corpus upload accepted by POST /files, in bytes")
    max_corpus_text_chars: int = Field(
        1_000_000, ge=1, description="Longest inline corpus_text in POST /extend, in characters (upload bigger corpora)"
    )
    max_steps: int = Field(100_000, ge=1, description="Most training steps a job may ask for")
    max_request_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024,
        description="Largest request body other than a corpus upload (the JSON of POST /extend), in bytes; a larger one "
        "gets 413 before it is read. Keep it above 12 x TIDE_MAX_CORPUS_TEXT_CHARS (JSON escapes of non-ASCII text)",
    )
    request_body_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait for the next piece of a request body, in seconds; a client that stalls longer "
        "gets 408 and its connection is closed"
    )
    max_upload_s: float = Field(
        4 * 3600.0, gt=0,
        description="Longest one corpus upload (POST /files) may take to arrive, in seconds; past it the upload gets 408 "
        "and nothing is kept. The sweeper removes an upload's leftovers (the partial file and the quota it reserved, left "
        "by an API killed mid-upload) once nothing has written them for this long",
    )
    max_active_jobs_per_key: int = Field(
        4, ge=1, description="Most jobs one API key may have queued or running at once; POST /extend answers 429 beyond it"
    )
    max_submits_per_minute_per_key: int = Field(
        60, ge=0,
        description="Most POST /extend one API key may send in any 60 seconds (an idempotent replay is not counted); "
        "beyond it 429 too_many_submits with Retry-After. Counted in Redis, shared by every API process; 0: no limit",
    )
    max_stored_bytes_per_key: int = Field(
        20_000_000_000,
        ge=1,
        description="Most bytes of finished models and uploaded corpora one API key may keep on the server; "
        "POST /extend and POST /files answer 507 once it is reached",
    )

    # browser pages
    session_hours: float = Field(
        12.0, gt=0, description="How long a browser sign-in (/ui/login) lasts, in hours; the browser holds a session cookie, never the API key"
    )

    # job lifecycle
    job_time_limit_s: int = Field(
        6 * 3600, ge=10, description="Wall-clock limit of one job attempt in seconds; past it the job fails with time_limit_exceeded"
    )
    max_attempts: int = Field(
        3, ge=1, description="How many times a job is started (first run plus takeovers after a worker died) before it fails"
    )
    lease_s: int = Field(
        20,
        ge=3,
        description="Heartbeat lease in seconds, renewed every third of it: a running job whose lease is older is marked "
        "worker_lost and queued again (benchmarks/results/worker_loss.md measures the choice)",
    )
    cancel_poll_s: float = Field(1.0, gt=0, description="How often a running job re-reads its cancel flag, in seconds")
    artifact_ttl_hours: float = Field(
        7 * 24, gt=0, description="Hours after a job finishes before its artifacts (and its upload files) are deleted"
    )
    sweep_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often the API re-sends jobs whose worker vanished or whose queue message was lost, and expires "
        "old artifacts, in seconds",
    )
    requeue_after_s: float = Field(
        60.0,
        gt=0,
        description="A queued job whose message has been missing from its queue this many seconds (Redis restarted "
        "without persistence, or evicted it) is sent again; jobs sent more recently are not looked at",
    )
    max_requeues: int = Field(
        3, ge=0, description="How often a lost queue message of one job is sent again before the job fails with queue_message_lost"
    )
    max_queued_hours: float = Field(
        72.0,
        gt=0,
        description="A job that no worker has started this many hours after it was queued fails with queue_timeout "
        "(its queue may have no worker)",
    )

    # where a worker runs its jobs (extension/plan/devices.py)
    device: str = Field(
        DEFAULTS["device"],
        description="Device every stage of a job runs on: auto (this worker's GPU, cuda:0 of the GPUs the container or "
        "CUDA_VISIBLE_DEVICES gives it, when there is one; else cpu), cpu, cuda or cuda:N",
    )
    device_map: str = Field(
        DEFAULTS["device_map"],
        description="none: the whole model on TIDE_DEVICE. auto, balanced or sequential: accelerate spreads the frozen base "
        "model over every GPU this worker sees, then CPU memory, for models bigger than one GPU (give the worker several "
        "GPUs and route those models to its queue, docs/deploy.md); or a JSON object {module: cuda:N | cpu | disk}",
    )

    precision: str = Field(
        DEFAULTS["precision"],
        description="What a job's frozen base model computes in: auto (bf16 where this worker's device computes it in "
        "hardware: a GPU that supports it, a CPU with AMX or AVX-512 BF16; else the checkpoint's dtype) or checkpoint "
        "(always the checkpoint's dtype). The published weights are the checkpoint's own either way",
    )

    @field_validator("device")
    @classmethod
    def _device_form(cls, value: str) -> str:
        from extension.plan.device_options import device_problem

        problem = device_problem(value)
        if problem:
            raise ValueError(f"TIDE_DEVICE {problem}")
        return value

    @field_validator("precision")
    @classmethod
    def _precision_form(cls, value: str) -> str:
        problem = BY_NAME["precision"].problem(value)  # the choices live in extension/plan/options.py
        if problem:
            raise ValueError(f"TIDE_PRECISION {problem}")
        return value

    @field_validator("device_map")
    @classmethod
    def _device_map_form(cls, value: str) -> str:
        from extension.plan.device_options import device_map_problem

        problem = device_map_problem(value)
        if problem:
            raise ValueError(f"TIDE_DEVICE_MAP {problem}")
        return value

    # worker process
    worker_nice: int = Field(
        10, ge=0, le=19, description="Niceness added to each job process so a co-located API stays responsive"
    )
    worker_torch_threads: int | None = Field(
        None, ge=1, description="torch CPU threads per job process (default: torch's own choice)"
    )
    readyz_timeout_s: float = Field(1.0, gt=0, description="How long /readyz waits for a worker to answer a ping, in seconds")

    @property
    def resolved_cache_dir(self) -> Path:
        return self.cache_dir or self.data_dir / "cache"

    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir or self.data_dir / "models"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'tide.db').resolve()}"

    @property
    def resolved_uploads_dir(self) -> Path:
        return self.uploads_dir or self.data_dir / "uploads"

    @property
    def resolved_artifacts_dir(self) -> Path:
        return self.artifacts_dir or self.data_dir / "artifacts"

    @property
    def resolved_work_dir(self) -> Path:
        return self.work_dir or self.data_dir / "work"

    @property
    def visibility_timeout_s(self) -> int:
        # Redis redelivers an unacknowledged message after this; it must outlast the longest job.
        return self.job_time_limit_s + 3600

    def queue_for(self, base_model: str | None) -> str:
        """The queue a job of this base model is sent to (docs/deploy.md: routing by GPU size)."""
        return self.model_queues.get(base_model or "", self.queue)

    def model_sources(self) -> ModelSources:
        return ModelSources(
            cache_dir=self.resolved_cache_dir,
            models_dir=self.resolved_models_dir,
            allow_hub=self.allow_hub,
            hub_token=self.hf_token,
            score_cache_max_bytes=self.score_cache_max_bytes,
        )


@lru_cache
def get_settings() -> Settings:
    return Settings()
