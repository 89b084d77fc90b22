"""Periodic housekeeping, run by the API: every job reaches a worker or fails with a reason,
nothing stays running forever, nothing stays forever.

- queued jobs that never reached the queue (Redis was down at submit) are sent again;
- queued jobs whose message the broker no longer holds (Redis restarted without persistence or
  evicted it, or a worker took it and vanished before starting it) are sent again, at most
  `max_requeues` times, then fail with queue_message_lost; a job no worker has started within
  `max_queued_hours` fails with queue_timeout. A message counts as lost once sweeps have found
  it missing for `requeue_after_s`: a worker that has just taken one claims its job within seconds;
- a running job whose lease expired (its worker died) is marked worker_lost and queued again:
  the next worker resumes it from its checkpoint, and after `max_attempts` it fails; a job that
  was being cancelled when its worker died is simply marked cancelled;
- artifacts, work folders and uploads older than the TTL are deleted;
- what an upload an API was killed in the middle of left behind, its `.file_*.partial` file and
  the bytes it held of its key's quota, goes once nothing has written it for TIDE_MAX_UPLOAD_S:
  a live upload writes its file with every piece of body (a stalled one gets 408 after
  TIDE_REQUEST_BODY_TIMEOUT_S) and is itself refused once it has run that long.
Every step is a conditional update, so two API replicas sweeping at once do no harm, and a
duplicate message is harmless: the worker's claim runs a job once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from .db.jobs import add_event, finish_unowned, release_lost_worker
from .db.models import TERMINAL, Event, Job, StoredFile, UploadReservation, utcnow
from .settings import Settings
from .storage import job_artifacts_dir, job_work_dir, remove_tree

log = logging.getLogger("tide.sweeper")

_UNSENT_GRACE = timedelta(seconds=5)
REQUEUED = "requeued"


@dataclass
class SweepMemory:
    """What one sweep leaves the next: queued jobs whose message was missing -> (the send time
    seen then, when it was first found missing)."""

    missing: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)


def sweep(settings: Settings, sessions: sessionmaker[Session], queue, memory: SweepMemory) -> dict[str, int]:
    now = utcnow()
    counts = {
        "resent": 0, "requeued": 0, "undeliverable": 0, "queue_timeout": 0, "worker_lost": 0,
        "failed_attempts": 0, "cancelled": 0, "expired": 0, "uploads_deleted": 0, "partials_deleted": 0,
        "reservations_released": 0,
    }
    with sessions() as db:
        unsent = db.execute(select(Job.id, Job.base_model).where(Job.status == "queued", Job.enqueued_at.is_(None), Job.created_at < now - _UNSENT_GRACE))
        for job_id, base_model in list(unsent):
            if _send(db, queue, job_id, base_model):
                counts["resent"] += 1

        _recover_lost_messages(db, settings, queue, memory, now, counts)
        _fail_unstarted(db, settings, now, counts)

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
                continue
            outcome = release_lost_worker(db, job, settings.max_attempts)
            if outcome == "failed":
                # nobody will resume it: its checkpoints and any half-published files go now
                remove_tree(job_work_dir(settings, job.id))
                remove_tree(job_artifacts_dir(settings, job.id))
                counts["failed_attempts"] += 1
            elif outcome == "queued":
                counts["worker_lost"] += 1
                _send(db, queue, job.id, job.base_model)

        expired = select(Job.id).where(Job.status.in_(TERMINAL), Job.artifacts_deleted.is_(False), Job.expires_at < now)
        for job_id in list(db.scalars(expired)):
            # Marked before the files go (a download that finds them missing is answered 410), and
            # only if no DELETE took the job meanwhile; a download already sending keeps its files open.
            marked = db.execute(
                update(Job).where(Job.id == job_id, Job.artifacts_deleted.is_(False)).values(artifacts_deleted=True)
                .execution_options(synchronize_session=False)
            ).rowcount
            if not marked:
                db.rollback()
                continue
            add_event(db, job_id, "artifacts_expired", {})
            db.commit()
            remove_tree(job_artifacts_dir(settings, job_id))
            remove_tree(job_work_dir(settings, job_id))
            counts["expired"] += 1

        cutoff = now - timedelta(hours=settings.artifact_ttl_hours)
        busy = select(Job.corpus_file_id).where(Job.corpus_file_id.is_not(None), Job.status.not_in(TERMINAL))
        for stored in list(db.scalars(select(StoredFile).where(StoredFile.created_at < cutoff, StoredFile.id.not_in(busy)))):
            db.execute(update(Job).where(Job.corpus_file_id == stored.id).values(corpus_file_id=None))
            Path(stored.path).unlink(missing_ok=True)
            db.delete(stored)
            db.commit()
            counts["uploads_deleted"] += 1

        _remove_upload_leftovers(db, settings, now, counts)
    if any(counts.values()):
        log.info("sweep: %s", counts)
    return counts


def _remove_upload_leftovers(db: Session, settings: Settings, now: datetime, counts: dict[str, int]) -> None:
    """Partial files and quota reservations nothing has written for TIDE_MAX_UPLOAD_S."""
    cutoff = now - timedelta(seconds=settings.max_upload_s)
    try:
        partials = list(settings.resolved_uploads_dir.glob(".file_*.partial"))
    except OSError as exc:
        log.warning("sweep: could not list %s: %s", settings.resolved_uploads_dir, exc)
        partials = []
    for partial in partials:
        try:
            if partial.stat().st_mtime < cutoff.timestamp():
                partial.unlink()
                counts["partials_deleted"] += 1
        except FileNotFoundError:
            continue  # its upload finished (renamed) or failed (removed) since the listing
    counts["reservations_released"] += db.execute(
        delete(UploadReservation).where(UploadReservation.updated_at < cutoff).execution_options(synchronize_session=False)
    ).rowcount
    db.commit()


def _recover_lost_messages(db: Session, settings: Settings, queue, memory: SweepMemory, now: datetime, counts: dict[str, int]) -> None:
    """Queued jobs whose message has been missing from their queue for `requeue_after_s`."""
    stale = db.execute(
        select(Job.id, Job.base_model, Job.enqueued_at).where(
            Job.status == "queued", Job.enqueued_at < now - timedelta(seconds=settings.requeue_after_s)
        )
    ).all()
    missing_before, memory.missing = memory.missing, {}
    by_queue: dict[str, list] = defaultdict(list)
    for row in stale:
        by_queue[settings.queue_for(row.base_model)].append(row)
    for queue_name, rows in by_queue.items():
        try:
            waiting = queue.waiting_job_ids(queue_name)
        except Exception as exc:  # the broker is down: the next sweep looks again
            log.warning("sweep: could not read queue %s: %s", queue_name, exc)
            continue
        for row in rows:
            if row.id in waiting:
                continue  # waiting behind other jobs: nothing is lost
            sent_at, missing_since = missing_before.get(row.id, (None, now))
            if sent_at != row.enqueued_at:  # first seen missing (or sent again since)
                missing_since = now
            if now - missing_since < timedelta(seconds=settings.requeue_after_s):
                memory.missing[row.id] = (row.enqueued_at, missing_since)  # perhaps just taken by a worker
                continue
            lost_before = db.scalar(select(func.count()).select_from(Event).where(Event.job_id == row.id, Event.kind == REQUEUED))
            if lost_before >= settings.max_requeues:
                if finish_unowned(db, row.id, "failed", _lost_message_error(lost_before + 1), "queued"):
                    counts["undeliverable"] += 1
                continue
            # Only if nobody (a worker's claim, another API replica) moved the job since we looked.
            taken = db.execute(
                update(Job)
                .where(Job.id == row.id, Job.status == "queued", Job.enqueued_at == row.enqueued_at)
                .values(enqueued_at=None)
                .execution_options(synchronize_session=False)
            ).rowcount
            db.commit()
            if taken and _send(db, queue, row.id, row.base_model):
                add_event(db, row.id, REQUEUED, {
                    "message": "the job queue no longer held this job's message (the broker restarted without "
                    "persistence or dropped it); it was sent again",
                    "count": lost_before + 1,
                })
                db.commit()
                counts["requeued"] += 1


def _lost_message_error(times: int) -> tuple[str, str]:
    return (
        "queue_message_lost",
        f"the job queue lost this job's message {times} times, so no worker could receive it (Redis restarted "
        "without persistence, or evicts keys when memory is short); the operator should run Redis with "
        "appendonly yes and maxmemory-policy noeviction (docs/deploy.md); then submit the job again",
    )


def _fail_unstarted(db: Session, settings: Settings, now: datetime, counts: dict[str, int]) -> None:
    """Queued jobs no worker has started within max_queued_hours (updated_at: when they last became queued)."""
    cutoff = now - timedelta(hours=settings.max_queued_hours)
    for job_id, base_model in list(db.execute(select(Job.id, Job.base_model).where(Job.status == "queued", Job.updated_at < cutoff))):
        error = (
            "queue_timeout",
            f"no worker started this job within {settings.max_queued_hours:g} hours of queueing; its queue "
            f"{settings.queue_for(base_model)!r} may have no worker running (ask the operator: docs/deploy.md, routing "
            "jobs to queues); submit it again once workers are available",
        )
        if finish_unowned(db, job_id, "failed", error, "queued"):
            counts["queue_timeout"] += 1


def _send(db: Session, queue, job_id: str, base_model: str) -> bool:
    try:
        queue.send(job_id, base_model)
    except Exception as exc:
        log.warning("sweep: could not queue %s: %s", job_id, exc)
        return False
    db.execute(update(Job).where(Job.id == job_id).values(enqueued_at=utcnow()))
    db.commit()
    return True
