"""The published model: manifest, single files and the whole archive, all with Range support."""

from __future__ import annotations

import logging
from typing import Callable

from fastapi import APIRouter

from ..db.models import Job
from ..deps import KeyDep, SessionsDep, SettingsDep
from ..downloads import ArchiveResponse, Download, OpenedDownload
from ..errors import ApiError, quoted
from ..schemas import Archive, ArtifactFile, Artifacts, ErrorResponse
from ..storage import job_archive, legacy_archive_path, model_dir
from .jobs import owned_job
from . import AUTH_ERRORS, CONFLICT, GONE, NOT_FOUND

log = logging.getLogger("tide.api")
router = APIRouter(tags=["artifacts"], responses={**AUTH_ERRORS, **NOT_FOUND, **CONFLICT, **GONE})

_DOWNLOAD = {
    200: {"content": {"application/octet-stream": {}}, "description": "The file"},
    206: {"content": {"application/octet-stream": {}}, "description": "The requested byte range"},
    416: {"model": ErrorResponse, "description": "The Range starts past the end of the file (an unparseable Range is ignored: 200, whole file)"},
}


def _published(sessions, key, job_id: str) -> Job:
    with sessions() as db:
        job = owned_job(db, key, job_id)
    if job.status != "succeeded":
        raise ApiError(409, "job_not_succeeded", f"job {job_id} is {job.status}; artifacts exist only once it has succeeded", "job_id")
    if job.artifacts_deleted:
        raise ApiError(410, "artifacts_expired", f"the artifacts of job {job_id} have expired or were deleted; run the job again", "job_id")
    return job


def _archive_name(job: Job) -> str:
    return f"{job.id}.tar"


@router.get("/jobs/{job_id}/artifacts", response_model=Artifacts, summary="The manifest: every file with size and sha256")
def artifacts(job_id: str, sessions: SessionsDep, key: KeyDep) -> Artifacts:
    job = _published(sessions, key, job_id)
    files = [
        ArtifactFile(path=f["path"], size=f["size"], sha256=f["sha256"], url=f"/jobs/{job.id}/artifacts/{f['path']}")
        for f in job.manifest or []
    ]
    archive = Archive(url=f"/jobs/{job.id}/archive", filename=_archive_name(job), size=job.archive_bytes or 0, sha256=job.archive_sha256 or "")
    return Artifacts(job_id=job.id, files=files, archive=archive, expires_at=job.expires_at)


def _opened(sessions, key, job: Job, open_download: Callable[[], OpenedDownload]) -> OpenedDownload:
    """Open the download's files now, before any header goes out. Files missing here were deleted
    or expired meanwhile (the job's row changes first): a fresh look at the job answers 404 or
    410. Files missing from a job still published are damage, which the operator must see."""
    try:
        return open_download()
    except OSError as exc:
        _published(sessions, key, job.id)
        log.error("job %s: its published files cannot be sent: %s", job.id, exc)
        raise ApiError(
            500, "artifacts_damaged",
            f"the stored files of job {job.id} no longer match its manifest; the operator has been told in the log — run the job again",
            "job_id",
        ) from None


# HEAD answers the headers a GET would (Content-Length, Accept-Ranges, ETag, Last-Modified) without
# the body, so `curl -I` learns a download's size.
@router.head("/jobs/{job_id}/artifacts/{path:path}", include_in_schema=False)
@router.get(
    "/jobs/{job_id}/artifacts/{path:path}",
    status_code=200,
    response_class=Download,
    summary="One file of the published model (supports Range)",
    responses=_DOWNLOAD,
)
def artifact_file(job_id: str, path: str, sessions: SessionsDep, key: KeyDep, settings: SettingsDep) -> OpenedDownload:
    job = _published(sessions, key, job_id)
    # Only paths the manifest lists: no way to name anything else on disk.
    if path not in {f["path"] for f in job.manifest or []}:
        raise ApiError(404, "not_found", f"job {job_id} has no artifact {quoted(path, 200)}; GET /jobs/{job_id}/artifacts lists them", "path")
    return _opened(sessions, key, job, lambda: Download(
        model_dir(settings, job.id) / path, filename=path.rsplit("/", 1)[-1], media_type="application/octet-stream"))


@router.head("/jobs/{job_id}/archive", include_in_schema=False)
@router.get(
    "/jobs/{job_id}/archive",
    status_code=200,
    response_class=Download,
    summary="The whole model as one .tar (supports Range, so a broken download resumes with curl -C -)",
    responses=_DOWNLOAD,
)
def archive(job_id: str, sessions: SessionsDep, key: KeyDep, settings: SettingsDep) -> OpenedDownload:
    job = _published(sessions, key, job_id)

    def open_archive() -> OpenedDownload:
        legacy = legacy_archive_path(settings, job.id)
        if legacy.is_file():
            return Download(legacy, filename=_archive_name(job), media_type="application/x-tar")
        layout = job_archive(settings, job.id, job.created_at)
        if layout.size != job.archive_bytes:
            raise OSError(f"its model folder lays out as {layout.size} archive bytes, {job.archive_bytes} were published")
        return ArchiveResponse(layout, filename=_archive_name(job), sha256=job.archive_sha256 or "", mtime=layout.mtime)

    return _opened(sessions, key, job, open_archive)
