"""Periodic housekeeping, run by the API: nothing stays running forever, nothing stays forever.

- queued jobs that never reached the queue (Redis was down at submit) are sent again;
- a job whose lease expired (its worker died) is sent again, once per expiry: the task's claim
  then takes it over and resumes, or fails it after the last attempt; a job that was being
  cancelled when its worker died is simply marked cancelled;
- artifacts, work folders and uploads older than the TTL are deleted.
Every step is a conditional update, so two API replicas sweeping at once do no harm.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from .db.jobs import add_event
from .db.models import TERMINAL, Job, StoredFile, utcnow
from .settings import Settings
from .storage import job_artifacts_dir, job_work_dir, remove_tree

log = logging.getLogger("tide.sweeper")

_UNSENT_GRACE = timedelta(seconds=5)


def sweep(settings: Settings, sessions: sessionmaker[Session], queue) -> dict[str, int]:
    now = utcnow()
    counts = {"resent": 0, "taken_over": 0, "cancelled": 0, "expired": 0, "uploads_deleted": 0}
    with sessions() as db:
        unsent = db.execute(select(Job.id, Job.base_model).where(Job.status == "queued", Job.enqueued_at.is_(None), Job.created_at < now - _UNSENT_GRACE))
        for job_id, base_model in list(unsent):
            if _send(db, queue, job_id, base_model):
                counts["resent"] += 1

        dead = select(Job).where(Job.status.in_(("running", "cancelling")), Job.lease_expires_at < now)
        for job in list(db.scalars(dead)):
            if job.status == "cancelling":
                done = db.execute(
                    update(Job)
                    .where(Job.id == job.id, Job.status == "cancelling", Job.lease_expires_at < now)
                    .values(status="cancelled", finished_at=now, updated_at=now, claim_token=None)
                    .execution_options(synchronize_session=False)
                ).rowcount
                if done:
                    add_event(db, job.id, "status", {"status": "cancelled"})
                    db.commit()
                    counts["cancelled"] += 1
            elif job.enqueued_at is None or job.enqueued_at < job.lease_expires_at:
                if _send(db, queue, job.id, job.base_model):
                    counts["taken_over"] += 1

        expired = select(Job).where(Job.status.in_(TERMINAL), Job.artifacts_deleted.is_(False), Job.expires_at < now)
        for job in list(db.scalars(expired)):
            remove_tree(job_artifacts_dir(settings, job.id))
            remove_tree(job_work_dir(settings, job.id))
            job.artifacts_deleted = True
            add_event(db, job.id, "artifacts_expired", {})
            db.commit()
            counts["expired"] += 1

        cutoff = now - timedelta(hours=settings.artifact_ttl_hours)
        busy = select(Job.corpus_file_id).where(Job.corpus_file_id.is_not(None), Job.status.not_in(TERMINAL))
        for stored in list(db.scalars(select(StoredFile).where(StoredFile.created_at < cutoff, StoredFile.id.not_in(busy)))):
            db.execute(update(Job).where(Job.corpus_file_id == stored.id).values(corpus_file_id=None))
            Path(stored.path).unlink(missing_ok=True)
            db.delete(stored)
            db.commit()
            counts["uploads_deleted"] += 1
    if any(counts.values()):
        log.info("sweep: %s", counts)
    return counts


def _send(db: Session, queue, job_id: str, base_model: str) -> bool:
    try:
        queue.send(job_id, base_model)
    except Exception as exc:
        log.warning("sweep: could not queue %s: %s", job_id, exc)
        return False
    db.execute(update(Job).where(Job.id == job_id).values(enqueued_at=utcnow()))
    db.commit()
    return True
