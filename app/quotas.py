"""Per-key limits, so one key cannot fill the disk or every worker: jobs in flight, bytes kept.

Checked when a job or an upload is accepted; a key's running jobs may still add their models
on top (at most TIDE_MAX_ACTIVE_JOBS_PER_KEY of them).

A count and the insert it allows are one step: both run in one transaction that first locks the
key's row (`lock_key`), so parallel requests of one key take turns and each counts what the one
before it added. An upload holds its bytes before it writes them (`reserve`, a row in
upload_reservations counted with the stored files), so parallel or oversized uploads stop at the
quota instead of passing it.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from .db.models import ApiKey, Job, StoredFile, UploadReservation, utcnow
from .errors import ApiError
from .settings import Settings

IN_FLIGHT = ("queued", "running", "cancelling")


def lock_key(db: Session, key: ApiKey) -> None:
    """Hold the key's row until this transaction ends: another request of the same key that locks
    it waits here until this one commits or rolls back, and then counts what this one added.

    PostgreSQL (and other servers): SELECT ... FOR NO KEY UPDATE, a row lock that the foreign-key
    checks of inserts naming the key do not wait for. SQLite has no row locks: a write to the row
    takes the database's write lock at once, as BEGIN IMMEDIATE would (the driver begins the
    transaction right before this first write, so no earlier read can be stale); WAL readers go on."""
    if db.get_bind().dialect.name == "sqlite":
        db.execute(
            update(ApiKey).where(ApiKey.id == key.id).values(name=ApiKey.name).execution_options(synchronize_session=False)
        )
    else:
        db.execute(select(ApiKey.id).where(ApiKey.id == key.id).with_for_update(key_share=True))


def stored_bytes(db: Session, key: ApiKey, *, excluding: str | None = None) -> int:
    """Bytes this key keeps on the server: finished models (their archive size, which is the model
    folder plus tar headers), uploaded corpora (inline ones included) and the bytes uploads in
    progress have reserved (but not those of the upload `excluding`)."""
    models = db.scalar(
        select(func.coalesce(func.sum(Job.archive_bytes), 0)).where(
            Job.owner_id == key.id, Job.status == "succeeded", Job.artifacts_deleted.is_(False)
        )
    )
    uploads = db.scalar(select(func.coalesce(func.sum(StoredFile.bytes), 0)).where(StoredFile.owner_id == key.id))
    in_progress = select(func.coalesce(func.sum(UploadReservation.bytes), 0)).where(UploadReservation.owner_id == key.id)
    if excluding is not None:
        in_progress = in_progress.where(UploadReservation.id != excluding)
    return int(models) + int(uploads) + int(db.scalar(in_progress))


def check_storage(
    db: Session, key: ApiKey, settings: Settings, adding: int = 0, what: str = "", *, excluding: str | None = None,
) -> int:
    """507 once the key keeps its limit, or when `adding` more bytes (`what`: "the upload (2.0 MB)")
    would pass it; else the bytes the key keeps."""
    used = stored_bytes(db, key, excluding=excluding)
    limit = settings.max_stored_bytes_per_key
    if used >= limit or used + adding > limit:
        would = f", so {what} would pass it" if used < limit else ""
        raise ApiError(
            507, "storage_quota_exceeded",
            f"this API key keeps {_size(used)} of finished models and uploaded corpora on the server (uploads in progress "
            f"included) and its limit is {_size(limit)}{would}; delete jobs whose models you have downloaded "
            "(DELETE /jobs/{id}, which also deletes their inline corpus) or corpora you no longer need "
            "(GET /files lists them, DELETE /files/{id}), or wait: "
            f"models and uploads expire {settings.artifact_ttl_hours:g} hours after they were made; then try again",
        )
    return used


def check_active_jobs(db: Session, key: ApiKey, settings: Settings) -> None:
    active = db.scalar(select(func.count()).select_from(Job).where(Job.owner_id == key.id, Job.status.in_(IN_FLIGHT)))
    limit = settings.max_active_jobs_per_key
    if active >= limit:
        raise ApiError(
            429, "too_many_active_jobs",
            f"this API key has {active} jobs queued or running and its limit is {limit}; wait until one finishes "
            "(GET /jobs?status=running) or cancel one (POST /jobs/{id}/cancel), then submit again",
        )


def check_new_job(db: Session, key: ApiKey, settings: Settings, inline_bytes: int = 0) -> None:
    """Lock the key's row, then count: the caller inserts the job (and its inline corpus of
    `inline_bytes`) and commits in the same transaction, which releases the lock."""
    lock_key(db, key)
    check_active_jobs(db, key, settings)
    check_storage(db, key, settings, inline_bytes, f"corpus_text ({_size(inline_bytes)})")


def reserve(db: Session, key: ApiKey, settings: Settings, file_id: str, needed: int, wanted: int, what: str) -> int:
    """Hold `needed` bytes of the key's quota for upload `file_id` (up to `wanted` where they fit,
    so that an upload need not come back for every piece) and commit; the bytes held, or 507 if
    even `needed` would pass the quota (then the caller's session rolls back, and the lock goes)."""
    lock_key(db, key)
    used = check_storage(db, key, settings, needed, what, excluding=file_id)
    granted = wanted if used + wanted <= settings.max_stored_bytes_per_key else needed
    held = db.get(UploadReservation, file_id)
    if held is None:
        db.add(UploadReservation(id=file_id, owner_id=key.id, bytes=granted))
    else:
        held.bytes, held.updated_at = granted, utcnow()
    db.commit()
    return granted


def settle(db: Session, file_id: str, written: int) -> None:
    """The upload is all here: hold only the bytes it has (fewer frees quota, and a fresh
    `updated_at` tells the sweeper it is not left over while the corpus is checked)."""
    db.execute(
        update(UploadReservation).where(UploadReservation.id == file_id).values(bytes=written, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    db.commit()


def release(db: Session, file_id: str) -> None:
    """The upload failed (or was stored, in the caller's transaction): its bytes are no longer held."""
    db.execute(delete(UploadReservation).where(UploadReservation.id == file_id).execution_options(synchronize_session=False))


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
