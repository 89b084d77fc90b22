"""Per-key limits, so one key cannot fill the disk or every worker: jobs in flight, bytes kept.

Checked when a job or an upload is accepted; a key's running jobs may still add their models
on top (at most TIDE_MAX_ACTIVE_JOBS_PER_KEY of them).
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .db.models import ApiKey, Job, StoredFile
from .errors import ApiError
from .settings import Settings

IN_FLIGHT = ("queued", "running", "cancelling")


def stored_bytes(db: Session, key: ApiKey) -> int:
    """Bytes this key keeps on the server: finished models (their archive size, which is the model
    folder plus tar headers) and uploaded corpora (inline ones included)."""
    models = db.scalar(
        select(func.coalesce(func.sum(Job.archive_bytes), 0)).where(
            Job.owner_id == key.id, Job.status == "succeeded", Job.artifacts_deleted.is_(False)
        )
    )
    uploads = db.scalar(select(func.coalesce(func.sum(StoredFile.bytes), 0)).where(StoredFile.owner_id == key.id))
    return int(models) + int(uploads)


def check_storage(db: Session, key: ApiKey, settings: Settings) -> None:
    used = stored_bytes(db, key)
    limit = settings.max_stored_bytes_per_key
    if used >= limit:
        raise ApiError(
            507, "storage_quota_exceeded",
            f"this API key keeps {_size(used)} of finished models and uploaded corpora on the server and its limit is "
            f"{_size(limit)}; delete jobs whose models you have downloaded (DELETE /jobs/{{id}}, which also deletes "
            "their inline corpus) or corpora you no longer need (GET /files lists them, DELETE /files/{id}), or wait: "
            f"models and uploads expire {settings.artifact_ttl_hours:g} hours after they were made; then try again",
        )


def check_active_jobs(db: Session, key: ApiKey, settings: Settings) -> None:
    active = db.scalar(select(func.count()).select_from(Job).where(Job.owner_id == key.id, Job.status.in_(IN_FLIGHT)))
    limit = settings.max_active_jobs_per_key
    if active >= limit:
        raise ApiError(
            429, "too_many_active_jobs",
            f"this API key has {active} jobs queued or running and its limit is {limit}; wait until one finishes "
            "(GET /jobs?status=running) or cancel one (POST /jobs/{id}/cancel), then submit again",
        )


def check_new_job(db: Session, key: ApiKey, settings: Settings) -> None:
    check_active_jobs(db, key, settings)
    check_storage(db, key, settings)


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
