"""Database rows -> response bodies."""

from __future__ import annotations

from .db.files import FileUser
from .db.models import Job, StoredFile
from . import schemas


def job_view(job: Job) -> schemas.Job:
    total = job.progress_total or 0
    step = job.progress_step or 0
    percent = 100.0 if job.status == "succeeded" else (round(100.0 * step / total, 2) if total else 0.0)
    error = None
    if job.error_code:
        error = schemas.ErrorBody(code=job.error_code, message=job.error_message or "", param=job.error_param)
    artifacts = None
    if job.status == "succeeded" and not job.artifacts_deleted:
        artifacts = schemas.ArtifactLinks(
            manifest_url=f"/jobs/{job.id}/artifacts", archive_url=f"/jobs/{job.id}/archive", expires_at=job.expires_at
        )
    result = job.result or {}
    return schemas.Job(
        id=job.id,
        status=job.status,
        stage=job.stage,
        progress=schemas.Progress(step=step, total=total, percent=percent),
        base_model=job.base_model,
        attempt=job.attempt or 0,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        error=error,
        metrics=job.metrics,
        mined_terms=result.get("mined_terms"),
        artifacts=artifacts,
        request=job.request,
    )


def file_view(stored: StoredFile, users: list[FileUser] = ()) -> schemas.FileObject:
    return schemas.FileObject(
        id=stored.id, filename=stored.filename, bytes=stored.bytes, sha256=stored.sha256,
        documents=stored.documents, source=stored.source, created_at=stored.created_at,
        jobs=[schemas.FileJob(id=user.job_id, status=user.status) for user in users],
    )
