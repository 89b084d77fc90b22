"""Where a job's files live, and the whole-model archive.

artifacts/<job_id>/model/      the published model folder (the pipeline renames it into place)
work/<job_id>/                 checkpoints and scratch; a re-run with the same folder resumes
uploads/<file_id>.<txt|jsonl>  corpora
The archive is never written: it is a deterministic tar of the model folder (fixed order,
mtime, mode, owner), so its size is known from the file sizes, its bytes at any offset can be
produced from the folder (HTTP Range), and its sha256 is computed once when the job finishes.
Shared by API and worker; imports neither FastAPI nor Celery.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from .settings import Settings

MODEL_FOLDER = "model"
LEGACY_ARCHIVE_NAME = "model.tar"  # jobs finished before the archive was streamed kept a written copy


def job_artifacts_dir(settings: Settings, job_id: str) -> Path:
    return settings.resolved_artifacts_dir / job_id


def model_dir(settings: Settings, job_id: str) -> Path:
    return job_artifacts_dir(settings, job_id) / MODEL_FOLDER


def legacy_archive_path(settings: Settings, job_id: str) -> Path:
    return job_artifacts_dir(settings, job_id) / LEGACY_ARCHIVE_NAME


def job_work_dir(settings: Settings, job_id: str) -> Path:
    return settings.resolved_work_dir / job_id


def upload_path(settings: Settings, file_id: str, suffix: str) -> Path:
    return settings.resolved_uploads_dir / f"{file_id}{suffix}"


def ensure_dirs(settings: Settings) -> None:
    for folder in (settings.resolved_uploads_dir, settings.resolved_artifacts_dir, settings.resolved_work_dir):
        folder.mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class _Piece:
    offset: int  # where it starts in the archive
    size: int
    data: bytes | None = None  # a tar header or zero padding
    path: Path | None = None  # or a file's contents


class ArchiveLayout:
    """An uncompressed tar of `source` (weights do not compress), described but never written.

    Members are the folder's files in path order, named `<root_name>/<relative path>`, with mode
    0644, owner 0:0 and the given mtime; headers come from `tarfile` itself, and the padding and
    end-of-archive blocks are those `tarfile` writes, so the bytes equal what `tarfile` would
    produce (a test checks it) and any client `tar` reads them."""

    def __init__(self, source: Path, root_name: str, mtime: int):
        self.mtime = mtime
        files = sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: p.relative_to(source).as_posix())
        self.pieces: list[_Piece] = []
        self.size = 0
        for path in files:
            info = tarfile.TarInfo(f"{root_name}/{path.relative_to(source).as_posix()}")
            info.size = path.stat().st_size
            info.mtime = mtime
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._add(data=info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            self._add(path=path, size=info.size)
            self._add(data=tarfile.NUL * (-info.size % tarfile.BLOCKSIZE))
        self._add(data=tarfile.NUL * (2 * tarfile.BLOCKSIZE))
        self._add(data=tarfile.NUL * (-self.size % tarfile.RECORDSIZE))
        self.starts = [piece.offset for piece in self.pieces]

    def _add(self, *, data: bytes | None = None, path: Path | None = None, size: int | None = None) -> None:
        size = len(data) if data is not None else size
        if size:
            self.pieces.append(_Piece(self.size, size, data, path))
            self.size += size

    def open(self) -> ArchiveReader:
        return ArchiveReader(self)

    def sha256(self) -> str:
        digest = hashlib.sha256()
        with self.open() as reader:
            while chunk := reader.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()


class ArchiveReader:
    """A read-only file over an ArchiveLayout: seek anywhere, read bytes as the tar has them.

    Every member file is opened at once, so a reader made before the folder is deleted reads the
    whole archive all the same (the open files outlive their unlinking); a member missing, or no
    longer the size the layout gave it, raises OSError here rather than in the middle of a read."""

    def __init__(self, layout: ArchiveLayout):
        self.layout = layout
        self.position = 0
        self._handles: dict[Path, BinaryIO] = {}
        try:
            for piece in layout.pieces:
                if piece.path is not None:
                    handle = self._handles[piece.path] = piece.path.open("rb")
                    if os.fstat(handle.fileno()).st_size != piece.size:
                        raise OSError(f"{piece.path} changed size since the archive was laid out")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ArchiveReader:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def seek(self, position: int) -> int:
        self.position = position
        return position

    def read(self, size: int) -> bytes:
        out = bytearray()
        layout = self.layout
        while size > 0 and self.position < layout.size:
            piece = layout.pieces[bisect.bisect_right(layout.starts, self.position) - 1]
            inside = self.position - piece.offset
            take = min(size, piece.size - inside)
            if piece.data is not None:
                chunk = piece.data[inside:inside + take]
            else:
                handle = self._handles[piece.path]
                handle.seek(inside)
                chunk = handle.read(take)
                if len(chunk) != take:
                    raise OSError(f"{piece.path} is shorter than when the archive was laid out; the published folder changed")
            out += chunk
            self.position += take
            size -= take
        return bytes(out)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()


def job_archive(settings: Settings, job_id: str, created_at: datetime) -> ArchiveLayout:
    """A job's archive: `<job_id>/...`, every member dated when the job was submitted (fixed for the
    job's life, so the worker that hashes it and the API that serves it lay out the same bytes)."""
    return ArchiveLayout(model_dir(settings, job_id), job_id, int(created_at.timestamp()))


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
