"""Where a job's files live, and the whole-model archive.

artifacts/<job_id>/model/      the published model folder (the pipeline renames it into place)
artifacts/<job_id>/model.tar   the same files as one archive, written once, renamed into place
work/<job_id>/                 checkpoints and scratch; a re-run with the same folder resumes
uploads/<file_id>.<txt|jsonl>  corpora
Shared by API and worker; imports neither FastAPI nor Celery.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

from .settings import Settings

MODEL_FOLDER = "model"
ARCHIVE_NAME = "model.tar"


def job_artifacts_dir(settings: Settings, job_id: str) -> Path:
    return settings.resolved_artifacts_dir / job_id


def model_dir(settings: Settings, job_id: str) -> Path:
    return job_artifacts_dir(settings, job_id) / MODEL_FOLDER


def archive_path(settings: Settings, job_id: str) -> Path:
    return job_artifacts_dir(settings, job_id) / ARCHIVE_NAME


def job_work_dir(settings: Settings, job_id: str) -> Path:
    return settings.resolved_work_dir / job_id


def upload_path(settings: Settings, file_id: str, suffix: str) -> Path:
    return settings.resolved_uploads_dir / f"{file_id}{suffix}"


def ensure_dirs(settings: Settings) -> None:
    for folder in (settings.resolved_uploads_dir, settings.resolved_artifacts_dir, settings.resolved_work_dir):
        folder.mkdir(parents=True, exist_ok=True)


class _HashingWriter:
    """File wrapper that hashes and counts what tarfile writes through it."""

    def __init__(self, handle):
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()


def build_archive(source: Path, target: Path, root_name: str) -> tuple[int, str]:
    """Uncompressed tar of `source` (weights do not compress), written to a temp name and renamed.

    A fixed file means HTTP Range works on it, so an interrupted download resumes.
    Returns (bytes, sha256)."""
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as raw:
        writer = _HashingWriter(raw)
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    info = tar.gettarinfo(str(path), arcname=f"{root_name}/{path.relative_to(source).as_posix()}")
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with path.open("rb") as handle:
                        tar.addfile(info, handle)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(partial, target)
    return writer.bytes, writer.sha256.hexdigest()


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
