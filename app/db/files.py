"""A key's stored corpora: list them with the jobs that use them, delete one.

A corpus a queued, running or cancelling job reads cannot go: its worker opens the file when the
job starts (and again on a resumed attempt). Deleting is one conditional DELETE whose row count
decides the answer, so a job submitted on the file at the same moment either keeps it (409) or
finds it gone, never a job left pointing at a deleted file. Finished jobs that used the file
forget it (their `corpus_file_id` is cleared, as the sweeper does when an upload expires).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import and_, delete, exists, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .models import TERMINAL, ApiKey, Job, StoredFile

@dataclass(frozen=True)
class FileUser:
    job_id: str
    status: str


@dataclass(frozen=True)
class FilePage:
    files: list[tuple[StoredFile, list[FileUser]]]
    next_cursor: str | None


class FileNotFound(Exception):
    """No such file for this key (another key's file is no file at all)."""


class FileInUse(Exception):
    def __init__(self, user: FileUser):
        super().__init__(user.job_id)
        self.user = user


def owned_file(db: Session, key: ApiKey, file_id: str) -> StoredFile:
    stored = db.get(StoredFile, file_id)
    if stored is None or stored.owner_id != key.id:
        raise FileNotFound(file_id)
    return stored


def users_of(db: Session, file_ids: list[str]) -> dict[str, list[FileUser]]:
    """The jobs that use each file, newest first."""
    users: dict[str, list[FileUser]] = {file_id: [] for file_id in file_ids}
    if file_ids:
        rows = db.execute(
            select(Job.corpus_file_id, Job.id, Job.status).where(Job.corpus_file_id.in_(file_ids)).order_by(Job.seq.desc())
        )
        for file_id, job_id, status in rows:
            users[file_id].append(FileUser(job_id, status))
    return users


def list_files(db: Session, key: ApiKey, *, limit: int, after: StoredFile | None = None) -> FilePage:
    """The key's files, newest first, `limit` a page; `after` is the last file of the previous page."""
    query = select(StoredFile).where(StoredFile.owner_id == key.id)
    if after is not None:
        # (created_at, id) orders files uniquely even when two were stored in the same instant
        query = query.where(or_(
            StoredFile.created_at < after.created_at,
            and_(StoredFile.created_at == after.created_at, StoredFile.id < after.id),
        ))
    rows = list(db.scalars(query.order_by(StoredFile.created_at.desc(), StoredFile.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    users = users_of(db, [stored.id for stored in rows])
    return FilePage([(stored, users[stored.id]) for stored in rows], rows[-1].id if more else None)


def _active_user(db: Session, file_id: str) -> FileUser | None:
    row = db.execute(
        select(Job.id, Job.status).where(Job.corpus_file_id == file_id, Job.status.not_in(TERMINAL)).order_by(Job.seq).limit(1)
    ).first()
    return FileUser(row.id, row.status) if row else None


def delete_file(db: Session, key: ApiKey, file_id: str) -> StoredFile:
    """Delete the file's row (committed) and then its bytes. Raises FileNotFound or FileInUse."""
    for _attempt in range(3):
        stored = owned_file(db, key, file_id)
        user = _active_user(db, file_id)
        if user is not None:
            raise FileInUse(user)
        if _delete_unused(db, key, file_id):
            # After the commit: a crash in between leaves unreferenced bytes, never a row without its file.
            Path(stored.path).unlink(missing_ok=True)
            return stored
        db.expire_all()  # a job changed under us (started or finished on this file): look again
    raise FileInUse(_active_user(db, file_id) or FileUser("unknown", "changing"))


def _delete_unused(db: Session, key: ApiKey, file_id: str) -> bool:
    """Forget the file in finished jobs and delete its row, unless some other job uses it now."""
    try:
        db.execute(
            update(Job).where(Job.corpus_file_id == file_id, Job.status.in_(TERMINAL)).values(corpus_file_id=None)
            .execution_options(synchronize_session=False)
        )
        deleted = db.execute(
            delete(StoredFile)
            .where(StoredFile.id == file_id, StoredFile.owner_id == key.id, ~exists().where(Job.corpus_file_id == file_id))
            .execution_options(synchronize_session=False)
        ).rowcount
    except IntegrityError:  # a job finished on it between the two statements and still names it
        db.rollback()
        return False
    if deleted != 1:
        db.rollback()
        return False
    db.commit()
    return True
